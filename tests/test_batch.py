"""find-batch, noise-scale, lr-find: each recovers an answer known in advance (tests/batch_factories.py)."""

import itertools
import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from batch_factories import PLANTED_GIB_PER_SAMPLE, exact_b_simple, regression_tensors

from paratrain.batch.find_batch import binsearch, knee
from paratrain.batch.noise_scale import read_norms
from paratrain.cli import main
from paratrain.reporting import write_report

# Linear regression at w = 0 that barely moves (lr 1e-7), so every step sees the same B_simple.
REGRESSION = dict(
    model="batch_factories:zero_linear",
    dataset="batch_factories:regression_data",
    loss="batch_factories:half_squared_error",
    device="cpu",
    threads_per_worker=1,
    lr=1e-7,
    log_every=100,
)


def _run(capsys, command, out, **flags):
    """The command through the CLI (its printing included); its JSON result and what it printed."""
    argv = [command, "--out", str(out)]
    for name, value in flags.items():
        argv += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    assert main(argv) == 0
    printed = capsys.readouterr().out
    return json.loads((out / f"{command.replace('-', '_')}.json").read_text()), printed


@pytest.mark.parametrize(
    "layout",
    [
        dict(workers=1, batch_size=16, grad_accum=4),
        dict(workers=2, batch_size=32),
        dict(workers=2, batch_size=32, strategy="fsdp"),
        # HSDP: 2 replicas of 2 shards (4 ranks on 2 cores: a correctness test).
        dict(workers=4, batch_size=16, strategy="fsdp", dp_replicate=2, allow_oversubscribe=True),
        # #58: a rank's small batch is its 3 accumulated micro-batches (48), the big one the global 96; a rank's
        # 256 micro-batches end each epoch in a step of one, which is not recorded
        dict(workers=2, batch_size=16, grad_accum=3),
    ],
    ids=[
        "one-worker-accumulation",
        "two-ranks-comm-hook",
        "two-ranks-fsdp-reduce-scatter",
        "four-ranks-hsdp",
        "two-ranks-accumulation",
    ],
)
def test_noise_scale_recovers_a_known_b_simple(tmp_path, capsys, layout):
    result, printed = _run(capsys, "noise-scale", tmp_path, steps=300, ema_steps=300, **REGRESSION, **layout)
    assert "critical batch" in printed
    exact = exact_b_simple()
    assert 30 < exact < 100  # the problem is built so: d(1 + σ²) + 1 with d = 32, σ = 1 (about 65)
    assert result["b_simple_run"] == pytest.approx(exact, rel=0.2), (result["b_simple_run"], exact)
    assert result["b_simple"] == pytest.approx(exact, rel=0.2), (result["b_simple"], exact)
    assert result["b_simple_stderr"] < 0.2 * exact
    summary = json.loads((tmp_path / "noise-scale-run" / "summary.json").read_text())
    if layout.get("strategy") == "fsdp":
        # Each rank's gradient as the reduce-scatter takes it; the averaged shards summed over the ranks.
        assert summary["grad_noise"]["source"].startswith(f"fsdp {summary['allreduce']}: each rank's gradient")
    elif layout["workers"] == 2:
        # The measurement wraps whichever hook averaged the gradients and says which it was.
        assert summary["grad_noise"]["source"] == f"ddp comm hook around the {summary['allreduce']} average"
    if layout["workers"] > 1:
        workers = layout["workers"]
        global_batch = workers * layout["batch_size"] * layout.get("grad_accum", 1)
        assert (result["small_batch"], result["big_batch"], result["ranks"]) == (
            global_batch // workers,
            global_batch,
            workers,
        )
        assert len(list((tmp_path / "noise-scale-run" / "grad_noise").glob("rank*.jsonl"))) == workers
    else:
        assert summary["grad_noise"]["source"].startswith("gradient accumulation")
        assert (result["small_batch"], result["big_batch"]) == (16, 64)
    # every step recorded is of the batches the estimate is told
    recorded = {(n["small_batch"], n["big_batch"]) for n in read_norms(tmp_path / "noise-scale-run")}
    assert recorded == {(result["small_batch"], result["big_batch"])}
    assert result["steps"] == 300
    assert result["curve"][0]["steps_vs_min"] == pytest.approx(1 + result["b_simple"])
    assert write_report([tmp_path]).read_text().count("<img") == 1  # noise scale over steps, and the curve


