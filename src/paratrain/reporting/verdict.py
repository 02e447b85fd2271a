"""The verdict first: the headline every report page opens with, the doctor's findings under it,
and numbers written as a person writes them.

A headline answers the user's question for that kind of page, and says against what:
- a scaling study: is N workers faster than the alternative the user has (one process on all
  cores on CPU; else the smallest worker count), by how much, at what efficiency and accuracy;
- a sweep: the best configuration, and what each searched parameter did to time and accuracy;
- a comparison: each run against the first;
- a run: what it achieved, and that whether it pays off needs a baseline.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.formatting import human, rate, seconds
from paratrain.runs.records import ParetoFront, ScalingRow, Study, Summary, SweepResult

# "Pays off": at least this much faster than the alternative, losing at most this many points of
# held-out accuracy (differences below a point are within seed noise for the built-in workloads).
PAYS_OFF_SPEEDUP = 1.10
ACCURACY_TOLERANCE_POINTS = 1.0
# Where a verdict withheld for other work on the machine points the user.
OTHER_WORK_HINT = "paratrain doctor on a run shows what else took its cores"


def judge(speedup: float, accuracy_points: float | None) -> str:
    if speedup < 1.0:
        return "does not pay off (slower)"
    if speedup < PAYS_OFF_SPEEDUP:
        return f"does not pay off (less than {PAYS_OFF_SPEEDUP - 1:.0%} faster)"
    if accuracy_points is not None and accuracy_points < -ACCURACY_TOLERANCE_POINTS:
        return "faster, but it costs accuracy"
    return "pays off"


def _faster(ratio: float, than: str) -> str:
    return f"{ratio:.2f}x faster than {than}" if ratio >= 1 else f"{1 / ratio:.2f}x slower than {than}"


def _points(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (a - b) * 100


def _accuracy_text(points: float | None) -> str:
    return "accuracy not reported" if points is None else f"accuracy {points:+.1f} points"


def batch_schedule_line(block: dict[str, Any] | None) -> str | None:
    """A growing batch's outcome in words (summary.json's `batch_schedule`): where the global batch went and,
    adaptive, why it stopped where it did, from the last reading of the noise and the throughput."""
    if not block:
        return None
    start, final, largest = block["start_global_batch"], block["final_global_batch"], block["largest_global_batch"]
    line = f"--batch-schedule {block['kind']}: the global batch " + (
        f"grew from {start} to {final}" if final > start else f"stayed at {start}"
    )
    if final >= largest:
        return f"{line}, its largest (--max-global-batch {largest})"
    if block["kind"] != "adaptive":
        return line
    noise, error, gain = block.get("noise_scale"), block.get("noise_scale_stderr"), block.get("goodput_gain")
    if noise is None:
        return (
            f"{line}: at the last reading the gradient's norm could not be told from its noise (|G|² read 0 or less), "
            "and with no noise scale it does not grow"
        )
    noise_text = rate(noise) + (f" ± {rate(error)}" if error is not None else "")
    if gain is None:  # a summary of an earlier release, or no reading with the throughput timed
        return f"{line}; the noise scale read {noise_text} at the end"
    following = min(2 * final, largest)
    worth = (noise + final) / (noise + following)  # the samples' worth at the next batch (McCandlish et al. 2018)
    needed = block.get("min_goodput_gain")  # this and the readings: absent in a summary of an earlier release
    promised = (
        f"{line}: at the last reading a doubling to {following} promised {gain:.2f}x the goodput "
        f"({gain / worth:.2f}x the throughput, times {worth:.2f} for the noise scale of {noise_text})"
    )
    if not needed:
        return promised
    if gain < needed:
        return f"{promised}, below the {needed:.2f}x it doubles at"
    if not block.get("average_settled", True):
        unconfirmed = "the noise scale's average had not yet settled"
    else:
        above, needed_readings = block.get("readings_above"), block.get("readings_needed")
        unconfirmed = f"{above} reading(s) in a row said so of the {needed_readings} it waits for"
    return f"{promised}, above the {needed:.2f}x it doubles at, but the run ended first: {unconfirmed}"


# -- headlines ---------------------------------------------------------------------------------


def run_verdict(summary: Summary | None, config: dict[str, Any]) -> list[str]:
    if summary is None:
        return ["no summary.json: the run is still going or was interrupted"]
    if config.get("script"):
        name = Path(config["script"]).name
        line = (
            f"{name} on {summary.workers} rank(s): {summary.status}, exit status "
            f"{summary.exit_code}, {seconds(summary.wall_time_s or 0.0)}"
        )
        if summary.samples_per_s is not None:
            line += f", {script_throughput(summary)}"
        grown = batch_schedule_line(summary.batch_schedule)
        return [
            line + ("" if summary.status == "completed" else f": {summary.error or ''}"),
            *([grown] if grown else []),
        ]
    if summary.status != "completed":
        return [f"the run {summary.status}: {summary.error or ''}"]
    n = summary.workers or 1
    threads = config.get("resolved", {}).get("threads_per_worker")
    each = f", {threads} core(s) each" if threads and config.get("resolved", {}).get("device") == "cpu" else ""
    lines = [
        f"{n} worker(s) ({summary.strategy}{each}): {summary.samples_per_s:,.0f} samples/s, epoch "
        f"{seconds(summary.epoch_time_s)}, {summary.val_split or 'test'} accuracy {summary.val_accuracy:.1%}"
    ]
    grown = batch_schedule_line(summary.batch_schedule)
    if grown:
        lines.append(grown)
    if n > 1:
        lines.append(
            f"whether {n} workers pay off needs a baseline this run does not have: paratrain scale --workers "
            f"1,{n} with the same flags measures it"
        )
    else:
        lines.append("one worker: paratrain scale --workers 1,2 with the same flags measures what a second would buy")
    return lines


def script_throughput(summary: Summary) -> str:
    """A launched script's samples/s and whose figure it is: the launcher takes the script's own,
    else the probe's count of the samples it saw trained (launch/script.py)."""
    probed = summary.samples_per_s == (summary.probe or {}).get("samples_per_s")
    return f"{summary.samples_per_s:,.0f} samples/s {'measured by the probe' if probed else 'reported'}"


