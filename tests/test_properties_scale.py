"""Properties (#58) of a scaling study's numbers in every shape of study: any smallest worker count (1, 2, 3,
4), any worker list up to 64, 1 or 2 cores a worker, 1-3 repeats, with and without the one process on all cores,
clean or slowed by other work. Each asserts what the rows, the verdict, the headline and the plots must say of
the epoch times planted in the run directories (tests/test_formulas_scale.py's builder)."""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_formulas_scale import run

from paratrain.reporting import study_headline
from paratrain.reporting.plots import _study_series
from paratrain.reporting.verdict import ACCURACY_TOLERANCE_POINTS, PAYS_OFF_SPEEDUP, study_verdict, workers_what
from paratrain.runs.records import Study
from paratrain.scale import scaling_rows

FEW = settings(max_examples=40, deadline=None)
SECONDS = st.floats(0.05, 50.0, allow_nan=False)
SLOWED = st.integers(0, 4).map(lambda i: i == 0)  # a run slowed by other work: one in 5, so many studies are clean


@st.composite
def studies(draw: Any, contention: bool = False) -> dict[str, Any]:
    """A study's planted points: worker count -> [(steady epoch time, accuracy, contended)] over its repeats, and
    the all-cores reference (its cores and repeats) or None."""
    base = draw(st.integers(1, 4))
    counts = sorted({base, *(base * m for m in draw(st.lists(st.integers(2, 16), max_size=3)))})
    repeats = st.lists(
        st.tuples(SECONDS, st.floats(0.0, 1.0), SLOWED if contention else st.just(False)),
        min_size=1,
        max_size=3,
    )
    points = {n: draw(repeats) for n in counts}
    reference = draw(st.none() | st.tuples(st.integers(2, 64), repeats))
    return {"threads": draw(st.integers(1, 2)), "points": points, "reference": reference}


# Base 2 without a reference, and with one: the shapes of issue #58 no test had.
BASE_TWO = {"threads": 1, "points": {2: [(8.0, 0.5, False)], 4: [(5.0, 0.5, False), (6.0, 0.5, False)]}}


def study_rows(root: Path, study: dict[str, Any]) -> list[dict[str, Any]]:
    """scaling_rows of run directories whose steady epochs take the planted times (the first, start-up, 99 s)."""
    runs = []
    for n, repeats in study["points"].items():
        for i, (seconds, accuracy, contended) in enumerate(repeats):
            runs.append(
                run(
                    root,
                    f"w{n}-r{i}",
                    n,
                    [99.0, seconds, seconds],
                    1000 / seconds,
                    threads=study["threads"],
                    val_accuracy=accuracy,
                    machine_load={"contended": contended},
                )
            )
    if study["reference"]:
        cores, repeats = study["reference"]
        for i, (seconds, accuracy, contended) in enumerate(repeats):
            resolved = {"resolved": {"device": "cpu", "threads_per_worker": cores}}
            runs.append(
                run(
                    root,
                    f"ref-r{i}",
                    1,
                    [99.0, seconds, seconds],
                    1000 / seconds,
                    threads=None,
                    config=resolved,
                    val_accuracy=accuracy,
                    machine_load={"contended": contended},
                )
            )
    return scaling_rows(runs)


def median_time(repeats: list[tuple[float, float, bool]]) -> float:
    return statistics.median(seconds for seconds, _, _ in repeats)


