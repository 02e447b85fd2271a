"""Typed run records (#28): summary.json read as paratrain.runs.records.Summary, checked when it is
written, documented in docs/run-directory.md field for field, and read from older releases' files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paratrain.errors import UsageError
from paratrain.runs import RunDir, write_json
from paratrain.runs.records import Study, Summary, checked, fitting_fields, read_summary_record

DOCS = Path(__file__).resolve().parents[1] / "docs" / "run-directory.md"

# summary.json as a release before the memory, MFU and machine-load blocks wrote it (session 2's
# format): what `paratrain report` and `scale` must still read.
OLD_SUMMARY = {
    "status": "completed",
    "workers": 2,
    "strategy": "ddp",
    "batch_size": 32,
    "global_batch_size": 64,
    "lr": 0.02,
    "epochs": 3,
    "epoch_times_s": [4.1, 2.0, 2.2],
    "epoch_time_s": 2.1,
    "samples_per_s": 2380.9,
    "train_loss": 1.9,
    "val_loss": 1.8,
    "val_accuracy": 0.34,
    "wall_time_s": 12.5,
    "breakdown": {"data_s": 0.001, "compute_s": 0.01, "comm_s": 0.002, "optimizer_s": 0.001, "other_s": 0.0},
    "peak_memory_bytes": [200000000, 190000000],
}


def _documented_keys() -> set[str]:
    text = DOCS.read_text()
    section = text[text.index("## `summary.json`") : text.index("## `machine_load`")]
    keys: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return keys


def test_every_summary_field_is_documented_and_every_documented_key_is_a_field():
    assert _documented_keys() == set(Summary.model_fields)


def test_a_summary_an_older_release_wrote_reads(tmp_path):
    run = RunDir(tmp_path)
    write_json(run.summary, OLD_SUMMARY)
    record = run.summary_record()
    assert (record.workers, record.epoch_times_s, record.breakdown.comm_s) == (2, [4.1, 2.0, 2.2], 0.002)
    assert record.memory is None and record.machine_load is None and not record.contended


@settings(max_examples=60, deadline=None)
@given(
    dropped=st.sets(st.sampled_from(sorted(set(OLD_SUMMARY) - {"status"}))),
    extra=st.dictionaries(
        st.text("abcdefgh_", min_size=3, max_size=8).filter(lambda k: k not in Summary.model_fields),
        st.one_of(st.floats(allow_nan=False), st.text(max_size=5), st.none()),
        max_size=3,
    ),
)
def test_any_subset_of_an_old_summary_with_unknown_keys_reads_and_keeps_them(dropped, extra):
    data = {**{k: v for k, v in OLD_SUMMARY.items() if k not in dropped}, **extra}
    record = read_summary_record(data, "summary.json")
    assert record.model_dump(exclude_unset=True) == data


def test_a_wrongly_typed_summary_is_refused_where_it_is_written_and_named_where_it_is_read():
    with pytest.raises(ValueError):
        checked(Summary, {**OLD_SUMMARY, "epoch_times_s": "fast"})
    with pytest.raises(ValueError):
        checked(Summary, {**OLD_SUMMARY, "status": "done"})
    with pytest.raises(UsageError, match=r"^runs/x/summary.json is not a paratrain summary: machine_load.contended"):
        read_summary_record({**OLD_SUMMARY, "machine_load": {"contended": "perhaps"}}, "runs/x/summary.json")


def test_a_scripts_reported_metrics_reach_the_top_level_only_where_they_fit_the_field():
    reported = {"epochs": 2.5, "steps": 300.0, "model": 3.0, "val_accuracy": 0.91, "tokens_seen": 1e6}
    assert fitting_fields(reported) == {"steps": 300.0, "val_accuracy": 0.91, "tokens_seen": 1e6}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real 2-epoch run on one rank, and a copy of it whose summary an older release wrote."""
    import shutil

    import paratrain

    root = tmp_path_factory.mktemp("records")
    returned = paratrain.train(
        workload="cifar10-cnn",
        dataset="synthetic",
        synthetic_samples=256,
        synthetic_shape="3,16,16",
        epochs=2,
        batch_size=32,
        workers=1,
        run_dir=root / "run",
        quiet=True,
    )
    shutil.copytree(root / "run", root / "old")
    write_json(RunDir(root / "old").summary, OLD_SUMMARY)
    write_json(root / "returned.json", returned)  # what paratrain.train returned
    return root