def test_noise_scale_leaves_out_an_epochs_last_step_of_fewer_micro_steps(tmp_path, capsys):
    """#58: 48 samples in batches of 16 are 3 micro-steps an epoch: one step of 2, then one of 1. That last step
    was recorded as a small and a big batch of 16 alike, and the estimate divided by their difference, 0
    (ZeroDivisionError). It is not recorded now (grad_noise.py), and noise-scale runs as many more steps."""
    small = dict(workload="synthetic-cnn", synthetic_samples=48, synthetic_shape="3,16,16", batch_size=16)
    result, _ = _run(capsys, "noise-scale", tmp_path, steps=20, device="cpu", threads_per_worker=1, **small)
    norms = read_norms(tmp_path / "noise-scale-run")
    assert [n["step"] for n in norms] == list(range(1, 40, 2))  # every epoch's first step, 20 epochs
    assert {(n["small_batch"], n["big_batch"]) for n in norms} == {(16, 32)} and result["steps"] == 20


def test_binsearch_finds_every_planted_limit_exactly_in_few_probes():
    for limit in range(1, 130):
        probed = []
        largest, failed = binsearch(
            lambda batch, probed=probed, limit=limit: probed.append(batch) or batch <= limit, 1, cap=100
        )
        assert (largest, failed) == ((limit, limit + 1) if limit < 100 else (100, None))
        assert len(probed) == len(set(probed)) <= 2 * math.ceil(math.log2(limit + 1)) + 1, (limit, probed)


def test_find_batch_finds_a_planted_memory_limit_exactly(tmp_path, capsys):
    # Real probes (2: a probe is a rank process of its own); the bisection is checked above for every limit.
    largest = 1  # the limit leaves room for 1 planted GiB plus the rank's own < 0.9 GiB
    result, printed = _run(
        capsys,
        "find-batch",
        tmp_path,
        probe_steps=3,
        model="batch_factories:planted_memory",
        workload="synthetic-cnn",
        synthetic_shape="3,4,4",
        synthetic_samples=64,
        device="cpu",
        threads_per_worker=1,
        memory_limit=f"{largest * PLANTED_GIB_PER_SAMPLE + 0.9}G",
    )
    assert f"largest batch that fits: {largest}" in printed
    assert (result["max_batch"], result["first_failed"], result["limited_by"]) == (largest, largest + 1, "memory")
    assert [(p["batch"], p["fits"]) for p in result["probes"]] == [(1, True), (2, False)]
    assert result["safe_batch"] == 1  # never below 1, margin or not
    assert all(p["samples_per_s"] > 0 and p["peak_memory_bytes"] > 0 for p in result["probes"] if p["fits"])
    assert json.loads((tmp_path / "find_batch.json").read_text())["max_batch"] == largest
    assert not list(Path(tempfile.gettempdir()).glob("paratrain-find-batch-*"))  # the probes' run directories are gone
    assert write_report([tmp_path]).read_text().count("<img") == 1  # samples/s and memory against batch


def test_knee_is_the_smallest_batch_within_five_percent_of_the_best():
    curve = [(1, 100.0), (2, 190.0), (4, 350.0), (8, 600.0), (16, 640.0), (32, 660.0), (64, 650.0)]
    assert knee(curve) == 16  # 640 >= 0.95 x 660 = 627; 600 is not
    assert knee(curve, within=0.10) == 8
    assert knee([(8, 10.0)]) == 8