def of_study(study: dict[str, Any]) -> tuple[Study, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as root:
        rows = study_rows(Path(root), study)
    return Study.model_validate({"mode": "weak", "rows": rows}), rows


@FEW
@given(study=studies())
@example(study={**BASE_TWO, "reference": None})
@example(study={**BASE_TWO, "reference": (2, [(7.0, 0.5, False)])})
def test_speedup_and_efficiency_are_ratios_of_the_planted_times_in_units_of_the_base(study):
    """For any base count: speedup = T(base)/T(N) x base, efficiency = T(base)/T(N) x base / N (per core of the
    base's), each range the same ratio at the slowest and fastest repeat, vs all cores T(ref)/T(N)."""
    _, rows = of_study(study)
    points, threads = study["points"], study["threads"]
    base = min(points)
    t_base = median_time(points[base])
    reference = study["reference"]
    t_ref = median_time(reference[1]) if reference else None
    assert [r["workers"] for r in rows] == sorted(points) + ([1] if reference else [])
    for row in rows:
        is_ref = row["point"] == "all_cores_reference"
        repeats = reference[1] if is_ref else points[row["workers"]]
        times = [seconds for seconds, _, _ in repeats]
        ratio = t_base / median_time(repeats)
        cores = reference[0] if is_ref else row["workers"] * threads
        assert row["speedup"] == pytest.approx(ratio * base, rel=1e-12)
        # per core: the row's cores counted in the base's workers' cores
        assert row["efficiency"] == pytest.approx(ratio * base * threads / cores, rel=1e-12)
        low, high = row["speedup_range"]
        assert (low, high) == pytest.approx((t_base / max(times) * base, t_base / min(times) * base))
        assert low <= row["speedup"] * (1 + 1e-12) and row["speedup"] <= high * (1 + 1e-12)
        if t_ref is None:
            assert row["speedup_vs_all_cores"] is None and row["speedup_vs_all_cores_range"] is None
        else:
            assert row["speedup_vs_all_cores"] == pytest.approx(t_ref / median_time(repeats), rel=1e-12)
            assert row["speedup_vs_all_cores_range"] == pytest.approx([t_ref / max(times), t_ref / min(times)])
    assert rows[0]["speedup"] == pytest.approx(base) and rows[0]["efficiency"] == pytest.approx(1.0)


NUMBER = r"(\d+\.\d+)x"


def quoted_ratios(line: str) -> list[tuple[str, float, bool]]:
    """Every (row named, figure, inverted) a verdict line quotes: 'are 1.50x faster than X' (X's time over the top
    row's), '1.50x slower than X' (the inverse), 'against X: 1.50x' (X's time over the top row's)."""
    quoted = [
        (what, float(r), side == "slower")
        for r, side, what in re.findall(NUMBER + r" (faster|slower) than (.+?), ", line)
    ]
    return quoted + [(what, float(r), False) for what, r in re.findall(r"against ([^:;]+?): " + NUMBER, line)]


def assert_quotes_rows(line: str, rows: dict[str, Any]) -> None:
    """Each figure quoted is the ratio of the epoch times of the two rows, as written (2 decimals)."""
    for what, figure, inverted in quoted_ratios(line):
        ratio = rows[what].epoch_time_s / rows["top"].epoch_time_s
        assert abs(figure - (1 / ratio if inverted else ratio)) <= 0.005 + 1e-9, (line, what, ratio)


@settings(max_examples=80, deadline=None)
@given(study=studies(contention=True))
@example(study={**BASE_TWO, "reference": None})
def test_a_verdict_quotes_the_ratio_of_the_rows_it_names_and_withholds_on_a_slowed_row(study):
    """The verdict's ratio is T(row it names) / T(top), whatever the base; its efficiency the top row's; it pays
    off by the stated thresholds; and it is withheld ("can't tell") exactly when a row it compares was slowed by
    other work or the two comparisons disagree, quoting then only the clean rows' ratios."""
    result, _ = of_study(study)
    workload = result.workloads[0]
    points = result.points(workload)
    base, top, reference = points[0], points[-1], result.reference(workload)
    lines = study_verdict(result)
    if top is base and reference is None:
        assert lines == []
        return
    (line,) = lines
    compared = [top, *([base] if top is not base else []), *([reference] if reference else [])]
    slowed = any("contended" in r.flags for r in compared)
    names = {workers_what(base): base, "top": top}
    if reference:
        names[f"one process on all {reference.threads_per_worker} cores"] = reference
    assert_quotes_rows(line, names)
    vs_base = base.epoch_time_s / top.epoch_time_s if top is not base else None
    vs_ref = reference.epoch_time_s / top.epoch_time_s if reference else None
    disagree = vs_base is not None and vs_ref is not None and (vs_base >= 1) != (vs_ref >= 1)
    assert line.startswith(f"{workload}: can't tell") == (slowed or disagree), line
    if line.startswith(f"{workload}: can't tell"):
        if "contended" not in top.flags:  # what it still quotes is clean
            assert all("contended" not in names[what].flags for what, *_ in quoted_ratios(line)), line
        return
    against = reference or base
    ratio = against.epoch_time_s / top.epoch_time_s
    assert f", {top.efficiency:.0%} efficiency against {workers_what(base)}" in line
    accuracy = (top.val_accuracy - against.val_accuracy) * 100
    pays = ratio >= PAYS_OFF_SPEEDUP and accuracy >= -ACCURACY_TOLERANCE_POINTS
    assert line.endswith(": pays off") == pays, (line, ratio, accuracy)


class Axes:
    """What the study plots draw: each errorbar series' points, bars and legend."""

    def __init__(self) -> None:
        self.series: dict[str, dict[int, tuple[float, float, float]]] = {}

    def errorbar(self, xs, ys, yerr, label, **style):
        lo, hi = yerr
        self.series[label] = {x: (y, y - down, y + up) for x, y, down, up in zip(xs, ys, lo, hi)}

    def axhline(self, *args, **kwargs):
        pass


def plotted(result: Study, name: str, key: str) -> dict[str, dict[int, tuple[float, float, float]]]:
    workload = result.workloads[0]
    ax = Axes()
    _study_series(ax, name, key, "speedup_range", "C0", result.points(workload), result.reference(workload))
    return ax.series


@FEW
@given(study=studies())
@example(study={**BASE_TWO, "reference": None})
@example(study={**BASE_TWO, "reference": (2, [(7.0, 0.5, False)])})
def test_the_headline_and_the_plots_error_bars_use_the_same_base(study):
    """The headline's speedup and efficiency against the base are the points the speedup and efficiency plots draw
    for the top row, on the line labelled with the same base, and their bars span T(base)/T at the top row's
    slowest and fastest repeat in the same units; its speedup against all cores is the other line's point."""
    result, _ = of_study(study)
    workload = result.workloads[0]
    points, reference = result.points(workload), result.reference(workload)
    base, top = points[0], points[-1]
    (headline,) = study_headline(result)
    if (top is base and reference is None) or "can't tell" in headline:  # no speedup to draw, or none said
        return
    times = [seconds for seconds, _, _ in study["points"][top.workers]]
    t_base = median_time(study["points"][base.workers])
    bars = (t_base / max(times) * base.workers, t_base / min(times) * base.workers)
    said = re.search(
        rf"speedup (\S+) and efficiency (\S+) against {re.escape(workers_what(base))}(\.| )", headline
    ).groups()
    speedups = plotted(result, "speedup", "speedup")
    y, low, high = speedups[f"{workload} (vs {workers_what(base)})"][top.workers]
    assert (f"{y:.2f}", (low, high)) == (said[0], pytest.approx(bars))
    efficiency, e_low, e_high = plotted(result, "efficiency", "efficiency")[workload][top.workers]
    per_worker = 1 / top.workers  # threads alike on every scaling point
    assert (f"{efficiency:.2f}", (e_low, e_high)) == (said[1], pytest.approx([b * per_worker for b in bars]))
    if reference:
        t_ref = median_time(study["reference"][1])
        vs_all = speedups[f"{workload} (vs one process, all {reference.threads_per_worker} cores)"][top.workers]
        assert f"against one process on all {reference.threads_per_worker} cores" in headline
        assert f": speedup {vs_all[0]:.2f} (epoch {top.epoch_time_s:.2f} s against {t_ref:.2f} s)" in headline
        assert vs_all[1:] == pytest.approx((t_ref / max(times), t_ref / min(times)))
