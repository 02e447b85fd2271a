"""Scaling studies: the arithmetic, the batch/LR rules, a real 1,2 study, the report in a browser."""

import itertools
import json
import os
import pty
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import browser_page

from paratrain.cli import main
from paratrain.config import ScaleConfig, TrainConfig, validate
from paratrain.engine.lr import scaled_lr
from paratrain.reporting import study_headline, study_table
from paratrain.reporting.plots import study_plots
from paratrain.runs import RunDir, write_json
from paratrain.runs.records import Study
from paratrain.scale import point_config, scaling_rows

CORES = len(os.sched_getaffinity(0))


def _fake_run(
    path: Path,
    workload: str,
    workers: int,
    epoch_times: list[float],
    accuracy: float = 0.5,
    threads: int = 1,
    all_cores: bool = False,
    contended: bool = False,
    strategy: str = "",
) -> RunDir:
    """A finished run as a CPU study leaves it; `all_cores`: the one-process reference (default threads)."""
    path.mkdir(parents=True)
    write_json(
        path / "config.json",
        {
            "workload": workload,
            "workers": workers,
            "threads_per_worker": None if all_cores else threads,
            "resolved": {"device": "cpu", "threads_per_worker": threads},
        },
    )
    steady = epoch_times[1:] or epoch_times
    write_json(
        path / "summary.json",
        {
            "machine_load": {"contended": contended},
            "status": "completed",
            "workers": workers,
            "strategy": strategy or ("ddp" if workers > 1 else "single"),
            "batch_size": 32,
            "global_batch_size": 32 * workers,
            "lr": 0.1,
            "epoch_times_s": epoch_times,
            "epoch_time_s": statistics.median(steady),
            "samples_per_s": 1000 / statistics.mean(steady),
            "val_accuracy": accuracy,
            "breakdown": {
                "data_s": 0.001,
                "compute_s": 0.01,
                "comm_s": 0.002 * (workers > 1),
                "optimizer_s": 0.001,
                "other_s": 0.0,
            },
        },
    )
    return RunDir(path)


def test_speedup_and_efficiency_from_run_dirs(tmp_path):
    runs = [
        # 1 worker: a slow first epoch (start-up) that must not count; repeats 10.0 and 10.4 -> median 10.2
        _fake_run(tmp_path / "a", "m", 1, [30.0, 10.0, 10.0]),
        _fake_run(tmp_path / "b", "m", 1, [30.0, 10.4, 10.4]),
        # 2 workers: steady epochs 6.0 / 6.0 and 5.0 / 7.0 -> per-run medians 6.0 and 6.0
        _fake_run(tmp_path / "c", "m", 2, [20.0, 6.0, 6.0]),
        _fake_run(tmp_path / "d", "m", 2, [20.0, 5.0, 7.0]),
        # a failed run is ignored
        _fake_run(tmp_path / "e", "m", 2, [1.0, 1.0]),
    ]
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    write_json(tmp_path / "e" / "summary.json", {**summary, "status": "failed"})
    rows = scaling_rows(runs)
    assert [(r["workload"], r["workers"], r["repeats"]) for r in rows] == [("m", 1, 2), ("m", 2, 2)]
    one, two = rows
    assert one["epoch_time_s"] == pytest.approx(10.2)
    assert one["speedup"] == pytest.approx(1.0) and one["efficiency"] == pytest.approx(1.0)
    assert two["epoch_time_s"] == pytest.approx(6.0)
    assert two["speedup"] == pytest.approx(10.2 / 6.0)
    assert two["efficiency"] == pytest.approx(10.2 / 6.0 / 2)
    assert one["epoch_time_s_range"] == [10.0, 10.4]


def test_speedup_is_relative_to_the_smallest_count_of_each_workload(tmp_path):
    runs = [
        _fake_run(tmp_path / "a", "big", 2, [9.0, 8.0]),
        _fake_run(tmp_path / "b", "big", 4, [9.0, 5.0]),
        _fake_run(tmp_path / "c", "small", 1, [3.0, 2.0]),
        _fake_run(tmp_path / "d", "small", 2, [3.0, 1.0]),
    ]
    rows = {(r["workload"], r["workers"]): r for r in scaling_rows(runs)}
    assert rows[("big", 4)]["speedup"] == pytest.approx(8.0 / 5.0 * 2)  # base 2 workers counts as 2
    assert rows[("small", 2)]["speedup"] == pytest.approx(2.0)