def test_a_real_runs_summary_reads_as_a_record(trained):
    """One training run on one rank: what the engine and the launcher write is a Summary field for field."""
    record = RunDir(trained / "run").summary_record()
    assert record.status == "completed" and record.timed_epochs == 1
    assert record.breakdown is not None and record.machine_load is not None and record.memory is not None
    written = json.loads((trained / "run" / "summary.json").read_text())
    typed = set(written) & set(Summary.model_fields)
    assert typed == set(written), set(written) - typed  # nothing the engine writes goes untyped
    assert json.loads((trained / "returned.json").read_text())["samples_per_s"] == record.samples_per_s


def test_every_scaling_row_field_is_documented_and_every_documented_key_is_a_field():
    from paratrain.runs.records import ScalingRow

    text = (DOCS.parent / "scaling.md").read_text()
    section = text[text.index("`DIR/scaling.json`") : text.index("Plots: `epoch_time.png`")]
    keys: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    assert keys == set(ScalingRow.model_fields)


def test_every_study_field_is_named_in_the_docs():
    text = (DOCS.parent / "scaling.md").read_text()
    said = text[text.index("`DIR/scaling.json`") : text.index("| key | meaning |")]
    assert set(Study.model_fields) <= set(re.findall(r"`([a-z_]+)`", said))


def test_a_study_of_the_wrong_shape_is_refused_where_it_is_written_and_named_where_it_is_read(tmp_path):
    from paratrain.runs.records import load_record

    row = {"workload": "m", "workers": 2, "samples_per_s": 10.0, "speedup": 1.8, "efficiency": 0.9}
    study = {"mode": "weak", "rows": [row]}
    assert checked(Study, study) == study
    with pytest.raises(ValueError):
        checked(Study, {**study, "rows": [{**row, "point": "reference"}]})  # the reference's kind: all_cores_reference
    with pytest.raises(ValueError):
        checked(Study, {**study, "rows": [{k: v for k, v in row.items() if k != "speedup"}]})
    with pytest.raises(ValueError):
        checked(Study, {**study, "mode": "sideways"})
    write_json(tmp_path / "scaling.json", {**study, "rows": [{**row, "workers": "two"}]})
    with pytest.raises(UsageError, match=r"scaling.json is not a paratrain scaling study: rows.0.workers"):
        load_record(Study, tmp_path / "scaling.json", "scaling study")


# scaling.json as the first releases wrote it: no reference rows (`point`), no spreads, flags or rules.
OLD_STUDY = {
    "mode": "weak",
    "workload": ["cifar10-cnn"],
    "repeats": 1,
    "rows": [
        {"workload": "cifar10-cnn", "workers": 1, "threads_per_worker": 1, "global_batch_size": 64,
         "epoch_time_s": 4.0, "samples_per_s": 1000.0, "speedup": 1.0, "efficiency": 1.0, "val_accuracy": 0.41,
         "repeats": 1},
        {"workload": "cifar10-cnn", "workers": 2, "threads_per_worker": 1, "global_batch_size": 128,
         "epoch_time_s": 2.5, "samples_per_s": 1600.0, "speedup": 1.6, "efficiency": 0.8, "val_accuracy": 0.40,
         "repeats": 1},
    ],
}  # fmt: skip


def test_every_sweep_and_trial_field_is_named_in_the_docs():
    from paratrain.runs.records import SweepResult, Trial

    text = (DOCS.parent / "sweeps.md").read_text()
    said = text[text.index("`DIR/sweep.json`") : text.index("Also\nwritten:")]
    named = set(re.findall(r"`([a-z_]+)`|\"([a-z_]+)\"", said))
    named = {a or b for a, b in named}
    assert set(SweepResult.model_fields) | set(Trial.model_fields) <= named, (
        set(SweepResult.model_fields) | set(Trial.model_fields)
    ) - named


# sweep.json as the first releases wrote it: no sampler, recorded metrics, parallelism or attempts.
OLD_SWEEP = {
    "name": "lr",
    "algorithm": "grid",
    "metric": ["val_accuracy"],
    "objective": ["maximize"],
    "space": {"parameters": {"lr": {"type": "discrete", "values": [0.01, 0.1]}}},
    "items": 2,
    "counts": {"COMPLETE": 2, "PRUNED": 0, "FAIL": 0, "RUNNING": 0},
    "trials": [
        {"number": 0, "params": {"lr": 0.01}, "value": 0.41, "state": "COMPLETE", "duration_s": 30.0,
         "run_dir": None, "reason": None, "metrics": {"val_accuracy": 0.41, "time_s": 30.0}},
        {"number": 1, "params": {"lr": 0.1}, "value": 0.52, "state": "COMPLETE", "duration_s": 31.0,
         "run_dir": None, "reason": None, "metrics": {"val_accuracy": 0.52, "time_s": 31.0}},
    ],
    "best": {"number": 1, "params": {"lr": 0.1}, "value": 0.52, "state": "COMPLETE", "metrics": {"val_accuracy": 0.52}},
}  # fmt: skip