def study_points(result: Study) -> Iterator[tuple[str, ScalingRow, ScalingRow, ScalingRow | None]]:
    """Per workload of a study: (workload, base, top, reference): its fewest and most workers, and the
    one process on all cores when the study measured it. The verdict and the CLI's headline both read these."""
    for workload in result.workloads:
        scaling = result.points(workload)
        if scaling:
            yield workload, scaling[0], scaling[-1], result.reference(workload)


def study_verdict(result: Study) -> list[str]:
    """Per workload: the most workers against the alternative the user has, with efficiency and accuracy."""
    lines = []
    for workload, base, top, reference in study_points(result):
        if top is base and not reference:
            continue
        base_what = workers_what(base)
        undecided = cannot_tell(base, top, reference)
        if undecided:
            lines.append(f"{workload}: {undecided}")
            continue
        if reference and top.speedup_vs_all_cores:
            ratio, against = top.speedup_vs_all_cores, reference
            what = f"one process on all {cores_text(reference)} cores"
        else:
            ratio, against, what = top.speedup / base.workers, base, base_what
        points = _points(top.val_accuracy, against.val_accuracy)
        lines.append(
            f"{workload}: {top.workers} workers are {_faster(ratio, what)}, {top.efficiency:.0%} "
            f"efficiency against {base_what}, {_accuracy_text(points)}: {judge(ratio, points)}"
        )
    return lines


def _contended(row: ScalingRow | None) -> bool:
    return row is not None and "contended" in row.flags


def cores_text(row: ScalingRow) -> str:
    return "?" if row.threads_per_worker is None else str(row.threads_per_worker)


def workers_what(row: ScalingRow) -> str:
    return f"{row.workers} worker(s) x {cores_text(row)} core(s)"