def test_lr_find_suggests_an_lr_in_the_stable_range_of_a_convex_problem(tmp_path, capsys):
    x, _ = regression_tensors()
    stable_below = 2 / torch.linalg.eigvalsh(x.T @ x / len(x)).max().item()  # gradient descent on ½|Xw − y|²/N
    train = {**REGRESSION, "batch_size": 256, "momentum": 0.0}
    del train["lr"]
    result, printed = _run(capsys, "lr-find", tmp_path, steps=100, lr_min=1e-4, lr_max=10.0, **train)
    assert f"suggested LR {result['suggested_lr']:.3g}" in printed
    assert stable_below / 100 < result["suggested_lr"] < stable_below, (result["suggested_lr"], stable_below)
    assert result["diverged_at_lr"] is not None and result["diverged_at_lr"] > stable_below / 2
    lrs = [row["lr"] for row in result["curve"]]
    assert lrs[0] == pytest.approx(1e-4) and all(b > a for a, b in itertools.pairwise(lrs))
    # the same command again into the same --out replaces its own measurement run
    again, _ = _run(capsys, "lr-find", tmp_path, steps=100, lr_min=1e-4, lr_max=10.0, **train)
    assert again["suggested_lr"] == pytest.approx(result["suggested_lr"])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["noise-scale", "--steps", "5"], "at least 20"),
        (["lr-find", "--lr-min", "1", "--lr-max", "0.1"], "must be below --lr-max"),
        (
            ["find-batch", "--workload", "synthetic-cnn", "--synthetic-samples", "64", "--memory-limit", "64K"],
            "below the model's own state",
        ),
        (
            [
                "find-batch",
                "--model",
                "batch_factories:planted_memory",
                "--workload",
                "synthetic-cnn",
                "--synthetic-shape",
                "3,4,4",
                "--synthetic-samples",
                "64",
                "--memory-limit",
                "768M",
                "--threads-per-worker",
                "1",
            ],
            "does not run at batch 1",
        ),
        (["recommend", "--workers", "2", "--lr-steps", "5"], "--lr-steps 5 is too few"),
        (["recommend", "--workers", "2", "--strategy", "fsdp", "--precision", "fp16"], "--grad-noise reads gradients"),
        (["recommend", "--workers", "2", "--max-batch-size", "64"], "chooses --max-batch-size itself"),
        (
            ["recommend", "--workers", "2", "--batch-schedule", "adaptive", "--max-global-batch", "16"],
            "--max-global-batch 16 leaves no room",
        ),
    ],
    ids=[
        "too-few-steps",
        "lr-range-reversed",
        "limit-below-model",
        "not-even-batch-1",
        "recommend-too-few-lr-steps",
        "recommend-a-precision-noise-scale-refuses",
        "recommend-chooses-the-per-rank-limit",
        "recommend-a-growth-the-run-refuses",
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    code = main([*argv, "--device", "cpu", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err
    assert not out.exists()


def _probes(samples_per_s: dict[int, float]) -> list[dict]:
    """find-batch's probe rows as it writes them: batch -> measured samples/s."""
    return [{"batch": b, "fits": True, "samples_per_s": rate} for b, rate in samples_per_s.items()]


# A throughput curve with its knee at 16 (within 5 % of the best from there on).
KNEE_16 = _probes({1: 100, 2: 190, 4: 360, 8: 640, 16: 1000, 32: 1040, 64: 1050, 128: 1050, 256: 1050, 512: 1050})


def test_full_step_rates_leave_out_the_steps_that_end_an_epoch_short():
    """#57: find-batch's probe at 4,096 on a rank's 5,000 samples trains 4,096 then 904 an epoch; only the
    full steps are the batch probed."""
    from paratrain.batch.find_batch import full_step_rates

    steps = [dict(samples=s, samples_per_s=r) for s, r in [(4096, 900), (5000, 300), (9096, 1000), (10000, 310)]]
    assert full_step_rates(steps, 4096) == [900, 1000]
    assert full_step_rates(steps[:2], 5000) == []


@pytest.mark.parametrize(
    "samples, workers, accum", [(5000, 2, 1), (4096, 2, 2), (100, 8, 1), (10**6, 64, 4), (39, 2, 1), (30, 2, 1)]
)
def test_the_steps_bound_leaves_twenty_optimizer_steps_an_epoch_or_says_why_not(samples, workers, accum):
    from paratrain.batch.recommend import MIN_STEPS_PER_EPOCH, steps_bound

    bound = steps_bound(samples, workers, accum)
    steps = -(-samples // (workers * accum * bound.batch))
    note = bound.note(samples, workers, accum)
    if steps >= MIN_STEPS_PER_EPOCH:
        assert (samples // (workers * accum * (bound.batch + 1))) < MIN_STEPS_PER_EPOCH
        assert f"searched up to {bound.batch:,} a worker" in note
    else:
        assert bound.batch == 1 and f"only {steps} optimizer steps an epoch even at batch 1" in note


def test_recommend_on_5000_samples_and_2_workers_trains_at_least_20_steps_an_epoch(tmp_path):
    """#57: a small CNN on 5,000 samples with --workers 2 got 2,048 a worker, one step an epoch, after
    32 minutes of measuring, with a note saying the global batch was within √N = 70. The search now stops
    at 125 a worker (5,000 / (20 x 2)); where the knee stays above the √ cap, the source says so."""
    from paratrain.batch.lr_find import RULE
    from paratrain.batch.recommend import recommend, steps_bound

    train = dict(workload="synthetic-cnn", device="cpu", synthetic_samples=5000, epochs=10, optimizer="sgd")
    bound = steps_bound(5000, 2, 1)
    assert bound.batch == 125
    written = {
        # find-batch as recommend asks for it: stopped by the steps rule, the knee at its end
        "find_batch.json": (
            {**train, "workers": 1},
            dict(
                knee_batch=125,
                safe_batch=125,
                margin=0.05,
                limited_by=bound.reason,
                probes=_probes({32: 500, 64: 800, 125: 1000}),
                options={"max_batch": 125},
            ),
        ),
        "noise_scale.json": (
            {**train, "workers": 2, "batch_size": 125},
            dict(critical_batch=10**6, options={"steps": 200}),
        ),
        "lr_find.json": (
            {**train, "workers": 1, "batch_size": 125},
            dict(suggested_lr=0.05, global_batch_size=125, rule=RULE, options={"steps": 100, "rule": RULE}),
        ),
    }
    for name, (flags, result) in written.items():
        (tmp_path / name).write_text(json.dumps({"train": flags, **result}))
    r = recommend(train, workers=2, out=tmp_path)
    global_batch = r["global_batch"]["value"]
    assert global_batch == 250 and -(-5000 // global_batch) >= 20
    assert r["notes"][0].startswith("find-batch searched up to 125 a worker")
    source = r["per_worker_batch"]["source"]
    assert "above the √(training samples) 70, at the knee" in source and "within the √" not in source
    assert "limited by at least 20 optimizer steps an epoch)" in source


@pytest.mark.parametrize(
    "stderr, per_worker", [(40.0, 32), (1.0, 2)], ids=["noise-scale-within-error", "noise-scale-sure"]
)
def test_recommend_stays_at_the_knee_unless_the_noise_scale_says_so_beyond_its_error_bar(tmp_path, stderr, per_worker):
    """#27: a small MLP got 2 samples per worker from a noise scale of 5 against a knee of 1,024. A
    critical batch of 5 within 2 standard errors of the knee's global batch (2 x 32) keeps the knee."""
    from paratrain.batch.lr_find import RULE
    from paratrain.batch.recommend import recommend

    train = dict(workload="synthetic-cnn", device="cpu", synthetic_samples=4096, epochs=10, optimizer="sgd")
    written = {
        "find_batch.json": (
            {**train, "workers": 1},
            dict(
                knee_batch=32,
                safe_batch=102,
                margin=0.05,
                probes=_probes({1: 40, 2: 80, 16: 640, 32: 1000, 512: 1000}),
                limited_by="at least 20 optimizer steps an epoch",
                options={"max_batch": 102},  # 4,096 samples / (20 steps x 2 workers),
            ),
        ),
        "noise_scale.json": (
            {**train, "workers": 2, "batch_size": 32},
            dict(critical_batch=5.0, b_simple_stderr=stderr, options={"steps": 200}),
        ),
        "lr_find.json": (
            {**train, "workers": 1, "batch_size": per_worker},
            dict(suggested_lr=0.05, global_batch_size=per_worker, rule=RULE, options={"steps": 100, "rule": RULE}),
        ),
    }
    for name, (flags, result) in written.items():
        (tmp_path / name).write_text(json.dumps({"train": flags, **result}))
    r = recommend(train, workers=2, out=tmp_path)
    assert r["per_worker_batch"]["value"] == per_worker
    # the LR is lr-find's at the batch recommended, scaled linearly to the global batch
    assert r["base_batch_size"] == per_worker and r["lr"]["value"] == pytest.approx(0.05 * 2)
    assert ("keeps its knee batch" in " ".join(r["notes"])) == (per_worker == 32)


@pytest.mark.parametrize("given_schedule", [None, "step", "adaptive batch"])
def test_recommend_combines_the_measurements_by_its_stated_rules(tmp_path, given_schedule):
    """recommend on measurements already in --out (as a rerun reuses them): no training runs, only
    the rules: the √N cap, linear LR scaling from lr-find's batch, Goyal's warmup, the schedule."""
    from paratrain.batch import read_result, run_config, train_samples
    from paratrain.batch.lr_find import RULE
    from paratrain.batch.recommend import recommend

    train = dict(workload="synthetic-cnn", device="cpu", synthetic_samples=4096, epochs=10, optimizer="sgd")
    samples = train_samples(run_config(train))
    cap = math.isqrt(samples)
    # The √ cap allows 32 a worker, predicted 4 % faster to the loss than the knee 16: far below the
    # critical batch (100 x 64) doubling the batch nearly halves the steps, at 1,050 against 1,000 samples/s.
    per_worker = cap // 2
    written = {
        "find_batch.json": (
            {**train, "workers": 1},
            dict(
                knee_batch=16,
                safe_batch=102,
                margin=0.05,
                probes=_probes({8: 640, 16: 1000, 32: 1050, 512: 1050}),
                limited_by="at least 20 optimizer steps an epoch",
                options={"max_batch": 102},  # 4,096 samples / (20 steps x 2 workers),
            ),
        ),
        "noise_scale.json": (
            {**train, "workers": 2, "batch_size": 16},
            dict(critical_batch=100 * cap, options={"steps": 200}),
        ),
        "lr_find.json": (
            {**train, "workers": 1, "batch_size": per_worker},
            dict(suggested_lr=0.05, global_batch_size=per_worker, rule=RULE, options={"steps": 100, "rule": RULE}),
        ),
    }
    for name, (flags, result) in written.items():
        (tmp_path / name).write_text(json.dumps({"train": flags, **result}))
    # a measurement made with other options of its command is not reused
    lr_flags = written["lr_find.json"][0]
    assert read_result(tmp_path / "lr_find.json", lr_flags, steps=100, rule=RULE) is not None
    assert read_result(tmp_path / "lr_find.json", lr_flags, steps=300, rule=RULE) is None
    assert read_result(tmp_path / "lr_find.json", lr_flags, steps=100, rule="steepest descent") is None
    growing = given_schedule == "adaptive batch"
    given = {**train, **({"schedule": given_schedule} if given_schedule and not growing else {})}
    if growing:  # measured at fixed batches as ever; the run starts at the batch chosen and may grow to 102 a rank
        given |= {"batch_schedule": "adaptive", "max_global_batch": 4096}
        given_schedule = None
    r = recommend(given, workers=2, out=tmp_path)
    assert r["batch_schedule"]["value"] == ("adaptive" if growing else "fixed")
    for flag in ("--batch-schedule adaptive", "--max-batch-size 102", "--max-global-batch 4096"):
        assert (flag in r["command"]) == growing
    assert r["per_worker_batch"]["value"] == per_worker and r["global_batch"]["value"] == 2 * per_worker
    assert "√(training samples)" in r["global_batch"]["source"]
    assert r["lr"]["value"] == pytest.approx(0.05 * 2) and r["lr_scaling"] == "linear"
    assert r["warmup_epochs"]["value"] == 1.0 and r["optimizer"]["value"] == "sgd"
    assert r["schedule"]["value"] == (given_schedule or "cosine")
    assert (
        f"--batch-size {per_worker} --lr 0.05 --base-batch-size {per_worker} --lr-scaling linear" in r["command"]
        and f"--schedule {given_schedule or 'cosine'}" in r["command"]
        and "--warmup-epochs 1.0" in r["command"]
    )


def test_recommend_takes_a_knee_past_the_margin_as_the_largest_batch(tmp_path):
    """#58: memory stopped find-batch at 100 (101 failed), 95 with the 5 % margin, while the throughput still rose:
    the knee came out at 96. recommend chose 96 a worker, the batch the margin is there to avoid, and ruled 95 out
    as below the knee. The knee it uses is 95: noise-scale measures there and the run gets it."""
    from paratrain.batch.lr_find import RULE
    from paratrain.batch.recommend import recommend

    train = dict(workload="synthetic-cnn", device="cpu", synthetic_samples=4096, epochs=10, optimizer="sgd")
    probes = _probes({32: 300, 64: 600, 96: 700, 100: 720})
    written = {
        "find_batch.json": (
            {**train, "workers": 1},
            dict(
                knee_batch=96,
                safe_batch=95,
                margin=0.05,
                probes=probes,
                limited_by="memory",
                options={"max_batch": 102},  # 4,096 samples / (20 steps x 2 workers)
            ),
        ),
        # measured at the knee the run can use: recommend reuses it rather than measuring at 96
        "noise_scale.json": (
            {**train, "workers": 2, "batch_size": 95},
            dict(critical_batch=10**6, b_simple_stderr=1.0, options={"steps": 200}),
        ),
        "lr_find.json": (
            {**train, "workers": 1, "batch_size": 95},
            dict(suggested_lr=0.05, global_batch_size=95, rule=RULE, options={"steps": 100, "rule": RULE}),
        ),
    }
    for name, (flags, result) in written.items():
        (tmp_path / name).write_text(json.dumps({"train": flags, **result}))
    r = recommend(train, workers=2, out=tmp_path)
    assert r["per_worker_batch"]["value"] == 95 and r["global_batch"]["value"] == 190
    assert r["per_worker_batch"]["source"].startswith("find-batch: knee 95, largest 95 (limited by memory")
    options = {o["batch"]: o["ruled_out"] for o in r["per_worker_batch"]["options"]}
    assert options[95] is None and options[32].startswith("below the knee")  # 32: the √4,096 cap over 2 workers


@pytest.mark.parametrize("knee", [1, 4])
def test_recommend_on_more_workers_than_the_critical_batch_gives_each_one_sample(knee):
    """#58: a sure noise scale of 5 on 8 workers: even 1 sample a worker makes a global batch of 8. Every option
    was ruled out (the knee's global batch and the cap's 1 a worker alike exceed 5) and recommend ended in
    "min() arg is an empty sequence". 1 a worker is the least there is: it is chosen, and the note says so."""
    from paratrain.batch.recommend import BatchChoice

    found = dict(knee_batch=knee, safe_batch=64, limited_by="memory", margin=0.05, probes=_probes({1: 10, 4: 40}))
    choice = BatchChoice.measured(found, {"critical_batch": 5.0, "b_simple_stderr": 0.0}, workers=8, samples=4096)
    assert (choice.per_worker, choice.global_batch) == (1, 8)
    below = f", below the knee batch {knee}" if knee > 1 else ""
    assert choice.notes[0] == (
        f"8 workers exceed the critical batch 5 (+2 standard errors: 5) even at 1 sample a worker{below}: "
        "5 worker(s) would stay within it"
    )
    at = "the knee" if knee == 1 else "1 a worker, the least"
    source = choice.fields(0.05)["per_worker_batch"]["source"]
    assert f"above the critical batch (noise scale) 5, at {at} (note)" in source


def test_recommend_compares_the_options_time_to_the_same_loss(tmp_path):
    """#27: the rationale weighs each option by its predicted time to the same loss: McCandlish et
    al.'s steps (1 + B_noise/B) times a step's time at find-batch's samples/s. By hand, B_noise 100 on
    2 workers: the knee 16, (1 + 100/32) x 16/1000 = 0.0660; the √(4096) cap's 32,
    (1 + 100/64) x 32/1040 = 0.0788, 1.19x; the critical batch's 50, at 1,046 samples/s between the
    probes at 32 and 64, (1 + 100/100) x 50/1045.6 = 0.0956, 1.45x, and above the √ cap."""
    from paratrain.batch.lr_find import RULE
    from paratrain.batch.recommend import recommend

    train = dict(workload="synthetic-cnn", device="cpu", synthetic_samples=4096, epochs=10, optimizer="sgd")
    written = {
        "find_batch.json": (
            {**train, "workers": 1},
            dict(
                knee_batch=16,
                safe_batch=102,
                margin=0.05,
                probes=KNEE_16,
                limited_by="at least 20 optimizer steps an epoch",
                options={"max_batch": 102},  # 4,096 samples / (20 steps x 2 workers)
            ),
        ),
        "noise_scale.json": (
            {**train, "workers": 2, "batch_size": 16},
            dict(critical_batch=100.0, b_simple_stderr=10.0, options={"steps": 200}),
        ),
        "lr_find.json": (
            {**train, "workers": 1, "batch_size": 16},
            dict(suggested_lr=0.05, global_batch_size=16, rule=RULE, options={"steps": 100, "rule": RULE}),
        ),
    }
    for name, (flags, result) in written.items():
        (tmp_path / name).write_text(json.dumps({"train": flags, **result}))
    r = recommend(train, workers=2, out=tmp_path)
    options = {o["batch"]: o for o in r["per_worker_batch"]["options"]}
    assert r["per_worker_batch"]["value"] == 16 == min(options, key=lambda b: options[b]["relative_time_to_loss"])
    assert [round(options[b]["relative_time_to_loss"], 2) for b in (16, 32, 50)] == [1.0, 1.19, 1.45]
    assert options[50]["ruled_out"] == "its global batch 100 exceeds the √(training samples) 64"
    (note,) = [n for n in r["notes"] if n.startswith("time to the same loss")]
    assert "S = S_min (1 + B_noise/B)" in note and "B_noise the critical batch 100" in note
    assert (
        "16 a worker (the knee; global 32, 1,000 samples/s): 1.00x, chosen; "
        "32 a worker (the √(training samples) / 2 workers; global 64, 1,040 samples/s): 1.19x, slower; "
        "50 a worker (the critical batch (noise scale) / 2 workers; global 100, 1,046 samples/s): 1.45x, ruled out: "
        "its global batch 100 exceeds the √(training samples) 64. 16 a worker wins: of the options,"
    ) in note


def test_recommend_on_a_small_mlp_stays_inside_its_stated_bounds(tmp_path, capsys):
    """#27: on a small MLP recommend advised 2 samples per worker (a noise scale of 5 against a knee of
    1,024) and SGD at LR 2. Measured end to end here (find-batch, noise-scale and lr-find on a 16-32-2
    MLP whose noise scale is small and sure, so that its batch, like the issue's, goes below the knee
    wherever the knee is measured at 8 or more): the per-worker batch is at most the largest batch that
    fits, below the knee only where the noise scale says so beyond its error bar; the global batch is
    within its cap unless the knee is kept; the LR is lr-find's at the batch recommended, scaled
    linearly (SGD), and below where the range test's loss turned up."""
    from batch_factories import MLP_SAMPLES

    workers, out = 2, tmp_path / "rec"
    result, printed = _run(
        capsys,
        "recommend",
        out,
        workers=workers,
        model="user_factories:mlp",
        dataset="batch_factories:mlp_vectors",
        num_classes=2,
        device="cpu",
        epochs=5,
        max_batch=128,
        noise_steps=40,
        lr_steps=40,
    )
    found, noise, lrs = (
        json.loads((out / f"{name}.json").read_text()) for name in ("find_batch", "noise_scale", "lr_find")
    )
    per_rank = MLP_SAMPLES // workers
    knee, largest = min(found["knee_batch"], per_rank), min(found["safe_batch"], per_rank)
    per_worker, global_batch = result["per_worker_batch"]["value"], result["global_batch"]["value"]
    critical, stderr = noise["critical_batch"], noise["b_simple_stderr"]
    assert global_batch == workers * per_worker and 1 <= per_worker <= largest, (per_worker, knee, largest)
    if per_worker < knee:
        assert critical + 2 * stderr < workers * knee, (per_worker, knee, critical, stderr)
    # #57: the search stops at the batch that leaves the 2 workers 20 optimizer steps an epoch
    assert found["options"]["max_batch"] == MLP_SAMPLES // (20 * workers) and found["max_batch"] <= MLP_SAMPLES // 40
    assert -(-MLP_SAMPLES // global_batch) >= 20
    cap = min(c for c in (critical, math.isqrt(MLP_SAMPLES)) if c)  # no noise scale measured: the √ rule alone
    assert global_batch <= cap or per_worker == knee, (global_batch, cap, knee)
    # the LR: lr-find's, measured at the batch recommended, scaled to the global batch
    assert lrs["train"]["batch_size"] == per_worker and result["base_lr"] == lrs["suggested_lr"]
    assert result["lr"]["value"] == pytest.approx(lrs["suggested_lr"] * global_batch / lrs["global_batch_size"])
    assert lrs["diverged_at_lr"] is None or lrs["suggested_lr"] < lrs["diverged_at_lr"]
    assert f"saved: {out / 'recommend.json'}" in printed


@pytest.mark.parametrize("command", ["find-batch", "recommend"])
@pytest.mark.parametrize("out", ["file.txt/out", "o" * 300], ids=["under-a-file", "name-too-long"])
def test_an_out_that_cannot_be_written_is_refused_before_any_measurement(tmp_path, monkeypatch, capsys, command, out):
    """#27: an --out that cannot be written was found only when the result was saved, after every
    probe of find-batch had run (minutes, on a real model); it is one line before the first."""
    from paratrain.batch import find_batch as find_batch_module

    def probe(*args, **kwargs):
        raise AssertionError("a probe ran before --out was checked")

    monkeypatch.setattr(find_batch_module, "_probe", probe)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("a file, not a directory")
    argv = [
        command,
        *(["--workers", "2"] if command == "recommend" else []),
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        "64",
        "--device",
        "cpu",
        "--out",
        out,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("a file, not a directory" if "/" in out else "File name too long") in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]