def _record(rows: list[dict]) -> Study:
    """scaling.json's record of these rows, as `report` reads it."""
    return Study.model_validate({"mode": "weak", "rows": rows})


def _cell(result: Study, row: int, column: str) -> str:
    columns, cells = study_table(result)
    return cells[row][columns.index(column)]


def test_rows_show_threads_and_the_speedup_against_one_process_on_all_cores(tmp_path):
    runs = [
        _fake_run(tmp_path / "a", "m", 1, [9.0, 10.0]),  # 1 worker x 1 core
        _fake_run(tmp_path / "b", "m", 2, [9.0, 6.0]),  # 2 workers x 1 core
        _fake_run(tmp_path / "c", "m", 1, [9.0, 8.0], threads=2, all_cores=True),
    ]  # 1 process, 2 cores
    rows = scaling_rows(runs)
    assert [(r["workers"], r["threads_per_worker"], r["point"]) for r in rows] == [
        (1, 1, "scaling"),
        (2, 1, "scaling"),
        (1, 2, "all_cores_reference"),
    ]
    one, two, ref = rows
    assert two["speedup"] == pytest.approx(10 / 6) and two["efficiency"] == pytest.approx(10 / 6 / 2)
    assert two["speedup_vs_all_cores"] == pytest.approx(8 / 6) and one["speedup_vs_all_cores"] == pytest.approx(0.8)
    assert ref["speedup_vs_all_cores"] == 1.0 and ref["speedup"] == pytest.approx(10 / 8)
    assert ref["efficiency"] == pytest.approx(10 / 8 / 2)  # its 2 cores are two 1-core workers' worth
    result = _record(rows)
    assert [_cell(result, i, "threads") for i in range(3)] == ["1", "1", "2"]
    assert _cell(result, 2, "workers") == "1 (all cores)" and _cell(result, 1, "vs all cores") == "1.33"
    (headline,) = study_headline(result)
    assert "m: 2 worker(s) x 1 core(s) against one process on all 2 cores" in headline
    assert (
        "speedup 1.33 (epoch 6.00 s against 8.00 s); speedup 1.67 and efficiency 0.83 against 1 worker(s)" in headline
    )


def test_repeats_show_their_spread_and_disagreeing_repeats_are_flagged(tmp_path):
    runs = [
        _fake_run(tmp_path / "a", "m", 1, [9.0, 10.0]),
        _fake_run(tmp_path / "b", "m", 1, [9.0, 10.5]),  # x1.05
        _fake_run(tmp_path / "c", "m", 2, [9.0, 5.0]),
        _fake_run(tmp_path / "d", "m", 2, [9.0, 6.0]),  # x1.20
        _fake_run(tmp_path / "e", "m", 4, [9.0, 3.0]),
    ]
    one, two, four = rows = scaling_rows(runs)
    assert one["repeat_spread"] == pytest.approx(1.05) and two["repeat_spread"] == pytest.approx(1.2)
    assert (one["flags"], two["flags"], four["flags"]) == ([], ["repeats_disagree"], [])
    assert two["speedup_range"] == pytest.approx([10.25 / 6, 10.25 / 5])
    result = _record(rows)
    assert _cell(result, 0, "epoch time (s)") == "10.25\n(10.00–10.50)"
    assert _cell(result, 1, "samples/s") == "183\n(167–200)" and _cell(result, 1, "flags") == "spread x1.20"
    assert _cell(result, 2, "epoch time (s)") == "3.00"  # one run: no spread to show
    # the plots draw the spread: the same rows without it give different pictures
    still = _record(
        [
            {**r, **{k: [r[k.removesuffix("_range")]] * 2 for k in r if k.endswith("_range") and r[k] is not None}}
            for r in rows
        ]
    )
    (tmp_path / "spread").mkdir(), (tmp_path / "still").mkdir()
    drawn, flat = study_plots(result, tmp_path / "spread"), study_plots(still, tmp_path / "still")
    for name in ("epoch_time", "throughput", "speedup", "efficiency"):
        assert drawn[name].read_bytes() != flat[name].read_bytes(), f"{name}.png shows no spread"