def cannot_tell(base: ScalingRow, top: ScalingRow, reference: ScalingRow | None) -> str | None:
    """Why the table cannot back a verdict, for the verdict and the study's headline alike: ranks that
    never synchronised (independent copies: no ratio of theirs is a speedup), a comparison whose rows
    other work slowed (a 2-thread process collapses when its cores are taken, so a contended all-cores
    reference reads as a large speedup), or the two comparisons pointing different ways. It says what
    the clean comparison shows and the rerun that would decide; None when the rows support a verdict."""
    base_what = workers_what(base)
    if "unsynchronised" in top.flags:
        return (
            f"no speedup: the {top.workers} ranks never synchronised (no DDP or FSDP, no collective), so they "
            f"trained {top.workers} independent copies of the model, whose samples/s add up without training one "
            f"faster; make them train together (paratrain doctor {top.run_dir} says how) and rerun"
        )
    vs_base = top.speedup / base.workers if top is not base else None
    vs_ref = top.speedup_vs_all_cores if reference else None
    ref_what = f"one process on all {cores_text(reference)} cores" if reference else ""
    rerun = "rerun paratrain scale with the same flags on an idle machine, with --repeats 3"
    shown = "; ".join(
        f"against {what}: {ratio:.2f}x"
        for what, ratio, row in ((base_what, vs_base, base), (ref_what, vs_ref, reference))
        if ratio is not None and not _contended(row)
    )
    if _contended(top):
        measured = "; ".join(
            f"against {what}: {ratio:.2f}x"
            for what, ratio in ((base_what, vs_base), (ref_what, vs_ref))
            if ratio is not None
        )
        return slowed_by_other_work(f"the {top.workers}-worker run was", f"measured {measured}", rerun)
    slowed = [what for what, row in ((base_what, base), (ref_what, reference)) if row is not top and _contended(row)]
    if slowed and (vs_ref is not None or vs_base is not None):
        return slowed_by_other_work(f"the reference {' and '.join(slowed)} was", shown, rerun)
    if vs_base is not None and vs_ref is not None and (vs_base >= 1) != (vs_ref >= 1):
        return (
            f"can't tell: the comparisons disagree (against {base_what}: {vs_base:.2f}x; against "
            f"{ref_what}: {vs_ref:.2f}x); {rerun} ({OTHER_WORK_HINT})"
        )
    return None


def slowed_by_other_work(who: str, figures: str, rerun: str) -> str:
    """A verdict withheld because other work took the cores of `who` ("the 2-worker run was"): a
    ratio of a slowed run says nothing of the parallelism (a 2-thread process collapses when its
    cores are taken). `figures`: what was measured anyway, or ''; `rerun`: what would decide. The one
    wording of a scaling study's headline and of compare's."""
    return f"can't tell: {who} slowed by other work{'; ' + figures if figures else ''}; {rerun} ({OTHER_WORK_HINT})"


def _metric_text(metric: str, values: Sequence[float]) -> str:
    return human(metric, statistics.mean(values))


def sweep_verdict(result: SweepResult) -> list[str]:
    done = result.completed()
    if not done or result.best is None:
        return ["no trial completed: nothing to choose from yet"]
    metrics = result.metric
    shown = lambda t: ", ".join(f"{k}={human(k, v)}" for k, v in t.params.items())  # noqa: E731
    best = result.best
    if isinstance(best, ParetoFront):
        front = best.pareto_front
        lines = [
            f"{len(front)} trial(s) on the Pareto front of {metrics[0]} and {metrics[1]}: "
            + "; ".join(
                f"trial {t.number} ({shown(t)}): " + ", ".join(f"{m} {human(m, t.metrics.get(m))}" for m in metrics[:2])
                for t in front[:3]
            )
            + (" ..." if len(front) > 3 else "")
        ]
    else:
        time_text = f" in {seconds(best.metrics['time_s'])}" if best.metrics.get("time_s") else ""
        lines = [f"best: trial {best.number} ({shown(best)}): {metrics[0]} {human(metrics[0], best.value)}{time_text}"]
    for param in result.space.get("parameters", {}):
        values = [t.params.get(param) for t in done if param in t.params]
        distinct = sorted(set(values), key=lambda v: (isinstance(v, str), v))
        if len(distinct) < 2:
            continue
        effects = []
        for metric in [metrics[0], *(["time_s"] if metrics[0] != "time_s" else [])]:
            by_value = {
                v: [t.metrics[metric] for t in done if t.params.get(param) == v and metric in t.metrics]
                for v in distinct
            }
            by_value = {v: m for v, m in by_value.items() if m}
            if len(by_value) < 2:
                continue
            name = "trial time" if metric == "time_s" else metric
            if all(isinstance(v, (int, float)) for v in by_value):
                lo, hi = min(by_value), max(by_value)
                effects.append(f"{name} {_metric_text(metric, by_value[lo])} -> {_metric_text(metric, by_value[hi])}")
            else:
                means = {v: statistics.mean(m) for v, m in by_value.items()}
                top, bottom = max(means, key=means.get), min(means, key=means.get)
                effects.append(
                    f"{name} from {human(metric, means[bottom])} ({bottom}) to {human(metric, means[top])} ({top})"
                )
        if effects:
            numeric = all(isinstance(v, (int, float)) for v in distinct)
            head = f"{param} {human(param, distinct[0])} -> {human(param, distinct[-1])}" if numeric else param
            lines.append(f"{head}: {', '.join(effects)} (means over completed trials)")
    return lines


