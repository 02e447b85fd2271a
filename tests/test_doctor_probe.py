"""The doctor inside unmodified scripts: tests/probe_faults.py (plain DDP, no paratrain import) with one
planted fault each, under `paratrain launch -n 2` with the probe, must get that fault as its top finding."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.doctor import diagnose

SCRIPT = Path(__file__).parent / "probe_faults.py"
PARATRAIN = [sys.executable, "-m", "paratrain"]


def launch(tmp_path, fault, *flags, env=None):
    run = tmp_path / fault
    done = subprocess.run([*PARATRAIN, "launch", "-n", "2", *flags, "--run-dir", str(run), str(SCRIPT), fault],
                          capture_output=True, text=True, timeout=240, env=env and {**os.environ, **env})
    assert done.returncode == 0, done.stderr + (run / "logs" / "rank0.log").read_text()
    return run


def top(diagnosis):
    """The first finding about the run itself (other work on a shared machine may rank before it)."""
    return next(f for f in diagnosis["findings"] if f["check"] != "contended")


@pytest.mark.parametrize("fault, check", [
    ("data", "data_wait"), ("threads", "oversubscription"), ("straggler", "straggler"),
    ("rank0-eval", "rank0_alone"), ("eval", "evaluation_share"), ("checkpoint", "checkpoint_share"),
    ("no-sync", "no_sync_missing"), ("uneven", "uneven_shards"),
    ("comm", "exposed_communication"), ("small-batch", "small_batch"), ("collective", "host_sync_stalls")])
def test_a_planted_fault_is_the_top_finding_with_a_predicted_speedup(tmp_path, fault, check):
    diagnosis = diagnose(launch(tmp_path, fault))
    found = top(diagnosis)
    assert found["check"] == check, json.dumps(diagnosis["findings"], indent=1)
    assert found["predicted_speedup"] > 1.05      # a time finding, ranked by its predicted saving
    assert "code change" in found["remedy"] or "paratrain launch" in found["remedy"]


def test_the_scripts_own_collectives_are_charged_to_them_whole(tmp_path):
    # A blocking torch.distributed call waits inside itself (Work.wait): that wait is the script's
    # collective too, not the gradient all-reduce's exposed time.
    run = launch(tmp_path, "collective")
    phases = json.loads((run / "summary.json").read_text())["probe"]["phases_s"]
    assert phases["collective"] > phases["comm"], phases
    assert "every 50 steps" in top(diagnose(run))["remedy"]


def test_host_reads_are_counted_on_the_sync_device(tmp_path):
    # A CPU stand-in for a GPU's host-device syncs: the probe counts host reads of tensors on the device
    # PARATRAIN_PROBE_SYNC_DEVICE names (cuda unless set), here the CPU's.
    stand_in = {"PARATRAIN_PROBE_SYNC_DEVICE": "cpu"}      # ranks inherit launch's environment
    found = {f["check"]: f for f in diagnose(launch(tmp_path, "host-sync", env=stand_in))["findings"]}
    assert found["host_syncs"]["severity"] == "advice", json.dumps(found, indent=1)
    assert "3.0 reads of device tensors" in found["host_syncs"]["evidence"]
    healthy = {f["check"] for f in diagnose(launch(tmp_path, "healthy", env=stand_in))["findings"]}
    assert "host_syncs" not in healthy
    # on the default device (cuda, absent here) nothing is counted
    assert "host_syncs" not in {f["check"] for f in diagnose(launch(tmp_path / "gpu", "host-sync"))["findings"]}


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


def test_a_launched_script_without_optimizer_steps_is_refused_in_one_line(tmp_path):
    script = tmp_path / "no_steps.py"
    script.write_text("import torch\nprint(torch.ones(2).sum())\n")
    run = tmp_path / "run"
    subprocess.run([*PARATRAIN, "launch", "--run-dir", str(run), str(script)], check=True, capture_output=True)
    done = subprocess.run([*PARATRAIN, "doctor", str(run)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "saw no optimizer step" in done.stderr


def probed_run(tmp_path, ranks):
    """A run directory whose summary holds the probe block of `ranks` (seconds per step by phase)."""
    from paratrain.launch.probe import PHASES
    full = [{"rank": i, "steps": 100, "steady_steps": 90, "threads": 1, "cpu_affinity": 1, "ddp": True,
             "rounds_per_step": 1.0, "micro_per_step": 1.0, "data_cpu_s": 0.0, "checkpoint_steps": 0,
             "gradient_bytes": 2**20, "ddp_overhead_s": 0.0,
             **r, "phases_s": {p: r["phases_s"].get(p, 0.0) for p in PHASES},
             "step_s": sum(r["phases_s"].values())} for i, r in enumerate(ranks)]
    tmp_path.mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"script": "train.py", "workers": len(ranks), "resolved": {}}))
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "workers": len(ranks),
                                                       "breakdown": {"data_s": 0.0},
                                                       "probe": {"status": "on", "ranks": full, "phases_s": {
                                                           p: sum(r["phases_s"][p] for r in full) / len(full)
                                                           for p in PHASES}}}))
    return tmp_path


def test_predicted_gains_of_the_probed_checks_by_hand(tmp_path):
    from paratrain.doctor.evidence import read_run
    from paratrain.doctor import script_checks as sc

    # data: 40 ms a step of which 10 ms CPU, no spare core: the 30 ms of waiting overlaps -> 30/100.
    ev = read_run(probed_run(tmp_path / "a", [{"phases_s": {"data": 0.04, "forward": 0.03, "backward": 0.03},
                                               "data_cpu_s": 0.01}] * 2))
    assert sc.data_wait(ev).saving == pytest.approx(0.03 / 0.10)
    # exposed all-reduce: the least-waiting rank's 30 ms of a 100 ms step; k=4 is the first with comm <= 10 %
    # (30 / (4 x 70 + 30) = 9.7 %; k=2: 17.6 %): per 4 micro-steps 4 x 70 + 30 = 310 ms against 400 ms.
    ev = read_run(probed_run(tmp_path / "b", [{"phases_s": {"forward": 0.03, "backward": 0.04, "comm": 0.03}},
                                              {"phases_s": {"forward": 0.03, "backward": 0.02, "comm": 0.05}}]))
    assert sc.exposed_communication(ev).saving == pytest.approx(1 - 0.31 / 0.4)
    # four rounds per step, 40 ms exposed (least of the ranks): three of four go -> 30/100.
    ev = read_run(probed_run(tmp_path / "c", [{"phases_s": {"forward": 0.03, "backward": 0.03, "comm": 0.04},
                                               "rounds_per_step": 4.0, "micro_per_step": 4.0}] * 2))
    assert sc.all_reduce_every_micro_step(ev).saving == pytest.approx(0.03 / 0.10)
    # rank 1 works 80 ms against rank 0's 50 ms (which waits 30 ms): the 30 ms go -> 30/80 (mean step 80 ms).
    ev = read_run(probed_run(tmp_path / "d", [{"phases_s": {"forward": 0.05, "comm": 0.03}},
                                              {"phases_s": {"forward": 0.08}}]))
    assert sc.straggler(ev).saving == pytest.approx(0.03 / 0.08)
    # the waiting rank ran its forward slower (60 ms against the straggler's 40): with equal work each phase
    # takes the fastest rank's time, 40 ms, plus the all-reduce's own 5 ms (the straggler's comm), against the
    # mean step of 98 ms.
    ev = read_run(probed_run(tmp_path / "d2", [{"phases_s": {"forward": 0.06, "comm": 0.04}},
                                               {"phases_s": {"forward": 0.04, "other": 0.051, "comm": 0.005}}]))
    assert sc.straggler(ev).saving == pytest.approx(1 - 0.045 / 0.098)
    # ...but not when the other rank's own evaluation or checkpoint (here 12 ms of saving, against an excess of
    # 6 ms) explains why the waiting rank ran cold: the checkpoint check names that cause.
    ev = read_run(probed_run(tmp_path / "d3", [{"phases_s": {"forward": 0.016, "checkpoint": 0.012, "comm": 0.006}},
                                               {"phases_s": {"forward": 0.022, "comm": 0.012}}]))
    assert sc.straggler(ev) is None
    # rank 1 runs the same batch with forward (50 ms against 40) and backward (100 against 80) both 1.25x
    # slower: a slower core, not more work. The same model predicts the gain (40 + 80 + 5 ms of rank 1's
    # comm against the step of 155 ms); it is named slow_rank and ranked after the run's own findings.
    ev = read_run(probed_run(tmp_path / "d4", [
        {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}, "samples_per_step": 32.0},
        {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}, "samples_per_step": 32.0}]))
    slow = sc.straggler(ev)
    assert slow.check == "slow_rank" and "1.25x slower" in slow.finding
    assert slow.saving == pytest.approx(1 - 0.125 / 0.155)
    from paratrain.doctor import rank
    from paratrain.doctor.finding import Finding
    smaller = Finding("host_syncs", "", "", "", "", "", 0.05)
    assert [f.check for f in rank([slow, smaller])] == ["host_syncs", "slow_rank"]
    # ...but extra work in backward alone (forward as fast as the others'), or a bigger batch, is a straggler.
    for name, extra in (("d5", {"phases_s": {"forward": 0.04, "backward": 0.11, "comm": 0.005},
                                "samples_per_step": 32.0}),
                        ("d6", {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005},
                                "samples_per_step": 40.0})):
        ev = read_run(probed_run(tmp_path / name, [
            {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}, "samples_per_step": 32.0}, extra]))
        assert sc.straggler(ev).check == "straggler", name
    # rank 0 evaluates 40 ms a step alone on 2 ranks: sharded, half of it goes -> 20/100.
    ev = read_run(probed_run(tmp_path / "e", [{"phases_s": {"forward": 0.06, "eval": 0.04}},
                                              {"phases_s": {"forward": 0.06, "comm": 0.04}}]))
    found = sc.evaluation(ev)
    assert found.check == "rank0_alone" and found.saving == pytest.approx(0.02 / 0.10)
    # ...and when the steps holding that evaluation took 50 ms a step longer than plain ones, half of that goes.
    ev = read_run(probed_run(tmp_path / "e2", [{"phases_s": {"forward": 0.06, "eval": 0.04}, "eval_excess_s": 0.05},
                                               {"phases_s": {"forward": 0.06, "comm": 0.04}}]))
    assert sc.evaluation(ev).saving == pytest.approx(0.025 / 0.10)
    # checkpoints every 2 steps, 20 ms a step, on rank 0: every 100 steps keeps 2/100 of it -> 19.6/100.
    ev = read_run(probed_run(tmp_path / "f", [{"phases_s": {"forward": 0.08, "checkpoint": 0.02},
                                               "checkpoint_steps": 45}, {"phases_s": {"forward": 0.08, "comm": 0.02}}]))
    assert sc.checkpoints(ev).saving == pytest.approx(0.02 * (1 - 2 / 100) / 0.10)
    # threads: the layers ran 2x slower on 4 threads than on 1, a matrix product 1.5x: forward and backward's
    # 60 ms lose half, the optimizer's 20 ms a third -> (30 + 20/3)/100.
    ev = read_run(probed_run(tmp_path / "t", [{"phases_s": {"forward": 0.03, "backward": 0.03, "optimizer": 0.02,
                                                            "other": 0.02}, "threads": 4, "fair_threads": 1,
                                               "thread_penalty": 1.5, "layer_thread_penalty": 2.0}] * 2))
    assert sc.threads(ev).saving == pytest.approx((0.03 + 0.02 / 3) / 0.1)
    # small batch: 2 samples, the layers grow 1 ms a sample (timed at 2 and 32), so 2 of the 20 ms of forward and
    # backward grow (90 % fixed). With the 30 ms of data, 32 ms grow and 68 ms do not: k=8 is the first with
    # 68 / (100 + 7 x 32) <= 25 % (k=4: 35 %): 324 ms per 8 x 2 samples against 800 ms.
    small = {"samples_per_step": 2.0, "batch_slope_s": 0.001, "batch_slope_between": [2, 32]}
    ev = read_run(probed_run(tmp_path / "g", [{"phases_s": {"data": 0.03, "forward": 0.01, "backward": 0.01,
                                                            "comm": 0.03, "optimizer": 0.01, "other": 0.01},
                                               **small}] * 2))
    found = sc.small_batch(ev)
    assert found.saving == pytest.approx(1 - 0.324 / 0.8) and "batch_size=16 per rank (8x)" in found.remedy
    # ...no further than the timed range: without the data, 96 ms stay fixed and k stops at 32 / 2 = 16.
    ev = read_run(probed_run(tmp_path / "h", [{"phases_s": {"data": 0.002, "forward": 0.01, "backward": 0.01,
                                                            "comm": 0.05, "optimizer": 0.02, "other": 0.008},
                                               **small}] * 2))
    assert sc.small_batch(ev).saving == pytest.approx(1 - (0.1 + 15 * 0.004) / 1.6)
    # host syncs on a GPU rank: 10 reads a step, 30 ms of the 100 ms step waiting in them, the device's phases
    # 50 ms (CUDA events): the host's own 70 ms set the step without the reads -> 30/100. Without device
    # times: advice, no gain; and nothing when the device's phases alone take the whole step.
    sync = {"phases_s": {"forward": 0.05, "backward": 0.03, "other": 0.02}, "syncs_per_step": 10.0, "sync_wait_s": 0.03}
    ev = read_run(probed_run(tmp_path / "s", [{**sync, "device_phases_s": {"forward": 0.02, "backward": 0.03}}] * 2))
    assert sc.host_syncs(ev).saving == pytest.approx(0.3)
    found = sc.host_syncs(read_run(probed_run(tmp_path / "s2", [sync] * 2)))
    assert found.saving is None and found.severity == "advice"
    assert sc.host_syncs(read_run(probed_run(tmp_path / "s3", [{**sync, "device_phases_s": {"forward": 0.1}}] * 2))) is None
    # find_unused_parameters: DDP's forward took 3 ms beyond the model's of a 100 ms step. DDP saw no unused
    # parameter: a free remedy, named from 1 % -> 3/100; not knowing, only from 5 %; with unused ones, never.
    flag = {"phases_s": {"forward": 0.06, "backward": 0.04}, "find_unused_parameters": True, "ddp_overhead_s": 0.003}
    ev = read_run(probed_run(tmp_path / "u", [{**flag, "unused_parameter_bytes": 0}] * 2))
    assert sc.find_unused_parameters(ev).saving == pytest.approx(0.03)
    assert sc.find_unused_parameters(read_run(probed_run(tmp_path / "u2", [flag] * 2))) is None
    assert sc.find_unused_parameters(read_run(probed_run(tmp_path / "u3", [{**flag, "ddp_overhead_s": 0.006}] * 2))
                                     ).saving == pytest.approx(0.06)
    assert sc.find_unused_parameters(read_run(probed_run(tmp_path / "u4", [
        {**flag, "ddp_overhead_s": 0.02, "unused_parameter_bytes": 80}] * 2))) is None
    # a step that mostly grows with the batch is no small-batch problem: 2 x 30 ms of its 100 ms grow (40 % fixed).
    ev = read_run(probed_run(tmp_path / "i", [{"phases_s": {"forward": 0.04, "backward": 0.04, "comm": 0.02},
                                               **small, "batch_slope_s": 0.03}] * 2))
    assert sc.small_batch(ev) is None
    # ...while a step whose forward and backward grow but whose all-reduce does not is one: 88 ms of 100 fixed,
    # k = 16 (the timed range): 100 + 15 x 12 = 280 ms for 16 x 2 samples against 1,600 ms.
    ev = read_run(probed_run(tmp_path / "j", [{"phases_s": {"forward": 0.01, "backward": 0.01, "comm": 0.08},
                                               **small, "batch_slope_s": 0.006}] * 2))
    assert sc.small_batch(ev).saving == pytest.approx(1 - 0.28 / 1.6)


def test_gpus_idle_in_a_share_of_the_monitors_samples_are_named_as_a_symptom(tmp_path):
    # GPU samples as the monitor writes them from NVML (a stand-in: no GPU here): GPU 1 idle in 3 of 10.
    from paratrain.doctor import diagnose_run
    from paratrain.doctor.evidence import read_run
    run = probed_run(tmp_path / "run", [{"phases_s": {"forward": 0.05, "backward": 0.05}}] * 2)
    samples = [{"time": float(t), "kind": "gpu", "index": i, "utilization_percent": 2 if i == 1 and t < 3 else 95}
               for t in range(10) for i in (0, 1)]
    (run / "system.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    found = {f.check: f for f in diagnose_run(read_run(run))}["idle_devices"]
    assert found.finding == "GPU 1 idle 30% of the run" and found.severity == "advice", found
    # below the line (1 in 10), nothing
    samples = [{**s, "utilization_percent": 95} if s["index"] == 1 and s["time"] > 0 else s for s in samples]
    (run / "system.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert "idle_devices" not in {f.check for f in diagnose_run(read_run(run))}


def test_the_excess_of_steps_holding_an_evaluation_is_over_the_median_plain_step():
    from paratrain.launch.probe_summary import excess_s
    steps = [{"wall_s": w, "eval": e, "checkpoint": c} for w, e, c in
             [(0.010, 0, 0), (0.012, 0, 0), (0.011, 0, 0), (0.061, 0.03, 0), (0.031, 0, 0.01)]]
    # plain median 11 ms: the evaluating step is 50 ms over, the saving one 20 ms, over 5 steps
    assert excess_s(steps) == pytest.approx({"eval_excess_s": 0.050 / 5, "checkpoint_excess_s": 0.020 / 5})


def test_accumulation_runs_the_optimizer_once_per_optimizer_step():
    from paratrain.doctor.finding import accumulation
    # 70 ms per micro-step, 10 ms optimizer, 20 ms all-reduce: g=2 leaves 20/170 = 11.8 %, g=4 20/310 = 6.5 %.
    g, new, saving = accumulation(0.07, 0.01, 0.02)
    assert (g, new, saving) == (4, pytest.approx(0.31), pytest.approx(1 - 0.31 / 0.40))


def test_find_unused_parameters_is_named_when_ddp_found_every_parameter_used(tmp_path):
    # The fault catalogue's script (256 small linear layers, 192 samples a rank): DDP's logging data, read by
    # the probe, saw no unused parameter, so the flag is pure cost and named; with --fix it is off.
    script = Path(__file__).parents[1] / "benchmarks" / "doctor_faults" / "find_unused.py"
    runs = {}
    for fix in ([], ["--fix"]):
        run = tmp_path / ("fixed" if fix else "fault")
        subprocess.run([*PARATRAIN, "launch", "-n", "2", "--run-dir", str(run), str(script), "--steps", "40", *fix],
                       check=True, capture_output=True, timeout=240)
        runs[bool(fix)] = {f["check"]: f for f in diagnose(run)["findings"]}
    found = runs[False]["find_unused_parameters"]
    assert "DDP found no unused parameter" in found["evidence"] and found["predicted_speedup"] > 1.0, found
    assert "find_unused_parameters" not in runs[True]