def test_rows_measured_under_contention_are_flagged(tmp_path):
    runs = [
        _fake_run(tmp_path / "a", "m", 1, [9.0, 10.0]),
        _fake_run(tmp_path / "b", "m", 1, [9.0, 10.0], contended=True),
        _fake_run(tmp_path / "c", "m", 2, [9.0, 6.0], contended=True),
        _fake_run(tmp_path / "d", "m", 1, [9.0, 8.0], threads=2, all_cores=True),
    ]
    one, two, ref = rows = scaling_rows(runs)
    assert (one["flags"], one["contended_runs"], two["flags"], ref["flags"]) == (["contended"], 1, ["contended"], [])
    assert _cell(_record(rows), 0, "flags") == "contended 1/2"
    (headline,) = study_headline(_record(rows))
    assert "can't tell: the 2-worker run was slowed by other work" in headline
    assert headline.endswith("Flagged (2: contended 1/1).") and "speedup" not in headline


def test_a_headline_claims_no_gain_on_a_contended_reference(tmp_path):
    """#27: on a busy machine the all-cores reference ran 6x slower than one core; the headline said
    "speedup 4.99 against one process on all cores" while 2 workers were 0.84x of one worker."""

    def study(reference_contended: bool) -> str:
        where = tmp_path / str(reference_contended)
        runs = [
            _fake_run(where / "a", "m", 1, [9.0, 5.0]),
            _fake_run(where / "b", "m", 2, [9.0, 5.95]),
            _fake_run(where / "c", "m", 1, [9.0, 29.7], threads=2, all_cores=True, contended=reference_contended),
        ]
        (headline,) = study_headline(_record(scaling_rows(runs)))
        return headline

    slowed = study(reference_contended=True)
    assert slowed.startswith(
        "m: 2 worker(s) x 1 core(s) against one process on all 2 cores (what 'paratrain train "
        "--workers 1' runs): can't tell: the reference one process on all 2 cores was slowed by "
        "other work; against 1 worker(s) x 1 core(s): 0.84x; rerun paratrain scale"
    )
    assert "speedup" not in slowed and "4.99" not in slowed and slowed.endswith("Flagged (1 all cores: contended 1/1).")
    # The same numbers unflagged still disagree (0.84x of one worker, 4.99x the reference): no speedup either.
    assert "can't tell: the comparisons disagree" in study(reference_contended=False)


def test_a_clean_study_headlines_its_speedup(tmp_path):
    runs = [
        _fake_run(tmp_path / "a", "m", 1, [9.0, 10.0]),
        _fake_run(tmp_path / "b", "m", 2, [9.0, 6.0]),
        _fake_run(tmp_path / "c", "m", 1, [9.0, 8.0], threads=2, all_cores=True),
    ]
    (headline,) = study_headline(_record(scaling_rows(runs)))
    assert headline == (
        "m: 2 worker(s) x 1 core(s) against one process on all 2 cores (what 'paratrain train --workers 1' "
        "runs): speedup 1.33 (epoch 6.00 s against 8.00 s); speedup 1.67 and efficiency 0.83 against "
        "1 worker(s) x 1 core(s)."
    )


def test_single_epoch_runs_are_marked_as_including_start_up(tmp_path, capsys):
    code = main(
        [
            "scale",
            "--workers",
            "1",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "512",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--out",
            str(tmp_path / "s"),
        ]
    )
    assert code == 0
    rows = json.loads((tmp_path / "s" / "scaling.json").read_text())["rows"]
    assert [r["point"] for r in rows] == ["scaling", "all_cores_reference"]
    assert all("includes_startup" in r["flags"] for r in rows)
    table = capsys.readouterr().out
    assert table.count("incl. start-up") >= 3  # both rows and the note that explains it
    assert "a run had a single epoch, so its time and samples/s include start-up" in table
    assert "incl. start-up" not in _cell(
        _record(scaling_rows([_fake_run(tmp_path / "two", "m", 1, [9.0, 8.0])])), 0, "flags"
    )


def _study(mode: str, tmp_path: Path) -> ScaleConfig:
    return validate(
        ScaleConfig, {"workers": "1,2", "mode": mode, "out": tmp_path / mode, "train": {"batch_size": 32, "lr": 0.01}}
    )


def _lr(cfg: dict) -> float:
    t = validate(TrainConfig, cfg)
    return scaled_lr(t.lr, t.global_batch_size, t.reference_batch_size, t.lr_scaling)