def test_an_older_releases_sweep_reads_gives_a_page_and_a_diagnosis(tmp_path, capsys):
    from paratrain.cli import main
    from paratrain.runs.records import SweepResult, Trial, load_record

    sweep = SweepResult.model_validate(OLD_SWEEP)
    assert isinstance(sweep.best, Trial) and sweep.best.number == 1 and len(sweep.completed()) == 2
    write_json(tmp_path / "sweep.json", OLD_SWEEP)
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "best: trial 1 (lr=0.1): val_accuracy 52.0%" in page
    assert main(["doctor", str(tmp_path)]) == 0
    write_json(tmp_path / "sweep.json", {**OLD_SWEEP, "trials": [{**OLD_SWEEP["trials"][0], "state": "SPLENDID"}]})
    with pytest.raises(UsageError, match=r"sweep.json is not a paratrain sweep: trials.0.state"):
        load_record(SweepResult, tmp_path / "sweep.json", "sweep")


def test_every_plan_field_is_named_in_the_docs():
    from paratrain.runs.records import Plan

    text = (DOCS.parent / "planner.md").read_text()
    said = text[text.index("`--json` prints") : text.index("The plots:")]
    named = {a or b for a, b in re.findall(r"`([a-z_]+)`|\"([a-z_]+)\"", said)}
    assert set(Plan.model_fields) <= named, set(Plan.model_fields) - named


def test_a_plan_reads_back_an_older_releases_plan_gives_a_page_and_a_damaged_one_is_one_line(tmp_path, capsys):
    from paratrain.cli import main
    from paratrain.runs.records import Plan, load_record

    flags = ["plan", "--workload", "cifar10-cnn", "--device", "a100", "--gpus", "1,8", "--json"]
    assert main(flags) == 0
    written = json.loads(capsys.readouterr().out)
    plan = Plan.model_validate(written)
    assert plan.recommendation.devices == 8 and {r.devices for r in plan.rows} >= {1, 8}
    assert plan.model_dump(exclude_unset=True) == written  # every key read back, none lost
    # as a release before the cost frontier, the search, tensor parallelism and the model's kind wrote it
    old = {k: v for k, v in written.items() if k not in ("pareto", "search")}
    old["model"] = {k: v for k, v in old["model"].items() if k != "kind"}
    old["rows"] = [{k: v for k, v in r.items() if k != "tp"} for r in old["rows"]]
    write_json(tmp_path / "plan.json", old)
    assert main(["report", str(tmp_path)]) == 0
    assert "on 8 device(s)" in (tmp_path / "report.html").read_text()
    write_json(tmp_path / "plan.json", {**written, "rows": [{**written["rows"][0], "fits": "perhaps"}]})
    with pytest.raises(UsageError, match=r"plan.json is not a paratrain plan: rows.0.fits"):
        load_record(Plan, tmp_path / "plan.json", "plan")


def test_an_older_releases_study_reads_and_gives_a_page(tmp_path):
    from paratrain.cli import main

    study = Study.model_validate(OLD_STUDY)
    assert [r.point for r in study.rows] == ["scaling", "scaling"] and study.reference("cifar10-cnn") is None
    write_json(tmp_path / "scaling.json", OLD_STUDY)
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "cifar10-cnn: 2 workers are 1.60x faster than 1 worker(s) x 1 core(s), 80% efficiency" in page


def test_the_doctor_report_and_compare_read_an_older_releases_summary(trained, tmp_path, capsys):
    from paratrain.cli import main

    old = str(trained / "old")
    assert main(["report", old]) == 0
    page = (trained / "old" / "report.html").read_text()
    assert "2,381 samples/s" in page  # the verdict, from the old summary's figures
    assert main(["doctor", old]) == 0
    assert main(["compare", str(trained / "run"), old, "--out", str(tmp_path / "cmp")]) == 0
    assert "old" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["report", "doctor", "compare"])
def test_a_wrongly_typed_summary_is_one_line_naming_the_file_from_each_reader(command, trained, tmp_path, capsys):
    import shutil

    from paratrain.cli import main

    bad = tmp_path / "bad"
    shutil.copytree(trained / "run", bad)
    (bad / "report.html").unlink(missing_ok=True)
    write_json(RunDir(bad).summary, {**OLD_SUMMARY, "workers": "two"})
    argv = {"report": [str(bad)], "doctor": [str(bad)], "compare": [str(trained / "run"), str(bad)]}[command]
    out = tmp_path / "cmp"
    assert main([command, *argv, *(["--out", str(out)] if command == "compare" else [])]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.search(rf"{re.escape(str(bad / 'summary.json'))} is not a paratrain summary: workers: ", line), line
    assert not (bad / "report.html").exists() and not out.exists()
