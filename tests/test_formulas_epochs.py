"""Exact checks (#25): every place that drops the first epoch (it pays for start-up) before taking
the epoch time, on hand-computed cases, and what each does with a single epoch (they agree: keep it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paratrain.doctor.evidence import RunEvidence
from paratrain.launch.script import throughput
from paratrain.scale import steady_epoch_time

# Epochs of 10, 2, 2, 3 s: without the first, [2, 2, 3] -> median 2 s (the mean would be 7/3 s).
# Epochs of 10, 4, 2 s: without the first, [4, 2] -> median (2 + 4) / 2 = 3 s (the median with the
# first, [2, 4, 10], would be 4 s). One epoch of 5 s: nothing is left without it, so it is kept: 5 s.
CASES = [([10.0, 2.0, 2.0, 3.0], 2.0), ([10.0, 4.0, 2.0], 3.0), ([5.0], 5.0), ([9.0, 1.0], 1.0)]


@pytest.mark.parametrize("times, expected", CASES)
def test_scale_steady_epoch_time(times, expected):
    assert steady_epoch_time({"epoch_times_s": times}) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("times, expected", CASES)
def test_doctor_steady_epoch_s(times, expected):
    run = RunEvidence(path=Path("."), config={}, summary={"epoch_times_s": times}, events=[])
    assert run.steady_epoch_s == pytest.approx(expected, abs=1e-12)


def test_doctor_steady_epoch_s_without_epochs_is_none():
    assert RunEvidence(path=Path("."), config={}, summary={}, events=[]).steady_epoch_s is None


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