def test_weak_scaling_grows_the_global_batch_and_scales_the_lr(tmp_path):
    study = _study("weak", tmp_path)
    one, two = (point_config(study, "cifar10-cnn", n, 0) for n in (1, 2))
    assert (one["batch_size"], two["batch_size"]) == (32, 32)
    assert validate(TrainConfig, two).global_batch_size == 64
    assert _lr(one) == pytest.approx(0.01) and _lr(two) == pytest.approx(0.02)  # linear rule by default


def test_strong_scaling_splits_a_fixed_global_batch_and_keeps_the_lr(tmp_path):
    study = _study("strong", tmp_path)
    one, two = (point_config(study, "cifar10-cnn", n, 0) for n in (1, 2))
    assert (one["batch_size"], two["batch_size"]) == (32, 16)
    assert validate(TrainConfig, one).global_batch_size == validate(TrainConfig, two).global_batch_size == 32
    assert _lr(one) == pytest.approx(0.01) and _lr(two) == pytest.approx(0.01)


def test_a_strategy_axis_draws_one_line_per_strategy_from_the_same_one_worker_run(tmp_path):
    runs = [
        _fake_run(tmp_path / "w1", "m", 1, [9.0, 10.0, 10.0]),
        _fake_run(tmp_path / "ddp", "m", 2, [9.0, 5.0, 5.0], strategy="ddp"),
        _fake_run(tmp_path / "pipe", "m", 2, [9.0, 8.0, 8.0], strategy="pipeline"),
        _fake_run(tmp_path / "ref", "m", 1, [9.0, 6.0, 6.0], threads=2, all_cores=True),
    ]
    rows = scaling_rows(runs, ["ddp", "pipeline"])
    assert [(r["workload"], r["workers"], r["point"]) for r in rows] == [
        ("m · ddp", 1, "scaling"),
        ("m · ddp", 2, "scaling"),
        ("m · ddp", 1, "all_cores_reference"),
        ("m · pipeline", 1, "scaling"),
        ("m · pipeline", 2, "scaling"),
        ("m · pipeline", 1, "all_cores_reference"),
    ]
    ddp, pipeline = rows[1], rows[4]
    assert (ddp["strategy"], pipeline["strategy"]) == ("ddp", "pipeline")
    assert ddp["speedup"] == pytest.approx(2.0) and pipeline["speedup"] == pytest.approx(10 / 8 * 1)
    assert pipeline["speedup_vs_all_cores"] == pytest.approx(6 / 8)
    assert rows[0]["run_dir"] == rows[3]["run_dir"] == str(tmp_path / "w1")  # one base run, shared
    # Without the axis the same runs make one line per workload, as before.
    assert {r["workload"] for r in scaling_rows(runs[:2] + runs[3:])} == {"m"}


