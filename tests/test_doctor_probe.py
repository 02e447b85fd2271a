"""The doctor inside unmodified scripts: tests/probe_faults.py (plain DDP, no paratrain import) with one
planted fault each, under `paratrain launch -n 2` with the probe, must get that fault as its top finding."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_formulas_doctor import probed_run  # the hand-written probe block (one place: the fast formula tests)

from paratrain.doctor import diagnose
from paratrain.reporting.verdict import run_verdict
from paratrain.runs import RunDir

SCRIPT = Path(__file__).parent / "probe_faults.py"
PARATRAIN = [sys.executable, "-m", "paratrain"]


def launch(tmp_path, fault, *flags, env=None, ranks=2):
    run = tmp_path / fault
    done = subprocess.run(
        [*PARATRAIN, "launch", "-n", str(ranks), *flags, "--run-dir", str(run), str(SCRIPT), fault],
        capture_output=True,
        text=True,
        timeout=240,
        env=env and {**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr + (run / "logs" / "rank0.log").read_text()
    return run


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """`launch`, once per fault and environment in this module: tests that only read a run share it (each
    launch is ~8 s of the suite). A test that writes into its run directory launches its own."""
    runs = {}

    def cached(fault, env=None):
        key = (fault, tuple(sorted((env or {}).items())))
        if key not in runs:
            runs[key] = launch(tmp_path_factory.mktemp(fault.replace("-", "_")), fault, env=env)
        return runs[key]

    return cached


def top(diagnosis):
    """The first finding about the run itself (other work on a shared machine may rank before it)."""
    return next(f for f in diagnosis["findings"] if f["check"] != "contended")


@pytest.mark.parametrize(
    "fault, check",
    [
        ("data", "data_wait"),
        ("threads", "oversubscription"),
        ("straggler", "straggler"),
        ("rank0-eval", "rank0_alone"),
        ("eval", "evaluation_share"),
        ("checkpoint", "checkpoint_share"),
        ("no-sync", "no_sync_missing"),
        ("uneven", "uneven_shards"),
        ("comm", "exposed_communication"),
        ("small-batch", "small_batch"),
        ("collective", "host_sync_stalls"),
        ("loader-workers", "loader_workers"),
        # issue #56: causes read from what the probe saw besides the phases, and time no check explains
        ("buckets", "ddp_buckets"),
        ("model-collective", "model_collectives"),
        ("recompute", "needless_recompute"),
        # the whole history dumped as JSON every step: the dump grows with the run (doctor/growth.py)
        ("json-log", "growing_steps"),
        # the model's work against its layers alone, each less its own backward pass (doctor/expected.py)
        ("anomaly", "model_work_excess"),
        # gradients of the parameters no optimizer holds: their layers' backward timed alone (doctor/causes.py)
        ("frozen", "needless_gradients"),
        # FSDP2's gathers and reductions for 22 one-layer units: no check prices them, the ledger names them
        ("fsdp-leaf", "unexplained_comm"),
        # the dataset and loader built again every epoch: the steps that began an epoch, beyond a plain one
        ("epoch-reload", "epoch_start"),
        # FSDP2 with a backward per term of the loss: backward passes counted against training forwards
        ("per-loss", "repeated_backward"),
    ],
)
def test_a_planted_fault_is_the_top_finding_with_a_predicted_speedup(launched, fault, check):
    diagnosis = diagnose(launched(fault))
    found = top(diagnosis)
    assert found["check"] == check, json.dumps(diagnosis["findings"], indent=1)
    assert found["predicted_speedup"] > 1.05  # a time finding, ranked by its predicted saving
    assert "code change" in found["remedy"] or "paratrain launch" in found["remedy"]
    if fault == "json-log":  # the growing time is traced to what spends it
        assert "dumps" in found["evidence"] and "probe_faults.py" in found["remedy"], found


def test_the_scripts_own_collectives_are_charged_to_them_whole(launched):
    # A blocking torch.distributed call waits inside itself (Work.wait): that wait is the script's
    # collective too, not the gradient all-reduce's exposed time.
    run = launched("collective")
    phases = json.loads((run / "summary.json").read_text())["probe"]["phases_s"]
    assert phases["collective"] > phases["comm"], phases
    assert "every 50 steps" in top(diagnose(run))["remedy"]


def test_host_reads_are_counted_on_the_sync_device(launched):
    # A CPU stand-in for a GPU's host-device syncs: the probe counts host reads of tensors on the device
    # PARATRAIN_PROBE_SYNC_DEVICE names (cuda unless set), here the CPU's.
    stand_in = {"PARATRAIN_PROBE_SYNC_DEVICE": "cpu"}  # ranks inherit launch's environment
    found = {f["check"]: f for f in diagnose(launched("host-sync", env=stand_in))["findings"]}
    assert found["host_syncs"]["severity"] == "advice", json.dumps(found, indent=1)
    assert "3.0 reads of device tensors" in found["host_syncs"]["evidence"]
    healthy = {f["check"] for f in diagnose(launched("healthy", env=stand_in))["findings"]}
    assert "host_syncs" not in healthy
    # on the default device (cuda, absent here) nothing is counted
    assert "host_syncs" not in {f["check"] for f in diagnose(launched("host-sync"))["findings"]}


def test_a_healthy_script_gets_nothing_marked_high_and_its_breakdown_is_the_built_in_one(launched):
    run = launched("healthy")
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["breakdown"]) == {"data_s", "compute_s", "comm_s", "optimizer_s", "other_s"}
    ranks = summary["probe"]["ranks"]
    assert [r["steps"] for r in ranks] == [48, 48]  # every optimizer step seen on each rank
    assert all(r["samples_per_step"] == 32 and r["rounds_per_step"] == 1 and r["threads"] == 1 for r in ranks)
    # the model's layers timed alone, every one of them: its forward and backward are no more than their work
    assert all(r["twins_timed"] == r["twins_seen"] == 7 and r["anomaly_mode"] is False for r in ranks), ranks
    assert all(r["layers_alone_s"] > 0 for r in ranks)
    assert "model_work_excess" not in {f["check"] for f in diagnose(run)["findings"]}
    # The phases add up to the step: every second of it is charged to exactly one phase.
    for r in ranks:
        assert sum(r["phases_s"].values()) == pytest.approx(r["step_s"], rel=1e-3)
    assert summary["samples_per_s"] == summary["probe"]["samples_per_s"] > 0  # the script reported none
    record = RunDir(run).summary_record()  # so the run's page calls it measured, not reported
    assert "samples/s measured by the probe" in run_verdict(record, RunDir(run).read_config())[0]
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


def test_a_launched_script_without_optimizer_steps_is_refused_in_one_line(tmp_path):
    script = tmp_path / "no_steps.py"
    script.write_text("import torch\nprint(torch.ones(2).sum())\n")
    run = tmp_path / "run"
    subprocess.run([*PARATRAIN, "launch", "--run-dir", str(run), str(script)], check=True, capture_output=True)
    done = subprocess.run([*PARATRAIN, "doctor", str(run)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "saw no optimizer step" in done.stderr


def test_gpus_idle_in_a_share_of_the_monitors_samples_are_named_as_a_symptom(tmp_path):
    # GPU samples as the monitor writes them from NVML (a stand-in: no GPU here): GPU 1 idle in 3 of 10.
    from paratrain.doctor import diagnose_run
    from paratrain.doctor.evidence import read_run

    run = probed_run(tmp_path / "run", [{"phases_s": {"forward": 0.05, "backward": 0.05}}] * 2)
    samples = [
        {"time": float(t), "kind": "gpu", "index": i, "utilization_percent": 2 if i == 1 and t < 3 else 95}
        for t in range(10)
        for i in (0, 1)
    ]
    (run / "system.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    found = {f.check: f for f in diagnose_run(read_run(run))}["idle_devices"]
    assert found.finding == "GPU 1 idle 30% of the run" and found.severity == "advice", found
    # below the line (1 in 10), nothing
    samples = [{**s, "utilization_percent": 95} if s["index"] == 1 and s["time"] > 0 else s for s in samples]
    (run / "system.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert "idle_devices" not in {f.check for f in diagnose_run(read_run(run))}


def test_the_excess_of_steps_holding_an_evaluation_is_over_the_median_plain_step():
    from paratrain.launch.probe_summary import excess_s

    steps = [
        {"wall_s": w, "eval": e, "checkpoint": c}
        for w, e, c in [(0.010, 0, 0), (0.012, 0, 0), (0.011, 0, 0), (0.061, 0.03, 0), (0.031, 0, 0.01)]
    ]
    # plain median 11 ms: the evaluating step is 50 ms over, the saving one 20 ms, over 5 steps
    assert excess_s(steps) == pytest.approx({"eval_excess_s": 0.050 / 5, "checkpoint_excess_s": 0.020 / 5})


def test_find_unused_parameters_is_named_when_ddp_found_every_parameter_used(launched):
    # DDP's logging data, read by the probe, saw no unused parameter, so the flag is pure cost and named; the
    # same script without the flag (the healthy one) gets no such finding.
    found = {f["check"]: f for f in diagnose(launched("find-unused"))["findings"]}["find_unused_parameters"]
    assert "DDP found no unused parameter" in found["evidence"] and found["predicted_speedup"] > 1.0, found
    assert "find_unused_parameters" not in {f["check"] for f in diagnose(launched("healthy"))["findings"]}


def test_a_script_that_profiles_itself_is_left_its_profiler_and_told(launched):
    """The probe does not start a second profiler inside the script's (torch.profiler allows one): it writes no
    trace, and the doctor says why, with the remedy."""
    run = launched("profiled")
    assert not list((run / "probe").glob("trace-rank*")), list((run / "probe").iterdir())
    note = next(f for f in diagnose(run)["findings"] if f["check"] == "trace_missing")
    assert "the script runs torch.profiler itself" in note["finding"], note
    assert "remove the script's profiler" in note["remedy"]
