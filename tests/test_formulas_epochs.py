"""Exact checks (#25): the rule that drops the first epoch (it pays for start-up) before taking the epoch
time, on hand-computed cases, and every reader that times epochs taking it from that one place
(paratrain.runs): a launched script's throughput, a scaling study's rows and the doctor's start-up check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paratrain.doctor.checks import first_epoch_overhead
from paratrain.doctor.evidence import RunEvidence
from paratrain.launch.script import throughput
from paratrain.runs import RunDir, steady_epoch_time, steady_epochs, write_json
from paratrain.runs.records import Summary
from paratrain.scale import scaling_rows

# Epochs of 10, 2, 2, 3 s: without the first, [2, 2, 3] -> median 2 s (the mean would be 7/3 s).
# Epochs of 10, 4, 2 s: without the first, [4, 2] -> median (2 + 4) / 2 = 3 s (the median with the
# first, [2, 4, 10], would be 4 s). One epoch of 5 s: nothing is left without it, so it is kept: 5 s.
CASES = [([10.0, 2.0, 2.0, 3.0], 2.0), ([10.0, 4.0, 2.0], 3.0), ([5.0], 5.0), ([9.0, 1.0], 1.0)]


@pytest.mark.parametrize("times, expected", CASES)
def test_the_steady_epoch_time(times, expected):
    assert steady_epoch_time(times) == pytest.approx(expected, abs=1e-12)


def test_the_steady_epochs_are_all_but_the_first_or_the_only_one():
    assert steady_epochs(["a", "b", "c"]) == ["b", "c"]
    assert steady_epochs(["a"]) == ["a"]
    assert steady_epochs([]) == []


@pytest.mark.parametrize("times, expected", CASES)
def test_a_scaling_row_times_its_steady_epochs(tmp_path, times, expected):
    # two repeats of one point, the second 2x slower in every epoch: the row's epoch time is the median
    # of the two steady times, (expected + 2 * expected) / 2 = 1.5 * expected
    runs = []
    for i, scale in enumerate((1.0, 2.0)):
        run = RunDir(tmp_path / f"r{i}")
        run.path.mkdir()
        write_json(
            run.config,
            {
                "workload": "m",
                "workers": 1,
                "threads_per_worker": 1,
                "resolved": {"device": "cpu", "threads_per_worker": 1},
            },
        )
        write_json(
            run.summary,
            {
                "status": "completed",
                "workers": 1,
                "strategy": "single",
                "epoch_times_s": [t * scale for t in times],
                "samples_per_s": 1.0,
            },
        )
        runs.append(run)
    (row,) = scaling_rows(runs)
    assert row["epoch_time_s"] == pytest.approx(1.5 * expected, abs=1e-12)


def test_the_doctors_start_up_share_is_against_the_steady_epoch_time():
    # epochs 10, 4, 2 s: steady 3 s (median of [4, 2]); start-up share (10 - 3) / 16 = 0.4375
    ev = RunEvidence(
        path=Path("."), config={}, summary=Summary(status="completed", epoch_times_s=[10.0, 4.0, 2.0]), events=[]
    )
    finding = first_epoch_overhead(ev)
    assert finding is not None and "against 3.00 s for the others (3.3x)" in finding.evidence


def _write_reports(tmp_path: Path, metrics: list[dict]) -> Path:
    (tmp_path / "rank0.jsonl").write_text("".join(json.dumps({"metrics": m}) + "\n" for m in metrics))
    return tmp_path


@pytest.mark.parametrize("times, expected", CASES)
def test_launch_script_epoch_time(tmp_path, times, expected):
    # a script reporting `samples` = 600 per epoch: samples/s = 600 / steady epoch time,
    # e.g. 600 / 2 = 300 for the first case, 600 / 3 = 200 for the second, 600 / 5 = 120 for one epoch.
    reports = _write_reports(tmp_path, [{"epoch_time_s": t, "samples": 600} for t in times])
    out = throughput(reports)
    assert out["epoch_times_s"] == times
    assert out["epoch_time_s"] == pytest.approx(expected, abs=1e-12)
    assert out["samples_per_s"] == pytest.approx(600 / expected, rel=1e-12)


def test_launch_script_own_samples_per_s_is_taken_as_is(tmp_path):
    reports = _write_reports(tmp_path, [{"epoch_time_s": 10.0}, {"epoch_time_s": 2.0, "samples_per_s": 42.0}])
    out = throughput(reports)
    assert out["epoch_time_s"] == pytest.approx(2.0)  # [10, 2] without the first -> 2
    assert out["samples_per_s"] == 42.0
