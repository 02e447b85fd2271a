"""Runs that did not end well, downstream (#57): Ctrl-C in `paratrain train`, `compare` of a failed run
in either place, `compare` of runs other work slowed, and what a run's page shows of its splits and
options. One run that completed and one stopped with Ctrl-C, both real; the contended ones are the
completed run with its machine load set."""

import html
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import synthetic

import paratrain
from paratrain.cli import main
from paratrain.launch.load import CONTENDED_ABOVE
from paratrain.reporting import write_report
from paratrain.reporting.comparison import comparison_rows, comparison_table
from paratrain.reporting.verdict import comparison_verdict
from paratrain.runs import RunDir, json_records, write_json

EPOCHS = 100  # far more than the interrupted run gets through


def _epochs_done(run: Path) -> int:
    return sum(1 for event in json_records(run / "metrics.jsonl") if event.get("event") == "epoch")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """`done`: a run that completed; `interrupted`: `paratrain train --workers 2` stopped by Ctrl-C after
    its first epoch, with its exit status and stderr."""
    root = tmp_path_factory.mktemp("outcomes")
    paratrain.train(synthetic(root, workers=1, run_dir=root / "done"))
    interrupted = root / "interrupted"
    flags = ["--workload", "synthetic-cnn", "--device", "cpu", "--synthetic-samples", "512", "--batch-size", "32"]
    flags += ["--epochs", str(EPOCHS), "--workers", "2", "--threads-per-worker", "1", "--run-dir", str(interrupted)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "paratrain", "train", *flags],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not _epochs_done(interrupted) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    # Ctrl-C in a terminal: SIGINT to the foreground process group, the launcher and its ranks alike.
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return {"root": root, "code": proc.returncode, "err": err}


def test_ctrl_c_in_train_exits_130_and_says_how_to_keep_the_work(outcomes):
    run = outcomes["root"] / "interrupted"
    assert outcomes["code"] == 130, outcomes["err"]
    (line,) = outcomes["err"].strip().splitlines()
    epochs = _epochs_done(run)
    assert 1 <= epochs < EPOCHS
    assert line.startswith(f"paratrain train: interrupted after {epochs} of {EPOCHS} epoch(s), with no checkpoint")
    assert "--checkpoint-every 1" in line and "--resume" in line
    summary = RunDir(run).summary_record()
    assert summary.status == "failed" and summary.error == "interrupted"


@pytest.mark.parametrize("failed_first", [True, False])
def test_compare_shows_a_failed_run_as_failed_and_computes_nothing_from_its_missing_figures(
    outcomes, failed_first, tmp_path, capsys
):
    done, failed = outcomes["root"] / "done", outcomes["root"] / "interrupted"
    paths = [failed, done] if failed_first else [done, failed]
    page = tmp_path / "compare.html"
    assert main(["compare", *map(str, paths), "--out", str(page)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = comparison_rows([RunDir(p) for p in paths])
    by_name = {Path(r["run"]).name: r for r in rows}
    assert by_name["interrupted"]["throughput_vs_first"] is None and by_name["interrupted"]["val_accuracy_diff"] is None
    # against a failed first run nothing has a ratio; against a completed one, the completed run itself does
    assert (by_name["done"]["throughput_vs_first"] is None) == failed_first
    _, cells = comparison_table(rows, "test")
    failed_cells = next(c for c in cells if c[0] == "interrupted (failed)")
    assert failed_cells[5] == "-" and failed_cells[9] == "-"  # x first, Δ accuracy
    assert "interrupted (failed)" in out
    (verdict,) = comparison_verdict(rows)
    assert verdict.startswith("interrupted failed (interrupted): ")
    assert ("put a completed run first" in verdict) == failed_first and "points" not in verdict
    assert verdict in out and html.escape(verdict) in page.read_text()


def _with_load(source: Path, target: Path, other_fraction: float) -> Path:
    shutil.copytree(source, target)
    summary = RunDir(target).read_summary()
    summary["machine_load"] = {**summary["machine_load"], "other_fraction": other_fraction}
    summary["machine_load"]["contended"] = other_fraction > CONTENDED_ABOVE
    write_json(RunDir(target).summary, summary)
    return target


def test_compare_gives_no_verdict_on_runs_other_work_slowed(outcomes, tmp_path, capsys):
    done = outcomes["root"] / "done"
    quiet = _with_load(done, tmp_path / "quiet", 0.02)
    busy = _with_load(done, tmp_path / "busy", 0.77)
    (clean,) = comparison_verdict(comparison_rows([RunDir(quiet), RunDir(quiet)]))
    assert clean.endswith("1.00x the samples/s, accuracy +0.0 points: does not pay off (less than 10% faster)")
    (withheld,) = comparison_verdict(comparison_rows([RunDir(quiet), RunDir(busy)]))
    assert withheld == (
        "busy (1 worker(s)) against quiet (1 worker(s)): can't tell: busy (77% of its cores to other work) was "
        "slowed by other work; measured 1.00x the samples/s, accuracy +0.0 points; rerun both on an idle machine "
        "(paratrain doctor on a run shows what else took its cores)"
    )
    assert main(["compare", str(busy), str(quiet), "--out", str(tmp_path / "c.html")]) == 0
    headline = re.search(r"<p class='headline'>([^<]*)</p>", (tmp_path / "c.html").read_text()).group(1)
    assert "can&#x27;t tell: busy (77% of its cores to other work) was slowed" in headline and "pay" not in headline
    assert html.unescape(headline) in capsys.readouterr().out


def _first_column(page: str, table: str) -> list[str]:
    body = re.search(rf"<table id='{table}'>.*?<tbody>(.*?)</tbody>", page, re.S).group(1)
    return re.findall(r"<tr><td>([^<]*)</td>", body)


def test_a_run_page_shows_the_splits_it_had_and_folds_the_options_left_at_their_defaults(outcomes, tmp_path):
    done = outcomes["root"] / "done"
    assert RunDir(done).summary_record().val_split == "test"  # no --val-split: val_* would be the test split's
    page = write_report([done], tmp_path / "run.html").read_text()
    summary = _first_column(page, "summary")
    assert {"test_loss", "test_accuracy"} <= set(summary) and not {"val_loss", "val_accuracy"} & set(summary)
    chosen, defaults = _first_column(page, "config"), _first_column(page, "defaults")
    # what conftest's synthetic() sets, and what the launcher resolved
    assert {"workload", "device", "lr", "epochs", "threads_per_worker", "log_every", "global_batch_size"} <= set(chosen)
    unused = {"powersgd_rank", "ps_ranks", "synthetic_shape", "grad_compression", "tp_plan"}
    assert unused <= set(defaults) and not unused & set(chosen)
    assert f"{len(defaults)} options at their defaults" in page
    # with a validation split, its figures are the run's own and are shown
    held = tmp_path / "held"
    shutil.copytree(done, held)
    write_json(RunDir(held).summary, {**RunDir(held).read_summary(), "val_split": "val"})
    assert "val_accuracy" in _first_column(write_report([held], tmp_path / "held.html").read_text(), "summary")
