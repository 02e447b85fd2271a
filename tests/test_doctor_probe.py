"""The doctor inside unmodified scripts: tests/probe_faults.py (plain DDP, no paratrain import) with one
planted fault each, under `paratrain launch -n 2` with the probe, must get that fault as its top finding."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.doctor import diagnose

SCRIPT = Path(__file__).parent / "probe_faults.py"
PARATRAIN = [sys.executable, "-m", "paratrain"]


def launch(tmp_path, fault, *flags):
    run = tmp_path / fault
    done = subprocess.run([*PARATRAIN, "launch", "-n", "2", *flags, "--run-dir", str(run), str(SCRIPT), fault],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr + (run / "logs" / "rank0.log").read_text()
    return run


def top(diagnosis):
    """The first finding about the run itself (other work on a shared machine may rank before it)."""
    return next(f for f in diagnosis["findings"] if f["check"] != "contended")


@pytest.mark.parametrize("fault, check", [
    ("data", "data_wait"), ("threads", "oversubscription"), ("straggler", "straggler"),
    ("rank0-eval", "rank0_alone"), ("eval", "evaluation_share"), ("checkpoint", "checkpoint_share"),
    ("no-sync", "no_sync_missing"), ("uneven", "uneven_shards"),
    ("comm", "exposed_communication")])
def test_a_planted_fault_is_the_top_finding_with_a_predicted_speedup(tmp_path, fault, check):
    diagnosis = diagnose(launch(tmp_path, fault))
    found = top(diagnosis)
    assert found["check"] == check, json.dumps(diagnosis["findings"], indent=1)
    assert found["predicted_speedup"] > 1.05      # a time finding, ranked by its predicted saving
    assert "code change" in found["remedy"] or "paratrain launch" in found["remedy"]


def test_the_scripts_own_collectives_every_step_are_found(tmp_path):
    # Not the top finding here: on CPU ranks DDP's all-reduce tail outweighs 100 scalar reductions.
    found = {f["check"]: f for f in diagnose(launch(tmp_path, "collective"))["findings"]}
    assert found["host_sync_stalls"]["predicted_speedup"] > 1.05, json.dumps(found, indent=1)
    assert "every 50 steps" in found["host_sync_stalls"]["remedy"]


def test_a_healthy_script_gets_nothing_marked_high_and_its_breakdown_is_the_built_in_one(tmp_path):
    run = launch(tmp_path, "healthy")
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["breakdown"]) == {"data_s", "compute_s", "comm_s", "optimizer_s", "other_s"}
    ranks = summary["probe"]["ranks"]
    assert [r["steps"] for r in ranks] == [48, 48]          # every optimizer step seen on each rank
    assert all(r["samples_per_step"] == 32 and r["rounds_per_step"] == 1 and r["threads"] == 1 for r in ranks)
    # The phases add up to the step: every second of it is charged to exactly one phase.
    for r in ranks:
        assert sum(r["phases_s"].values()) == pytest.approx(r["step_s"], rel=1e-3)
    assert summary["samples_per_s"] == summary["probe"]["samples_per_s"] > 0   # the script reported none
    assert not [f for f in diagnose(run)["findings"] if f["severity"] == "high"]


def test_a_failing_hook_steps_aside_and_the_run_goes_on(tmp_path):
    run = launch(tmp_path, "broken-loader")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and "breakdown" not in summary
    assert summary["probe"]["status"] == "fell back" and "ValueError" in summary["probe"]["reason"]
    assert "probe_off" in [f["check"] for f in diagnose(run)["findings"]]


def test_no_probe_runs_the_script_untouched(tmp_path):
    run = launch(tmp_path, "healthy", "--no-probe")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["probe"] == {"status": "off", "reason": "--no-probe"} and not (run / "probe").exists()