def comparison_verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Each run against the first (comparison_rows): how many times its samples/s, its accuracy, and
    whether it pays off; no verdict where either run was slowed by other work, and none, nor a
    ratio, for a run that did not complete."""
    first = rows[0]
    if first["status"] != "completed":
        return [
            f"{_failed_text(first)}: the first run is what the others are compared against; put a completed run first"
        ]
    lines = []
    for r in rows[1:]:
        pair = f"{_run_name(r)} ({r['workers']} worker(s)) against {_run_name(first)} ({first['workers']} worker(s))"
        if r["status"] != "completed":
            lines.append(f"{_failed_text(r)}: nothing to compare with {_run_name(first)}")
            continue
        ratio = r["throughput_vs_first"]
        points = _points(r.get("val_accuracy"), first.get("val_accuracy"))
        measured = f"{ratio:.2f}x the samples/s, {_accuracy_text(points)}"
        slowed = [
            f"{_run_name(x)} ({x['other_load']:.0%} of its cores to other work)" for x in (first, r) if x["contended"]
        ]
        if slowed:
            who = f"{' and '.join(slowed)} {'was' if len(slowed) == 1 else 'were'}"
            lines.append(
                f"{pair}: {slowed_by_other_work(who, f'measured {measured}', 'rerun both on an idle machine')}"
            )
        else:
            lines.append(f"{pair}: {measured}: {judge(ratio, points)}")
    return lines


def _run_name(row: dict[str, Any]) -> str:
    return Path(row["run"]).name


def _failed_text(row: dict[str, Any]) -> str:
    return f"{_run_name(row)} {row['status']}" + (f" ({row['error']})" if row.get("error") else "")


# -- HTML --------------------------------------------------------------------------------------


def doctor_html(path: Path) -> str:
    """The doctor's verdict and ranked findings for a run, study or sweep directory."""
    from paratrain.doctor import diagnose

    try:
        diagnosis = diagnose(path)
    except UsageError as exc:
        return f"<div id='doctor'><p class='note'>doctor: {html.escape(str(exc))}</p></div>"
    items = "".join(
        f"<li><b>{html.escape(f['finding'])}</b> <span class='note'>[{f['severity']}]</span>"
        f"<br>evidence: {html.escape(f['evidence'])}<br>cause: {html.escape(f['cause'])}"
        f"<br>remedy: <code>{html.escape(f['remedy'])}</code><br>predicted: {html.escape(f['predicted_gain'])}</li>"
        for f in diagnosis["findings"]
    )
    return (
        f"<div id='doctor'><p><b>Doctor:</b> {html.escape(diagnosis['verdict'])}</p>"
        + (f"<ol class='findings'>{items}</ol>" if items else "")
        + "</div>"
    )


def verdict_html(lines: Sequence[str], doctor: str = "") -> str:
    heads = "".join(f"<p class='headline'>{html.escape(line)}</p>" for line in lines)
    return f"<div id='verdict'>{heads}{doctor}</div>"
