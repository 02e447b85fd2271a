"""The doctor on runs built to have one problem each (real ranks, real timings), and on a healthy run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import browser_page, synthetic

import paratrain
from paratrain.doctor import diagnose
from paratrain.reporting import write_report

CORES = len(os.sched_getaffinity(0))
SCRIPT = Path(__file__).parent / "doctor_script.py"
# Timing checks whose figures another process on the run's cores can inflate (a descheduled rank
# makes the other wait in the all-reduce); on a contended run they are the contention's, not the run's.
TIMING_CHECKS = {
    "exposed_communication",
    "host_sync_stalls",
    "straggler",
    "data_wait",
    "evaluation_share",
    "first_epoch_overhead",
}


def _checks(diagnosis):
    return [f["check"] for f in diagnosis["findings"]]


def _top(diagnosis):
    """The first finding about the run itself (other work on a shared machine may rank before it)."""
    return next(f for f in diagnosis["findings"] if f["check"] != "contended")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("doctor")
    made = {}
    # Logged at train's default interval: the suite's every 4 steps is host work the doctor rightly names on a
    # fast machine (CI at c68b1d7: 0.6 ms of a 4.0 ms step, 16 %, over host_sync_stalls' 15 %).
    made["healthy"] = synthetic(
        base, workers=2, synthetic_samples=4096, epochs=2, log_every=50, run_dir=base / "healthy"
    )
    made["oversubscribed"] = synthetic(
        base,
        workers=2,
        threads_per_worker=CORES,
        allow_oversubscribe=True,
        synthetic_samples=256,
        epochs=2,
        # sampled every 0.1 s: at the default 2 Hz a fast machine ended the run before the monitor read a rank
        # (CI at 7358c53: no timeline for the report test)
        monitor_hz=10,
        run_dir=base / "oversubscribed",
    )
    made["data_starved"] = dict(
        model="user_factories:tiny_net",
        dataset="doctor_factories:slow_pairs",
        num_classes=2,
        workers=1,
        threads_per_worker=1,
        epochs=2,
        batch_size=16,
        quiet=True,
        run_dir=base / "data_starved",
    )
    made["comm_heavy"] = synthetic(
        base,
        workers=2,
        model="doctor_factories:wide_mlp",
        synthetic_shape="3,8,8",
        synthetic_samples=128,
        batch_size=2,
        epochs=2,
        log_every=16,
        allreduce="backend",
        run_dir=base / "comm_heavy",
    )
    for cfg in made.values():
        paratrain.train(cfg)
    return {name: Path(cfg["run_dir"]) for name, cfg in made.items()}


def test_a_healthy_run_gets_nothing_to_fix(runs):
    diagnosis = diagnose(runs["healthy"])
    summary = json.loads((runs["healthy"] / "summary.json").read_text())
    if summary["machine_load"]["contended"]:
        # Other work on the run's cores shows up as waiting; only the contention itself may be reported.
        assert set(_checks(diagnosis)) <= {"contended"} | TIMING_CHECKS and _checks(diagnosis)[0] == "contended"
    else:
        # Start-up (the first epoch) is reported but is nothing to fix: its predicted gain is none.
        assert [f for f in diagnosis["findings"] if f["check"] != "first_epoch_overhead"] == [], diagnosis


def test_oversubscribed_ranks_are_diagnosed_with_the_fix_command(runs):
    diagnosis = diagnose(runs["oversubscribed"])
    top = diagnosis["findings"][0]
    assert top["check"] == "oversubscription"  # a root cause: first, whatever its predicted saving
    assert f"2 ranks x {CORES} threads = {2 * CORES} threads on {CORES} cores" in top["evidence"]
    assert (
        f"--threads-per-worker {max(1, CORES // 2)}" in top["remedy"] and "--allow-oversubscribe" not in top["remedy"]
    )
    assert top["remedy"].startswith("paratrain train ") and "--synthetic-samples 256" in top["remedy"]
    # The gain is a floor from what the run measured; a run the competing threads happened not to slow predicts none.
    assert top["saving"] is not None and top["saving"] >= 0 and "faster" in top["predicted_gain"]


def test_a_slow_user_dataset_is_diagnosed_as_data_wait(runs):
    diagnosis = diagnose(runs["data_starved"])
    top = _top(diagnosis)
    assert top["check"] == "data_wait" and top["saving"] > 0.5, diagnosis
    assert "doctor_factories:slow_pairs" in top["evidence"] and "--loader-workers 2" in top["remedy"]


def test_a_large_model_with_a_tiny_batch_is_diagnosed_as_communication_bound(runs):
    diagnosis = diagnose(runs["comm_heavy"])
    top = _top(diagnosis)
    assert top["check"] == "exposed_communication", diagnosis
    assert "--grad-accum" in top["remedy"] and "per sample" in top["predicted_gain"] and top["saving"] > 0.3
    assert "average through shared memory" in top["remedy"]  # gloo was asked for, on ranks with their own cores
    assert "small_device_batch" in _checks(diagnosis)  # the heuristic, ranked below the measured finding


def test_doctor_cli_prints_ranked_findings_and_json(runs):
    run = [sys.executable, "-m", "paratrain", "doctor"]
    text = subprocess.run([*run, str(runs["oversubscribed"])], capture_output=True, text=True)
    assert text.returncode == 0 and "\n1. [" in text.stdout and f"] {2 * CORES} threads compete for" in text.stdout
    assert "remedy:    paratrain train" in text.stdout
    data = json.loads(subprocess.run([*run, str(runs["comm_heavy"]), "--json"], capture_output=True, text=True).stdout)
    for f in data["findings"]:
        assert {"finding", "evidence", "cause", "remedy", "predicted_gain"} <= set(f)
    # read by a pager or `head` that has left before the report is written: no traceback for the closed pipe
    reader, writer = os.pipe()
    os.close(reader)
    piped = subprocess.run([*run, str(runs["oversubscribed"])], stdout=writer, stderr=subprocess.PIPE, text=True)
    os.close(writer)
    assert piped.returncode == 1 and piped.stderr == "", piped.stderr


def test_exact_remedies_whose_cost_hides_in_the_all_reduce_come_first():
    # An all-reduce on every micro-step is fixed by no_sync() without changing the training; the small-batch
    # finding counts those all-reduces as fixed cost, so it predicts more (1.61x) but is ranked second.
    from paratrain.doctor import rank, verdict
    from paratrain.doctor.finding import Finding

    small = Finding("small_batch", "8 samples per rank", "", "", "", "1.61x faster per sample: ...", 0.38)
    no_sync = Finding("no_sync_missing", "gradients are all-reduced 4 times", "", "", "", "1.53x faster: ...", 0.35)
    comm = Finding("exposed_communication", "20% all-reduce", "", "", "", "1.32x faster per sample: ...", 0.24)
    unused = Finding("find_unused_parameters", "DDP searches the graph", "", "", "", "1.02x faster: ...", 0.02)
    assert [f.check for f in rank([small, no_sync])] == ["no_sync_missing", "small_batch"]
    assert [f.check for f in rank([comm, unused])] == ["find_unused_parameters", "exposed_communication"]
    assert verdict(rank([small, no_sync])).startswith("2 problem(s) costing time; fix first: gradients are all-reduced")
    assert verdict([comm]).startswith("1 problem(s) costing time; the biggest: 20% all-reduce")


def test_a_remedy_that_changes_the_global_batch_comes_after_exact_remedies_that_save_a_tenth():
    """A larger batch shares out whatever a step pays once, a histogram written every step among it, so its
    predicted gain can be the largest; the exact remedy of the cause (write it every 50 steps) comes first when it
    saves a tenth of the step or more. Below a tenth, from the machine (a slow core) or a bound on time no check
    explains, the batch keeps its place."""
    from paratrain.doctor import rank
    from paratrain.doctor.finding import Finding

    small = Finding("small_batch", "8 samples", "", "", "", "5.13x", 0.81, global_batch_factor=16)
    late = Finding("straggler", "rank 0 is a straggler", "", "", "", "4.20x", 0.76)
    collectives = Finding("model_collectives", "metric collectives", "", "", "", "1.11x", 0.10)
    python = Finding("unexplained_other", "9 % between the phases", "", "", "", "1.10x", 0.09)
    bound = Finding("unexplained_other", "30 % between the phases", "", "", "", "up to 1.43x", 0.30, bound=True)
    slow = Finding("slow_rank", "rank 1's core is slower", "", "", "", "1.5x", 0.33)
    assert [f.check for f in rank([small, late])] == ["straggler", "small_batch"]
    assert [f.check for f in rank([small, collectives])] == ["model_collectives", "small_batch"]
    assert [f.check for f in rank([small, python])] == ["small_batch", "unexplained_other"]
    assert [f.check for f in rank([small, slow])] == ["small_batch", "slow_rank"]
    assert [f.check for f in rank([small, bound])] == ["small_batch", "unexplained_other"]
    # two batch findings keep their order by saving among themselves, after the exact one
    comm = Finding("exposed_communication", "20% all-reduce", "", "", "", "1.32x", 0.24, global_batch_factor=4)
    assert [f.check for f in rank([comm, small, late])] == ["straggler", "small_batch", "exposed_communication"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """A user's DDP script under `paratrain launch` whose rank 1 is slowed in every step and whose
    rank 0 then evaluates alone while rank 1 waits at a barrier."""
    from paratrain.launch.script import launch_script

    run_dir = tmp_path_factory.mktemp("launched") / "run"
    summary = launch_script(
        dict(
            script=SCRIPT,
            script_args=["straggler,rank0-eval", "150"],
            workers=2,
            threads_per_worker=1,
            run_dir=run_dir,
            monitor_hz=10,
        )
    )
    assert summary["status"] == "completed", summary
    return diagnose(run_dir)


def test_a_slowed_rank_of_a_launched_script_is_named_as_the_straggler(launched):
    found = {f["check"]: f for f in launched["findings"]}
    assert found["straggler"]["finding"].startswith("rank 1 is a straggler"), launched
    assert found["straggler"]["saving"] > 0


def test_evaluation_on_rank_0_only_is_seen_in_the_monitor_samples(launched):
    found = {f["check"]: f for f in launched["findings"]}
    alone = found["rank0_alone"]
    assert alone["finding"].startswith("rank 0 works alone") and "evaluate on every rank" in alone["remedy"], launched
    assert alone["remedy"].endswith(
        f"paratrain launch -n 2 --threads-per-worker 1 --run-dir {launched['path']}-fixed "
        f"{SCRIPT} straggler,rank0-eval 150"
    )


def test_doctor_refuses_what_it_cannot_diagnose(tmp_path):
    no_steps = tmp_path / "no-steps"
    no_steps.mkdir()
    (no_steps / "config.json").write_text(json.dumps({"workers": 2}))
    (no_steps / "summary.json").write_text(json.dumps({"status": "completed", "workers": 2}))
    for path, message in ((tmp_path, "is not a paratrain run"), (no_steps, "has no steps to diagnose")):
        proc = subprocess.run([sys.executable, "-m", "paratrain", "doctor", str(path)], capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1 and not proc.stdout


FAILED = {"status": "failed", "error": "rank 1 failed: RuntimeError: out of memory (see run/logs/rank1.log)"}


def test_a_failed_run_is_said_to_have_failed_first_with_its_cause_then_what_its_steps_show(tmp_path):
    """A run whose rank 1 failed in its second epoch: the failure and its cause first, then the findings of the
    epoch it finished (half of each step waiting for data); a launched script whose rank failed before any
    step: the failure alone, not a refusal."""
    config = {"workload": "cifar10-cnn", "workers": 2, "batch_size": 32, "resolved": {"device": "cpu"}}
    run = _fake_run(tmp_path / "run", config, {**FAILED, "workers": 2})
    waiting = {"data_s": 0.05, "compute_s": 0.04, "comm_s": 0.0, "optimizer_s": 0.005, "other_s": 0.005}
    epoch = {"event": "epoch", "epoch": 1, "step": 40, "epoch_time_s": 4.0, "breakdown": waiting}
    (run / "metrics.jsonl").write_text(json.dumps(epoch) + "\n")
    diagnosis = diagnose(run)
    first = diagnosis["findings"][0]
    assert first["check"] == "run_failed" and first["severity"] == "high", diagnosis
    assert first["finding"] == f"the run failed: {FAILED['error']}"
    assert first["evidence"] == "summary.json: status failed; 1 epoch(s) finished before it ended"
    assert first["remedy"].startswith("fix what the log its error names shows, then run it again: paratrain train ")
    assert diagnosis["verdict"].startswith(f"the run failed: {FAILED['error']}; in the steps it finished: ")
    assert "data_wait" in _checks(diagnosis)[1:]

    launched = {**FAILED, "workers": 2, "exit_code": 1, "failed_rank": 1, "probe": {"status": "no data"}}
    before = _fake_run(tmp_path / "before", {"script": "train.py", "workers": 2, "resolved": {}}, launched)
    proc = subprocess.run([sys.executable, "-m", "paratrain", "doctor", str(before)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[0].endswith(
        f"the run failed before any step finished: {FAILED['error']}; nothing else to diagnose"
    )
    assert (
        f"remedy:    fix what {before}/logs/rank1.log shows, then run it again: paratrain launch -n 2 " in proc.stdout
    )


def test_the_run_report_opens_with_the_verdict_and_the_doctor_in_a_browser(runs, tmp_path):
    page_path = write_report([runs["oversubscribed"]], tmp_path / "run.html")
    with browser_page(page_path) as page:
        headline = page.evaluate("document.querySelector('#verdict .headline').innerText")
        assert headline.startswith(f"2 worker(s) (ddp, {CORES} core(s) each): ") and "samples/s" in headline
        doctor = page.evaluate("document.querySelector('#doctor').innerText")
        assert f"fix first: {2 * CORES} threads compete for {CORES} cores" in doctor
        first = page.evaluate("document.querySelector('#doctor li').innerText")
        assert "remedy: paratrain train" in first and f"--threads-per-worker {max(1, CORES // 2)}" in first
        # the verdict comes before the evidence, and the monitor's timelines are drawn with each rank's idle share
        order = page.evaluate("[...document.querySelectorAll('#verdict, h2')].map(e => e.id || e.innerText)")
        assert order[0] == "verdict" and "Devices over time" in order
        assert re.search(r"rank 0 \d+%, rank 1 \d+%", page.evaluate("document.querySelector('#idle').innerText"))
        text = page.evaluate("document.body.innerText")
        assert not re.search(r"\d\.\d{5,}", text), "numbers as a person writes them, not floats to many places"


# -- the rules on hand-made evidence (their logic, not a measurement) --------------------------


def _fake_run(path: Path, config: dict, summary: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "summary.json").write_text(json.dumps({"status": "completed", **summary}))
    return path


def test_batch_and_learning_rate_rules_name_their_sources(tmp_path):
    """8 workers x 256 on 50,000 samples: global batch 2048 > sqrt(N) = 224, the LR scaled 64x with no
    warmup, and a single epoch whose throughput includes start-up."""
    run = _fake_run(
        tmp_path / "big",
        {
            "workers": 8,
            "batch_size": 256,
            "lr": 0.1,
            "lr_scaling": "linear",
            "epochs": 1,
            "warmup_epochs": 0.0,
            "resolved": {
                "global_batch_size": 2048,
                "reference_batch_size": 32,
                "train_samples": 50000,
                "device": "cpu",
            },
        },
        {
            "workers": 8,
            "batch_size": 256,
            "global_batch_size": 2048,
            "grad_accum": 1,
            "epoch_times_s": [9.0],
            "breakdown": {"data_s": 0.001, "compute_s": 0.1, "comm_s": 0.01, "optimizer_s": 0.01, "other_s": 0.001},
        },
    )
    found = {f["check"]: f for f in diagnose(run)["findings"]}
    assert set(found) == {"global_batch_sqrt_n", "no_warmup", "first_epoch_overhead"}
    assert "--batch-size 27" in found["global_batch_sqrt_n"]["remedy"]  # floor(sqrt(50000)) // 8
    assert "64x the base LR" in found["no_warmup"]["finding"] and "--warmup-epochs 0.25" in found["no_warmup"]["remedy"]
    assert all(f["saving"] is None for f in found.values())  # advice, ranked after time findings


def test_remedies_that_move_the_global_batch_opposite_ways_speak_with_one_voice(tmp_path):
    """The case seen: 2 workers x 128 on N = 5,000 samples, half of every step in the all-reduce. The
    communication's --grad-accum 8 (8x the global batch) and the sqrt(N) rule's --batch-size 35 (under
    sqrt(5,000) = 70) cannot both be taken: the remedy with a predicted gain stays, says what the other warned
    of, and the other is listed as dropped, with why."""
    from paratrain.doctor import format_text

    half = {"data_s": 0.005, "compute_s": 0.04, "comm_s": 0.05, "optimizer_s": 0.004, "other_s": 0.001}
    run = _fake_run(
        tmp_path / "run",
        {"workers": 2, "batch_size": 128, "resolved": {"global_batch_size": 256, "train_samples": 5000}},
        {"workers": 2, "batch_size": 128, "global_batch_size": 256, "grad_accum": 1, "breakdown": half},
    )
    diagnosis = diagnose(run)
    assert _checks(diagnosis) == ["exposed_communication"], diagnosis
    kept = diagnosis["findings"][0]
    assert "--grad-accum 8" in kept["remedy"] and "--batch-size 35" not in kept["remedy"].split("[one voice")[0]
    assert (
        "[one voice: global_batch_sqrt_n's remedy (--batch-size 35) would shrink the global batch instead, and is "
        "dropped: exposed_communication predicts "
    ) in kept["remedy"]
    assert kept["remedy"].endswith("it said: global batch 256 exceeds the sqrt(N) = 71 guidance]")
    [dropped] = diagnosis["dropped"]
    assert dropped["check"] == "global_batch_sqrt_n" and dropped["dropped_for"] == "exposed_communication"
    assert dropped["why"].endswith("global_batch_sqrt_n is advice with no predicted gain")
    assert "dropped, contradicting exposed_communication's remedy: global batch 256 exceeds" in format_text(diagnosis)


def test_one_voice_keeps_remedies_that_agree_and_drops_each_that_pulls_the_other_way():
    from paratrain.doctor import one_voice
    from paratrain.doctor.finding import Finding

    def finding(check, factor, saving):
        return Finding(
            check, check, "", "", f"{check} remedy", f"{check} gain: ...", saving, global_batch_factor=factor
        )

    grow, other, also, shrink, less = (
        finding("grow", 4.0, 0.4),
        finding("other", None, 0.3),
        finding("also", 2.0, 0.1),
        finding("shrink", 0.5, 0.05),
        finding("less", 0.25, None),
    )
    kept, dropped = one_voice([grow, other, also, shrink, less])
    assert [f.check for f in kept] == ["grow", "other", "also"]
    assert [(d["check"], d["why"]) for d in dropped] == [
        ("shrink", "grow predicts grow gain against shrink gain for shrink"),
        ("less", "grow predicts grow gain, less is advice with no predicted gain"),
    ]
    assert grow.remedy.count("[one voice: ") == 2 and "[one voice" not in also.remedy
    # the first in rank order sets the direction, whichever it is
    assert [f.check for f in one_voice([finding("s", 0.5, None), finding("g", 2.0, None)])[0]] == ["s"]


def test_weak_scaling_without_lr_scaling_is_a_study_finding(tmp_path):
    rows = []
    for n in (1, 2, 4):
        run = _fake_run(tmp_path / f"w{n}", {"workers": n, "lr_scaling": "none", "resolved": {}}, {"workers": n})
        rows.append(
            {
                "workload": "cifar10-cnn",
                "workers": n,
                "point": "scaling",
                "samples_per_s": 100.0 * n,
                "global_batch_size": 32 * n,
                "lr": 0.01,
                "val_accuracy": 0.6 - 0.05 * n,
                "speedup": n * 0.9,
                "efficiency": 0.9,
                "run_dir": str(run),
            }
        )
    study = tmp_path / "study"
    study.mkdir()
    (study / "scaling.json").write_text(json.dumps({"mode": "weak", "rows": rows}))
    found = {f["check"]: f for f in diagnose(study)["findings"]}
    assert (
        list(found) == ["lr_not_scaled"]
        and "grew the global batch 4x but not the LR" in found["lr_not_scaled"]["finding"]
    )
    assert "--lr-scaling linear" in found["lr_not_scaled"]["remedy"]


def test_a_sweep_whose_best_batch_is_below_the_throughput_knee(tmp_path):
    def trial(number, batch, rate, accuracy):
        return {
            "number": number,
            "state": "COMPLETE",
            "params": {"batch_size": batch},
            "run_dir": None,
            "value": accuracy,
            "metrics": {"val_accuracy": accuracy, "samples_per_s": rate, "time_s": 60000 / rate},
        }

    # the knee: the smallest batch within 5 % of the best samples/s (2800 is 6.7 % below 3000, 2900 3.3 %)
    trials = [trial(0, 8, 900, 0.70), trial(1, 32, 2800, 0.66), trial(2, 64, 2900, 0.64), trial(3, 128, 3000, 0.60)]
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(
        json.dumps({"name": "batch", "trials": trials, "best": trials[0], "metric": ["val_accuracy"]})
    )
    found = diagnose(sweep)["findings"]
    assert [f["check"] for f in found] == ["batch_below_knee"]
    assert "below the throughput knee (64)" in found[0]["finding"] and "3.22x faster" in found[0]["predicted_gain"]


def test_a_sweep_whose_best_batch_is_the_smallest_it_tried_is_told_to_look_beyond(tmp_path):
    """sweep.json as `paratrain sweep` writes it (its space as SearchSpace.to_dict gives it): bits/byte, lower
    is better, best at batch 8, the smallest of 8, 16 and 32. The doctor names the edge and a value beyond."""
    from paratrain.sweep.space import parse_space

    space = parse_space(
        {
            "algorithm": "grid",
            "spec": {"metric": "val_bits_per_byte", "objective": "minimize"},
            "parameters": {"batch_size": {"type": "discrete", "values": [8, 16, 32]}},
        }
    )
    trials = [
        {"number": n, "state": "COMPLETE", "params": {"batch_size": b}, "value": v, "metrics": {"val_bits_per_byte": v}}
        for n, (b, v) in enumerate([(8, 3.59), (16, 3.76), (32, 4.06)])
    ]
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(
        json.dumps(
            {
                "name": "batch",
                "trials": trials,
                "best": trials[0],
                "metric": ["val_bits_per_byte"],
                "objective": ["minimize"],
                "space": space.to_dict(),
            }
        )
    )
    found = diagnose(sweep)["findings"]
    assert [f["check"] for f in found] == ["best_at_edge"]
    assert found[0]["finding"] == "the best trial's batch_size, 8, is at the smallest end of the space"
    assert "(e.g. 4)" in found[0]["remedy"] and found[0]["severity"] == "advice"


def test_headlines_say_against_what_and_whether_it_pays_off():
    from paratrain.reporting.verdict import judge, study_verdict, sweep_verdict
    from paratrain.runs.records import SweepResult

    assert [judge(1.05, 0.0), judge(0.9, 0.0), judge(1.5, -2.0), judge(1.5, -0.5)] == [
        "does not pay off (less than 10% faster)",
        "does not pay off (slower)",
        "faster, but it costs accuracy",
        "pays off",
    ]
    rows = [
        {
            "workload": "w",
            "workers": 1,
            "threads_per_worker": 1,
            "point": "scaling",
            "speedup": 1.0,
            "efficiency": 1.0,
            "val_accuracy": 0.5,
        },
        {
            "workload": "w",
            "workers": 2,
            "threads_per_worker": 1,
            "point": "scaling",
            "speedup": 1.84,
            "efficiency": 0.92,
            "val_accuracy": 0.487,
            "speedup_vs_all_cores": 1.3,
        },
        {
            "workload": "w",
            "workers": 1,
            "threads_per_worker": 2,
            "point": "all_cores_reference",
            "speedup": 1.4,
            "efficiency": 0.7,
            "val_accuracy": 0.5,
        },
    ]
    assert study_verdict(_study(rows)) == [
        "w: 2 workers are 1.30x faster than one process on all 2 cores, 92% efficiency against 1 worker(s) x 1 "
        "core(s), accuracy -1.3 points: faster, but it costs accuracy"
    ]
    trials = [
        {"number": i, "state": "COMPLETE", "params": {"batch_size": b}, "metrics": {"val_accuracy": a, "time_s": t}}
        for i, (b, a, t) in enumerate([(16, 0.62, 40.0), (16, 0.60, 44.0), (64, 0.55, 12.0)])
    ]
    lines = sweep_verdict(
        SweepResult(
            name="batch",
            **{
                "trials": trials,
                "best": {**trials[0], "value": 0.62},
                "metric": ["val_accuracy"],
                "space": {"parameters": {"batch_size": {}}},
            },
        )
    )
    assert lines == [
        "best: trial 0 (batch_size=16): val_accuracy 62.0% in 40.0 s",
        "batch_size 16 -> 64: val_accuracy 61.0% -> 55.0%, trial time 42.0 s -> 12.0 s (means over completed trials)",
    ]


def test_a_contended_reference_or_disagreeing_comparisons_headline_no_gain():
    """#27: on a busy machine the all-cores reference (one process, 2 threads) ran 6x slower than one
    core, and the report opened with "4.99x faster ... pays off" while 2 workers were 0.84x of one."""
    from paratrain.reporting.verdict import study_verdict

    def rows(reference_flags=(), top_flags=(), vs_base=0.84, vs_all=4.99):
        return _study(
            [
                {
                    "workload": "w",
                    "workers": 1,
                    "threads_per_worker": 1,
                    "point": "scaling",
                    "speedup": 1.0,
                    "efficiency": 1.0,
                    "val_accuracy": 0.5,
                    "flags": [],
                },
                {
                    "workload": "w",
                    "workers": 2,
                    "threads_per_worker": 1,
                    "point": "scaling",
                    "speedup": vs_base,
                    "efficiency": vs_base / 2,
                    "val_accuracy": 0.5,
                    "speedup_vs_all_cores": vs_all,
                    "flags": list(top_flags),
                },
                {
                    "workload": "w",
                    "workers": 1,
                    "threads_per_worker": 2,
                    "point": "all_cores_reference",
                    "speedup": vs_base / vs_all,
                    "efficiency": 0.1,
                    "val_accuracy": 0.5,
                    "flags": list(reference_flags),
                },
            ]
        )

    rerun = "rerun paratrain scale with the same flags on an idle machine, with --repeats 3"
    (line,) = study_verdict(rows(reference_flags=["contended"]))
    assert (
        line.startswith(
            "w: can't tell: the reference one process on all 2 cores was slowed by other work; "
            "against 1 worker(s) x 1 core(s): 0.84x;"
        )
        and rerun in line
    )
    assert "pays off" not in line and "4.99" not in line
    (line,) = study_verdict(rows(top_flags=["contended"], vs_base=1.5, vs_all=1.4))
    assert (
        line.startswith(
            "w: can't tell: the 2-worker run was slowed by other work; measured against 1 worker(s) x "
            "1 core(s): 1.50x; against one process on all 2 cores: 1.40x;"
        )
        and "pays off" not in line
    )
    # No contention, but the two comparisons point different ways: no verdict either.
    (line,) = study_verdict(rows())
    assert (
        line.startswith(
            "w: can't tell: the comparisons disagree (against 1 worker(s) x 1 core(s): 0.84x; against "
            "one process on all 2 cores: 4.99x)"
        )
        and rerun in line
    )
    # Clean and consistent rows still get their verdict.
    (line,) = study_verdict(rows(vs_base=1.8, vs_all=1.5))
    assert line.endswith("accuracy +0.0 points: pays off")


def test_one_rank_leading_in_one_sample_of_a_short_run_is_no_straggler():
    """A rank busier than the others at one monitor instant is chance; at several instants of many, a
    straggler. (A healthy CI run had rank 0 lead in 1 of 6 samples and was told to fix it.)"""
    from paratrain.doctor.checks import straggler
    from paratrain.doctor.evidence import RunEvidence
    from paratrain.runs.records import Summary

    def evidence(leads: int, samples: int) -> RunEvidence:
        system = [
            {"kind": "rank", "rank": rank, "time": t * 0.5, "cpu_percent": 100.0 if rank == 0 or t >= leads else 60.0}
            for t in range(samples)
            for rank in (0, 1)
        ]
        return RunEvidence(Path("run"), {}, Summary(status="completed", workers=2), [], system)

    assert straggler(evidence(1, 6)) is None
    found = straggler(evidence(4, 12))
    assert found is not None and found.finding.startswith("rank 0 is a straggler")


def _study(rows):
    """A scaling.json as its record, the fields the verdict does not read filled in."""
    from paratrain.runs.records import Study

    return Study.model_validate({"mode": "weak", "rows": [{"samples_per_s": 100.0, **r} for r in rows]})
