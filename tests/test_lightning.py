"""A Lightning script (tests/lightning_script.py; Lightning is in the test extra) under `paratrain launch`
and `scale --script`: it runs at 1 and 2 ranks, and the probe sees inside Lightning's loop (its optimizer
closure runs forward and backward inside optimizer.step) well enough for the doctor to name a planted fault."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.doctor import diagnose

SCRIPT = Path(__file__).parent / "lightning_script.py"
PARATRAIN = [sys.executable, "-m", "paratrain"]


def launch(run, fault):
    done = subprocess.run(
        [*PARATRAIN, "launch", "-n", "2", "--run-dir", str(run), str(SCRIPT), fault],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + (run / "logs" / "rank0.log").read_text()
    return run


def test_a_lightning_script_with_a_slow_dataset_gets_data_wait_as_its_top_finding(tmp_path):
    diagnosis = diagnose(launch(tmp_path / "data", "data"))
    top = next((f for f in diagnosis["findings"] if f["check"] != "contended"), {})
    assert top.get("check") == "data_wait" and top["predicted_speedup"] > 1.2, json.dumps(diagnosis, indent=1)


def test_a_healthy_lightning_script_is_timed_step_by_step_and_gets_nothing_high(tmp_path):
    run = launch(tmp_path / "healthy", "healthy")
    probe = json.loads((run / "summary.json").read_text())["probe"]
    assert probe["status"] == "on"
    for r in probe["ranks"]:
        assert r["steps"] == 24 and r["samples_per_step"] == 32 and r["rounds_per_step"] == 1
        # forward and backward run inside Lightning's optimizer closure: charged to themselves, not to
        # the optimizer step that calls them
        phases = r["phases_s"]
        assert phases["forward"] + phases["backward"] > 5 * phases["optimizer"], phases
        assert sum(phases.values()) == pytest.approx(r["step_s"], rel=1e-3)
    assert not [f for f in diagnose(run)["findings"] if f["severity"] == "high"]


def test_a_lightning_script_scales_from_one_rank_to_two(tmp_path):
    done = subprocess.run(
        [
            *PARATRAIN,
            "scale",
            "--script",
            str(SCRIPT),
            "--workers",
            "1,2",
            "--out",
            str(tmp_path / "study"),
            "--",
            "healthy",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "study" / "scaling.json").read_text())["rows"]
    assert sorted(r["workers"] for r in rows if r.get("point", "scaling") == "scaling") == [1, 2]


def test_a_device_count_written_into_a_lightning_script_fails_with_the_fix_in_one_line(tmp_path):
    # devices=2 written into the script, one rank started: Lightning's own world-size check stops it
    done = subprocess.run(
        [
            *PARATRAIN,
            "launch",
            "-n",
            "1",
            "--no-probe",
            "--run-dir",
            str(tmp_path / "run"),
            str(SCRIPT),
            "healthy",
            "2",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "Trainer(devices=2, num_nodes=1) does not match the 1 rank(s)" in lines[0], done.stderr
    assert "set devices=int(os.environ['WORLD_SIZE']) and num_nodes=1" in lines[0], done.stderr