def test_strategy_points_process_the_same_global_batch(tmp_path):
    # per-replica batch of ddp and pipeline on 2 workers, and of hybrid (2 replicas x 2 stages) on 4
    expected = {"weak": {"ddp": 32, "pipeline": 64, "hybrid": 64}, "strong": {"ddp": 16, "pipeline": 32, "hybrid": 16}}
    for mode, batches in expected.items():
        study = validate(
            ScaleConfig,
            {
                "workers": [1, 2, 4],
                "mode": mode,
                "out": tmp_path / mode,
                "strategy": "ddp,pipeline,hybrid",
                "train": {"batch_size": 32, "lr": 0.01, "dp": 2, "allow_oversubscribe": True},
            },
        )
        configs = {
            s: validate(TrainConfig, point_config(study, "cifar10-cnn", 4 if s == "hybrid" else 2, 0, strategy=s))
            for s in batches
        }
        assert {s: c.batch_size for s, c in configs.items()} == batches
        ddp, pipeline, hybrid = configs["ddp"], configs["pipeline"], configs["hybrid"]
        assert (hybrid.data_parallel_size, hybrid.pipeline_stages) == (2, 2)
        assert ddp.global_batch_size == pipeline.global_batch_size
        assert hybrid.global_batch_size == (128 if mode == "weak" else 32)
        assert scaled_lr(ddp.lr, ddp.global_batch_size, ddp.reference_batch_size, ddp.lr_scaling) == pytest.approx(
            scaled_lr(pipeline.lr, pipeline.global_batch_size, pipeline.reference_batch_size, pipeline.lr_scaling)
        )


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "s"
    code = main(
        [
            "scale",
            "--workers",
            "1,2",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "4096",
            "--epochs",
            "3",
            "--batch-size",
            "32",
            "--log-every",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_a_1_2_study_writes_every_file(study_dir):
    result = json.loads((study_dir / "scaling.json").read_text())
    assert result["mode"] == "weak"
    assert [(r["workers"], r["threads_per_worker"], r["point"]) for r in result["rows"]] == [
        (1, 1, "scaling"),
        (2, 1, "scaling"),
        (1, CORES, "all_cores_reference"),
    ]
    for row in result["rows"]:
        assert set(row) >= {
            "workers",
            "global_batch_size",
            "epoch_time_s",
            "samples_per_s",
            "speedup",
            "efficiency",
            "val_accuracy",
            "run_dir",
            "threads_per_worker",
            "speedup_vs_all_cores",
            "flags",
        }
        summary = RunDir(Path(row["run_dir"])).read_summary()
        assert summary["status"] == "completed"
        load = summary["machine_load"]
        assert set(load) >= {"cores", "wall_s", "run_cpu_s", "other_cpu_s", "steal_s", "other_fraction", "contended"}
        assert load["cores"] == row["workers"] * row["threads_per_worker"]  # the cores the ranks were pinned to
        assert load["run_cpu_s"] > 0.2 * load["wall_s"] * row["workers"], load  # spawned ranks' CPU time counted
    # the reference is what `paratrain train --workers 1` runs: default threads, every core
    reference = result["rows"][2]
    config = RunDir(Path(reference["run_dir"])).read_config()
    assert config["threads_per_worker"] is None and config["resolved"]["threads_per_worker"] == CORES
    assert reference["speedup_vs_all_cores"] == 1.0
    assert result["rows"][1]["speedup_vs_all_cores"] == pytest.approx(
        reference["epoch_time_s"] / result["rows"][1]["epoch_time_s"]
    )
    for name in ("epoch_time", "throughput", "speedup", "efficiency", "accuracy"):
        assert (study_dir / f"{name}.png").stat().st_size > 5000
    assert (study_dir / "report.html").exists()


def _rate_from_step_events(run_dir: Path) -> float:
    """samples/s recomputed from the step events' own clock, within each timed epoch only."""
    events = [e for e in RunDir(run_dir).read_metrics() if e["event"] == "step" and e["epoch"] >= 1]
    samples = seconds = 0.0
    for a, b in itertools.pairwise(events):
        if a["epoch"] == b["epoch"]:
            samples += b["samples"] - a["samples"]
            seconds += b["time"] - a["time"]
    return samples / seconds


def test_study_throughput_agrees_with_the_metrics_timestamps(study_dir):
    # The study's own points; the all-cores reference runs so fast on a quiet machine that each
    # epoch's first batches (left out by the step-event intervals) weigh more than 5 % of its epoch.
    for row in json.loads((study_dir / "scaling.json").read_text())["rows"]:
        if row["point"] == "scaling":
            assert row["samples_per_s"] == pytest.approx(_rate_from_step_events(Path(row["run_dir"])), rel=0.05)


def test_resume_skips_finished_points_and_other_studies_are_refused(study_dir, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(study_dir, copy)
    finished = {p: p.stat().st_mtime_ns for p in copy.glob("runs/*/summary.json")}
    shutil.rmtree(copy / "runs" / "synthetic-cnn-w2-r0")  # as if killed during that point
    args = [
        "scale",
        "--workers",
        "1,2",
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        "4096",
        "--epochs",
        "3",
        "--batch-size",
        "32",
        "--log-every",
        "8",
        "--out",
        str(copy),
    ]
    assert main(args) == 2 and "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    one = copy / "runs" / "synthetic-cnn-w1-r0" / "summary.json"
    assert one.stat().st_mtime_ns == finished[one], "a finished point was run again"
    assert (copy / "runs" / "synthetic-cnn-w2-r0" / "summary.json").exists()
    different = [*args[:-2], "--batch-size", "64", "--out", str(copy), "--resume"]
    assert main(different) == 2 and "different study" in capsys.readouterr().err


@pytest.mark.parametrize(
    "workers, message",
    [("", "at least one"), ("0,1", "positive"), ("-2", "positive"), ("2,1,2", "repeat"), (str(CORES + 1), "cores")],
)
def test_bad_worker_lists(tmp_path, capsys, workers, message):
    code = main(["scale", "--workers", workers, "--workload", "synthetic-cnn", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_report_refuses_a_directory_that_is_no_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a paratrain run (config.json), scaling study (scaling.json) or sweep" in capsys.readouterr().err


def test_compare_prints_differences_and_writes_overlays(study_dir, tmp_path, capsys):
    runs = sorted(str(p) for p in (study_dir / "runs").iterdir())
    assert main(["compare", *runs, "--out", str(tmp_path / "cmp.html")]) == 0
    out = capsys.readouterr().out
    assert "x first" in out and "synthetic-cnn-w2-r0" in out
    assert (tmp_path / "cmp.html").stat().st_size > 20000
    # Memory per rank, from each run's summary: a DDP replica holds the whole model state, so the
    # 2-worker run's largest rank holds what the 1-worker run holds.
    from paratrain.reporting import comparison_rows

    rows = {Path(r["run"]).name: r for r in comparison_rows([RunDir(Path(p)) for p in runs])}
    one, two = rows["synthetic-cnn-w1-r0"], rows["synthetic-cnn-w2-r0"]
    summary = RunDir(Path(two["run"])).read_summary()
    assert two["model_state_bytes"] == max(
        sum(v) for v in zip(*(summary["memory"][k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_bytes")))
    )
    assert one["model_state_bytes"] == two["model_state_bytes"] > 0
    assert "model state / rank" in (tmp_path / "cmp.html").read_text()


@pytest.mark.parametrize("kind", ["study", "run", "comparison"])
def test_report_renders_in_a_real_browser(study_dir, tmp_path, kind):
    from paratrain.reporting import write_report

    runs = sorted((study_dir / "runs").iterdir())
    paths = {"study": [study_dir], "run": [runs[0]], "comparison": runs}[kind]
    page_path = write_report(paths, tmp_path / f"{kind}.html")
    with browser_page(page_path) as page:
        if kind == "study":
            rows = page.evaluate(
                "[...document.querySelectorAll('#scaling tbody tr')].map(r => [r.cells[1].innerText, "
                "r.cells[2].innerText])"
            )
            assert rows == [["1", "1"], ["2", "1"], ["1 (all cores)", str(CORES)]]
            headline = page.evaluate("document.querySelector('#headline').innerText")
            assert f"2 worker(s) x 1 core(s) against one process on all {CORES} cores" in headline
            # the verdict comes first: against what, how much faster, efficiency, accuracy, and whether it pays off
            verdict = page.evaluate("document.querySelector('#verdict .headline').innerText")
            # On a busy machine a contended row, or comparisons pointing different ways, gets no verdict (#27).
            if verdict.startswith("synthetic-cnn: can't tell: "):
                assert "rerun paratrain scale with the same flags on an idle machine" in verdict
            else:
                assert (
                    verdict.startswith("synthetic-cnn: 2 workers are ")
                    and f"than one process on all {CORES} cores" in verdict
                )
                assert "efficiency against 1 worker(s) x 1 core(s), accuracy " in verdict and " points: " in verdict
            assert page.evaluate("document.querySelector('#doctor').innerText").startswith("Doctor: ")
            assert "spread xR: the repeats' samples/s differ by more than x1.15" in page.evaluate(
                "document.body.innerText"
            )
        elif kind == "comparison":
            assert page.evaluate("document.querySelectorAll('#comparison tbody tr').length") == len(runs)
        else:
            assert page.evaluate("document.querySelectorAll('#summary tbody tr').length") >= 10
            memory = page.evaluate(
                "[...document.querySelectorAll('#memory tbody tr')].map(r => r.cells[0].innerText + ' ' + "
                "r.cells[1].innerText)"
            )
            assert (
                len(memory) == RunDir(runs[0]).read_summary()["workers"]
                and memory[0].startswith("rank 0 ")
                and memory[0].endswith("iB")
            )


@pytest.mark.parametrize(
    "mode, batch_sizes, lr_factors", [("weak", (32, 32), (2.0, 4.0)), ("strong", (32, 16), (1.0, 1.0))]
)
def test_a_study_whose_smallest_count_is_two_workers(tmp_path, mode, batch_sizes, lr_factors):
    """Base 2: speedup = T(2) / T(N) x 2 and efficiency = speedup / N, so 2 workers are 2.0 and 1.0.
    Weak: 32 per worker, the LR scaled from the batch --lr is meant for (one worker's 32);
    strong: the global batch 2 x 32 split over the workers, the LR as given."""
    study = validate(
        ScaleConfig, {"workers": "2,4", "mode": mode, "out": tmp_path / mode, "train": {"batch_size": 32, "lr": 0.01}}
    )
    points = [point_config(study, "synthetic-cnn", n, 0) for n in (2, 4)]
    assert tuple(p["batch_size"] for p in points) == batch_sizes
    assert tuple(_lr(p) / 0.01 for p in points) == pytest.approx(lr_factors)
    assert [validate(TrainConfig, p).global_batch_size for p in points] == [2 * batch_sizes[0], 4 * batch_sizes[1]]
    two, four = scaling_rows(
        [
            _fake_run(tmp_path / "w2", "synthetic-cnn", 2, [9.0, 8.0, 8.0]),
            _fake_run(tmp_path / "w4", "synthetic-cnn", 4, [9.0, 5.0, 5.0]),
        ]
    )
    assert (two["workers"], two["speedup"], two["efficiency"]) == (2, pytest.approx(2.0), pytest.approx(1.0))
    assert (four["workers"], four["speedup"], four["efficiency"]) == (4, pytest.approx(8 / 5 * 2), pytest.approx(0.8))


def _run_on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run argv with stderr on a pseudo-terminal, where train draws its progress bar; its exit
    status and what it wrote to stderr."""
    master, terminal = pty.openpty()
    written: list[bytes] = []

    def drain() -> None:  # a full pty buffer would block the command
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the terminal side closed
                return
            if not data:
                return
            written.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    proc = subprocess.run(argv, stderr=terminal, stdout=subprocess.DEVNULL)
    os.close(terminal)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, b"".join(written).decode(errors="replace")


def test_quiet_means_what_it_means_to_train_no_progress_bar(tmp_path):
    # On a terminal a point shows train's bar ("epoch 1/1 ━━━ 16/16"); --quiet leaves the lines of finished points.
    code, err = _run_on_a_terminal(
        [
            sys.executable,
            "-m",
            "paratrain",
            "scale",
            "--workers",
            "1",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "512",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--out",
            str(tmp_path / "s"),
            "--quiet",
        ]
    )
    assert code == 0, err
    assert "epoch 1/1" not in err and "━" not in err, err
    assert "synthetic-cnn-w1-r0:" in err and "synthetic-cnn-w1-all-cores-r0:" in err, err


def test_the_accuracy_plot_names_the_split_the_table_names(tmp_path, monkeypatch):
    from paratrain.reporting import plots

    labels = {}

    def keep_label(fig, path):
        labels[path.name] = fig.axes[0].get_ylabel()
        plots.plt.close(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep_label)
    rows = scaling_rows([_fake_run(tmp_path / "a", "m", 1, [9.0, 8.0]), _fake_run(tmp_path / "b", "m", 2, [9.0, 5.0])])
    study_plots(_record(rows), tmp_path)
    assert labels["accuracy.png"] == "test accuracy" and "test acc" in study_table(_record(rows))[0]
    study_plots(_record([{**r, "val_split": "val"} for r in rows]), tmp_path)
    assert labels["accuracy.png"] == "val accuracy"


def test_the_accuracy_curves_name_the_split_they_were_measured_on(tmp_path, monkeypatch):
    from paratrain.reporting import plots

    labels = {}

    def keep_label(fig, path):
        labels[path.name] = fig.axes[0].get_ylabel()
        plots.plt.close(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep_label)
    runs = {}
    for split in ("test", "val"):
        run = _fake_run(tmp_path / split, "m", 1, [9.0, 8.0])
        events = [
            {"event": "step", "step": 1, "samples": 32, "time": 0.1, "loss": 2.0},
            {"event": "epoch", "epoch": 0, "step": 1, "samples": 32, "time_end": 0.2},
            {"event": "eval", "epoch": 0, "split": split, "accuracy": 0.4},
        ]
        run.metrics.write_text("".join(json.dumps(e) + "\n" for e in events))
        runs[split] = run
    plots.curves_plots([runs["test"]], ["a"], tmp_path, "run-")
    assert labels == {"run-loss.png": "training loss", "run-accuracy.png": "test accuracy"}
    plots.curves_plots([runs["val"]], ["b"], tmp_path, "run-")
    assert labels["run-accuracy.png"] == "val accuracy"
    plots.curves_plots([runs["test"], runs["val"]], ["a", "b"], tmp_path, "cmp-")
    assert labels["cmp-accuracy.png"] == "val/test accuracy"
