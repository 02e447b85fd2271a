"""pipeline, model-parallel and hybrid (#9): the same parameters as one process, the bubble, bad input.

Launching ranks costs seconds each time on this machine, so the runs of one world size share one
spawned gloo process group: each rank runs the real training loop (engine/loop.py's Trainer) once
per configuration, one after the other, and rank 0 writes each run's summary. The one-process
baselines run in this process through paratrain.train.
"""

import gc
import itertools
import json
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
from conftest import start_ranks

import paratrain
import paratrain.workloads
from paratrain.config import TrainConfig
from paratrain.config.parallelism import TensorParallelOptions
from paratrain.errors import UsageError
from paratrain.launch.load import LoadMeter
from paratrain.plan.memory import Layout, memory_per_device, stage_bounds
from paratrain.plan.profile import profile_model, profile_tensor_parallel

SMALL = dict(
    workload="synthetic-cnn",
    model="pipeline_factories:small_stack",
    synthetic_samples=256,
    synthetic_shape=(1, 8, 8),
    device="cpu",
    epochs=1,
    lr=0.05,
    lr_scaling="none",
    threads_per_worker=1,
    quiet=True,
    log_every=4,
    checkpoint_every=1,
)
# SGD, not Adam: Adam normalises each gradient, so one that is zero in exact arithmetic (attention's
# key bias) but float noise in practice takes full-size steps in a direction set by summation order.
GPT = dict(
    workload="gpt-tiny",
    n_layer=2,
    n_embd=32,
    n_head=2,
    seq_len=16,
    samples_per_epoch=256,
    eval_samples=32,
    device="cpu",
    epochs=1,
    lr=0.1,
    lr_scaling="none",
    threads_per_worker=1,
    quiet=True,
    log_every=4,
    checkpoint_every=1,
)
# nanoGPT's layout (tests/pipeline_factories.py: 4 blocks of width 32) on gpt-tiny's bytes.
NANOGPT = {
    **{k: v for k, v in GPT.items() if k not in ("n_layer", "n_embd", "n_head")},
    "model": "pipeline_factories:NanoGPT",
    "batch_size": 16,
}
# Balanced stages: Flatten + 4 blocks | 4 blocks + a 10-way classifier, each block a 1024x1024 Linear.
# Micro-batches of at least 32 rows keep each one's compute well above the fixed cost of sending it.
BALANCED = dict(
    workload="synthetic-cnn",
    model="pipeline_factories:linear_stack",
    synthetic_samples=2560,
    synthetic_shape=(2, 32, 32),
    device="cpu",
    epochs=1,
    lr=0.01,
    lr_scaling="none",
    batch_size=512,
    threads_per_worker=1,
    quiet=True,
    log_every=100,
    split="5",
)
BUBBLE_MICROBATCHES = (1, 2, 4, 8)


def _rank(rank: int, world: int, port: int, jobs: list) -> None:
    from paratrain.engine.distributed import Placement, init_rank, shutdown
    from paratrain.engine.loop import Trainer
    from paratrain.runs import RunDir, write_json

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    ctx = init_rank(Placement(backend="gloo", device_type="cpu", threads_per_worker=1))
    try:
        for cfg, resume_from in jobs:
            run = RunDir(Path(cfg["run_dir"]))
            if rank == 0:
                if resume_from:
                    shutil.copytree(resume_from, run.path)
                run.path.mkdir(parents=True, exist_ok=True)
            torch.distributed.barrier()
            # As launch hands it to the ranks: every field, dumped and validated again.
            config = TrainConfig.model_validate(TrainConfig(**cfg, workers=world).model_dump(mode="json"))
            summary = Trainer(config, ctx, run).fit()
            if rank == 0:
                write_json(run.summary, summary)
    finally:
        # As run_rank does: free the Trainers (their DDP models sit in reference cycles) before the
        # process group goes, or torch 2.13 can abort at exit (SIGABRT: the hybrid test's rank 3 did
        # in one CI run).
        gc.collect()
        shutdown()


def _spawn(world: int, jobs: list) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(_rank, (world, port, [(_jsonable(cfg), resume) for cfg, resume in jobs]), nprocs=world)


def _jsonable(cfg: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in cfg.items()}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _model(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    """Every 2-rank run of this file, in one process group."""
    root = tmp_path_factory.mktemp("pipeline2")
    jobs = [
        (dict(SMALL, strategy="pipeline", pipeline_schedule=s, batch_size=32, microbatches=4, run_dir=root / s), None)
        for s in ("gpipe", "1f1b", "interleaved")
    ]
    jobs.append((dict(GPT, strategy="pipeline", batch_size=8, microbatches=2, run_dir=root / "gpt"), None))
    jobs.append((dict(NANOGPT, strategy="pipeline", microbatches=2, run_dir=root / "nanogpt"), None))
    # Resumed: one epoch from the 1f1b run's checkpoint, against two epochs straight through.
    jobs.append((dict(SMALL, strategy="pipeline", batch_size=32, epochs=2, run_dir=root / "straight"), None))
    jobs.append(
        (
            dict(SMALL, strategy="pipeline", batch_size=32, epochs=2, resume=True, run_dir=root / "resumed"),
            root / "1f1b",
        )
    )
    jobs.append((dict(BALANCED, strategy="model-parallel", run_dir=root / "bubble1"), None))
    jobs += [
        (
            dict(BALANCED, strategy="pipeline", pipeline_schedule="gpipe", microbatches=m, run_dir=root / f"bubble{m}"),
            None,
        )
        for m in BUBBLE_MICROBATCHES[1:]
    ]
    load = LoadMeter(None)
    _spawn(2, jobs)
    (root / "machine_load.json").write_text(json.dumps(load.finish()))
    return root


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    for name, cfg in (
        ("small32", dict(SMALL, batch_size=32)),
        ("small64", dict(SMALL, batch_size=64)),
        ("small32x2", dict(SMALL, batch_size=32, epochs=2)),
        ("gpt", dict(GPT, batch_size=8)),
        ("nanogpt", NANOGPT),
    ):
        paratrain.train(dict(cfg, strategy="single", run_dir=root / name))
    return root


def _assert_same_parameters(single: dict, staged: dict) -> None:
    """Tolerance rtol 1e-5 / atol 1e-6: the runs differ only in float32 summation order (a batch's
    gradient as the mean of M micro-batch means vs one mean; the tied gpt embedding's two gradient
    contributions added on two ranks vs in one backward), over 8 SGD steps (4 for hybrid)."""
    assert single.keys() == staged.keys()
    for key in single:
        torch.testing.assert_close(staged[key], single[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pipeline_on_two_ranks_reaches_the_parameters_of_one_process(two_rank_runs, one_process_runs, schedule):
    run = two_rank_runs / schedule
    summary = _summary(run)
    assert summary["steps"] == 8 and summary["global_batch_size"] == 32
    assert summary["pipeline"]["stage_slots"] == (4 if schedule == "interleaved" else 2)
    single = _model(one_process_runs / "small32")
    init = paratrain.workloads.build_model(TrainConfig(**SMALL), paratrain.workloads.load_data(TrainConfig(**SMALL)))
    moved = max((single[k] - v).abs().max().item() for k, v in init.state_dict().items())
    assert moved > 1e-3, "training did not move the parameters: the comparison would prove nothing"
    _assert_same_parameters(single, _model(run))
    assert summary["train_loss"] == pytest.approx(_summary(one_process_runs / "small32")["train_loss"], rel=1e-5)
    assert summary["val_accuracy"] == _summary(one_process_runs / "small32")["val_accuracy"]


def test_gpt_across_stages_keeps_its_tied_embedding_and_matches_one_process(two_rank_runs, one_process_runs):
    """gpt's token embedding is its output projection: stage 1 holds one copy, stage 2 the other;
    their gradients are summed, so both stay equal and equal to the one process's tied weight."""
    staged = _model(two_rank_runs / "gpt")
    assert torch.equal(staged["embed.wte.weight"], staged["head.lm_head.weight"])
    _assert_same_parameters(_model(one_process_runs / "gpt"), staged)
    assert _summary(two_rank_runs / "gpt")["pipeline"]["split"][0][0] == "embed"


def test_a_resumed_pipeline_continues_the_same_run(two_rank_runs):
    straight, resumed = _model(two_rank_runs / "straight"), _model(two_rank_runs / "resumed")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0, msg=key)
    assert _summary(two_rank_runs / "resumed")["steps"] == 16


def test_the_measured_bubble_falls_with_microbatches_as_the_theory_says(two_rank_runs):
    """K = 2 balanced stages: (K-1)/(M+K-1) = 1/2, 1/3, 1/5, 1/9 for M = 1 (model-parallel), 2, 4, 8.

    On a machine that other work keeps busy (LoadMeter: more than 10 % of the cores' time), a rank
    that waits for a micro-batch waits again for a core once it arrives, which adds idle time in
    proportion to M: then the fall and the lower bound are asserted, and the closeness is reported
    as skipped rather than passed; the model-parallel baseline must still idle more than M = 8.

    The theory leaves out the time a micro-batch's activations (and gradients) take to cross between the ranks.
    A CPU rank has one core, which its gloo I/O thread waits for while the rank computes: on the Intel VM the last
    stage waited 3-6 ms for each micro-batch against a 35 ms forward, which put M = 8 at 0.18-0.24 against 0.11
    (M = 4 at 0.24-0.30 against 0.20). So the measured bubble may exceed the theory by 0.175; micro-batches run one
    after another (no pipelining) would still fail by idling about half the step at every M."""
    measured = []
    for m in BUBBLE_MICROBATCHES:
        summary = _summary(two_rank_runs / f"bubble{m}")
        theory = 1 / (m + 1)
        assert summary["bubble_fraction_theory"] == pytest.approx(theory)
        assert summary["pipeline"]["timed_steps"] == 4  # 5 steps, the first (shape inference) left out
        assert len(summary["bubble_fraction_per_rank"]) == 2
        assert summary["bubble_fraction"] >= theory - 0.1, (m, summary["bubble_fraction"], theory)
        measured.append((summary["bubble_fraction"], theory))
    assert measured[0][0] > measured[-1][0] + 0.1, measured
    assert _summary(two_rank_runs / "bubble1")["pipeline"]["microbatches"] == 1
    load = json.loads((two_rank_runs / "machine_load.json").read_text())
    if load["contended"]:
        pytest.skip(
            f"fall and closeness to the theory not asserted: other work took {load['other_fraction']:.0%} of the "
            f"cores (measured vs theory: {[(round(b, 3), round(t, 3)) for b, t in measured]})"
        )
    # falling from each M to the next, to within 0.02: at M = 4 and 8 the gloo wait above keeps both near 0.25
    # (CI measured 0.245 then 0.251)
    assert all(later <= earlier + 0.02 for (earlier, _), (later, _) in itertools.pairwise(measured)), measured
    for bubble, theory in measured:
        assert theory - 0.1 <= bubble <= theory + 0.175, measured


# gpt's 2 stages, each sharded over 2 ranks (torchtitan's PP x FSDP; oversubscribed: 4 ranks on 2 cores).
PP_FSDP = dict(GPT, pp=2, dp_shard=2, batch_size=4, microbatches=2, allow_oversubscribe=True)


def test_hybrid_on_four_ranks_reaches_the_parameters_of_one_process(tmp_path, one_process_runs):
    """2 replicas x 2 stages, batch 32 per replica: one process with batch 64; and the same layout with the
    stages sharded instead of replicated (--pp 2 --dp-shard 2), gpt at 4 a replica: one process with batch 8,
    then resumed from its checkpoint for a second epoch, against two epochs straight through."""
    # The plan splits the stages by FLOPs, --split auto by the units' measured time, which on a fast machine put
    # another block first on stage 2 (CI at 7358c53): the run is given the plan's split, so both hold the same.
    small = profile_model(TrainConfig(**{k: v for k, v in SMALL.items() if k in TrainConfig.model_fields}))
    planned_split = small.units[stage_bounds(small, 2)[1][0]]["name"]
    hybrid = dict(
        SMALL,
        strategy="hybrid",
        dp=2,
        stages=2,
        batch_size=32,
        microbatches=2,
        split=planned_split,
        allow_oversubscribe=True,
    )
    _spawn(
        4,
        [
            (dict(hybrid, run_dir=tmp_path / "hybrid"), None),
            (dict(PP_FSDP, run_dir=tmp_path / "pp-fsdp"), None),
            (dict(PP_FSDP, epochs=2, run_dir=tmp_path / "pp-fsdp-straight"), None),
            (dict(PP_FSDP, epochs=2, resume=True, run_dir=tmp_path / "pp-fsdp-resumed"), tmp_path / "pp-fsdp"),
            # the first epoch's checkpoint of the sharded stages, its second epoch with the stages split instead
            (
                dict(GPT, pp=2, tp=2, batch_size=8, microbatches=2, epochs=2, resume=True, allow_oversubscribe=True)
                | {"run_dir": tmp_path / "pp-tp-resumed"},
                tmp_path / "pp-fsdp",
            ),
            # each stage's layers split over 2 ranks instead (PP x TP), the whole batch of 8 in one pipeline
            (
                dict(
                    GPT, pp=2, tp=2, batch_size=8, microbatches=2, allow_oversubscribe=True, run_dir=tmp_path / "pp-tp"
                ),
                None,
            ),
        ],
    )
    summary = _summary(tmp_path / "hybrid")
    assert summary["global_batch_size"] == 64 and summary["steps"] == 4 and summary["allreduce"] == "gloo"
    _assert_same_parameters(_model(one_process_runs / "small64"), _model(tmp_path / "hybrid"))
    # the plan's hybrid layout holds what the largest rank held, a replica's batch of 32: the first stage, whose
    # layers' inputs and activations' outputs for 2 micro-batches in flight outweigh the second's larger head (a
    # stage's share of the FLOPs had put its activations 25 % low and reported the second stage)
    hybrid = memory_per_device(small, Layout("hybrid", 4, 2, 2, 2, 32), "sgd", "fp32")
    _assert_planned_held(hybrid, summary, heaviest=True)

    sharded = _summary(tmp_path / "pp-fsdp")
    assert sharded["layout"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 1, "pp": 2}
    assert sharded["global_batch_size"] == 8 and sharded["allreduce"] == "reduce-scatter (gloo)"
    staged = _model(tmp_path / "pp-fsdp")  # gathered whole from the shards
    assert torch.equal(staged["embed.wte.weight"], staged["head.lm_head.weight"])  # the tie, summed over stages
    _assert_same_parameters(_model(one_process_runs / "gpt"), staged)
    # each rank holds half of its stage's parameters: the 4 ranks together hold the model once, plus the
    # second copy of the tied weight (the stages' each)
    single = _summary(one_process_runs / "gpt")["memory"]["parameters_bytes"][0]
    tied = staged["embed.wte.weight"].numel() * 4
    assert sum(sharded["memory"]["parameters_bytes"]) == single + tied
    assert max(sharded["memory"]["parameters_bytes"]) < 0.4 * single
    # the plan's pp+fsdp layout holds what the largest rank held (the heaviest stage's state over 2 shards;
    # the tied gradients summed in place, so the gradients take what the parameters do)
    profile = profile_model(TrainConfig(**{k: v for k, v in GPT.items() if k in TrainConfig.model_fields}))
    _assert_planned_held(memory_per_device(profile, Layout("pp+fsdp", 4, 2, 2, 2, 4, shard=2), "sgd", "fp32"), sharded)
    straight, resumed = _model(tmp_path / "pp-fsdp-straight"), _model(tmp_path / "pp-fsdp-resumed")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0, msg=key)
    assert _summary(tmp_path / "pp-fsdp-resumed")["steps"] == 2 * sharded["steps"]

    # checkpoint.pt holds the whole model: another layout of the stages takes it and goes on as the straight run
    relaid = _model(tmp_path / "pp-tp-resumed")
    for key in straight:
        torch.testing.assert_close(relaid[key], straight[key], rtol=1e-5, atol=1e-6, msg=key)

    split = _summary(tmp_path / "pp-tp")
    assert split["layout"] == {"dp_replicate": 1, "dp_shard": 1, "tp": 2, "pp": 2} and split["global_batch_size"] == 8
    _assert_same_parameters(_model(one_process_runs / "gpt"), _model(tmp_path / "pp-tp"))
    assert split["train_loss"] == pytest.approx(_summary(one_process_runs / "gpt")["train_loss"], rel=1e-5)
    # the plan's pp+tp layout holds what the largest rank held: the embedding whole, the block split in two
    _assert_planned_state_held(Layout("pp+tp", 4, 1, 2, 2, 8, tp=2), split)


def _assert_planned_state_held(layout: Layout, summary: dict, loss_parallel: bool = False) -> None:
    """The plan's parameters, gradients and optimizer state for gpt's split stages, as the ranks of the stage it
    reports (its heaviest in all: the last stage, with the loss's backward, may be it) held them."""
    config = TrainConfig(**{k: v for k, v in GPT.items() if k in TrainConfig.model_fields})
    profile = profile_model(config)
    split = TensorParallelOptions(tp=layout.tp, loss_parallel=loss_parallel)
    profile.tensor_parallel = profile_tensor_parallel(config, split)
    _assert_planned_held(memory_per_device(profile, layout, "sgd", "fp32"), summary)


def _assert_planned_held(planned: dict, summary: dict, heaviest: bool = False) -> None:
    """The ranks of the stage the plan reports held its parameters, gradients and optimizer state exactly, and its
    activations' peak within 10 % (what the stage's units save, profile.py). With `heaviest`, that stage's ranks
    held the most of all four (where the loss's backward, which the memory block does not show, weighs little)."""
    held = summary["memory"]
    ranks = [r for r, value in enumerate(held["parameters_bytes"]) if value == planned["parameters_bytes"]]
    assert ranks, (planned["parameters_bytes"], held["parameters_bytes"])
    if heaviest:
        figures = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes")
        totals = [sum(held[figure][r] for figure in figures) for r in range(len(held["parameters_bytes"]))]
        assert max(totals[r] for r in ranks) == max(totals), (ranks, totals)
    for figure in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"):
        assert all(planned[figure] == held[figure][r] for r in ranks), (figure, planned[figure], held[figure])
    for r in ranks:
        peak = held["activations_peak_bytes"][r]
        assert planned["activations_bytes"] == pytest.approx(peak, rel=0.10), (planned["activations_bytes"], peak)


def test_stages_split_and_sharded_on_eight_ranks_reach_the_parameters_of_one_process(tmp_path, one_process_runs):
    """torchtitan's 3-D layout, --pp 2 --dp-shard 2 --tp 2, with its loss parallelism: gpt's 2 stages, each
    stage's layers split over 2 ranks (the embedding and the head tied to it by vocabulary, the loss computed on
    the split logits) and sharded over 2 replicas of 4 samples (8 ranks on 2 cores: correctness only), against
    one process at batch 8; the losses and accuracy the last stages reported, step for step."""
    run = tmp_path / "3d"
    summary = _eight_ranks_as_one_process(run, one_process_runs, dict(dp_shard=2, loss_parallel=True))
    assert summary["layout"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 2, "pp": 2}
    assert _accuracy(run) == _accuracy(one_process_runs / "gpt")
    # each rank holds a quarter of its stage's split layers (2 ways split, 2 ways sharded) and of the embedding
    # or the head, and half of the rest
    whole = _summary(one_process_runs / "gpt")["memory"]["parameters_bytes"][0]
    assert max(summary["memory"]["parameters_bytes"]) < 0.3 * whole
    _assert_planned_state_held(Layout("pp+fsdp+tp", 8, 2, 2, 2, 4, shard=2, tp=2), summary, loss_parallel=True)


def _eight_ranks_as_one_process(run: Path, one_process_runs: Path, replicas: dict) -> dict:
    """gpt's 2 stages split over 2 ranks each, in 2 replicas of 4 samples laid out by `replicas` (8 ranks on 2
    cores: correctness only), checked against one process at batch 8: its weights, and its loss at every step."""
    three_d = dict(GPT, pp=2, tp=2, batch_size=4, microbatches=2, **replicas)
    _spawn(8, [(three_d | {"allow_oversubscribe": True, "run_dir": run}, None)])
    summary = _summary(run)
    assert summary["global_batch_size"] == 8 and summary["steps"] == _summary(one_process_runs / "gpt")["steps"]
    _assert_same_parameters(_model(one_process_runs / "gpt"), _model(run))
    single, spread = _losses(one_process_runs / "gpt"), _losses(run)
    assert sorted(spread) == sorted(single)
    for step in single:
        assert spread[step] == pytest.approx(single[step], rel=1e-5), step
    return summary


def test_megatrons_3d_layout_of_replicated_split_stages_reaches_the_parameters_of_one_process(
    tmp_path, one_process_runs
):
    """Megatron-LM's 3-D layout, --dp-replicate 2 --pp 2 --tp 2 (8 ranks on 2 cores: correctness only): gpt's 2
    stages, each split over 2 ranks, in 2 replicas of 4 samples whose gradients are all-reduced (FSDP2 over shards
    of one rank: DDP cannot hold split layers), against one process at batch 8; the losses step for step, and the
    plan's layout of that mesh (hybrid+tp) holds what the ranks of its heaviest stage held."""
    summary = _eight_ranks_as_one_process(tmp_path / "3d-replicas", one_process_runs, dict(dp_replicate=2))
    assert summary["layout"] == {"dp_replicate": 2, "dp_shard": 1, "tp": 2, "pp": 2}
    planned = Layout("pp+fsdp+tp", 8, 2, 2, 2, 4, shard=1, tp=2)
    assert planned.name == "hybrid+tp"
    _assert_planned_state_held(planned, summary)


def _accuracy(run_dir: Path) -> dict[int, float]:
    return _step_figure(run_dir, "accuracy")


def _losses(run_dir: Path) -> dict[int, float]:
    return _step_figure(run_dir, "loss")


def _step_figure(run_dir: Path, figure: str) -> dict[int, float]:
    return {
        e["step"]: e[figure]
        for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if e["event"] == "step"
    }


# -- bad input: one line, exit 2, nothing written ---------------------------------------------------

BAD = {
    "more stages than ranks": (
        dict(strategy="pipeline", workers=2, stages=3),
        "--stages 3 (one rank per stage) needs 3 workers",
    ),
    "replicas x stages exceed the ranks": (
        dict(strategy="hybrid", workers=2, dp=2, stages=2),
        "--dp 2 x --stages 2 needs 4 workers",
    ),
    "micro-batches do not divide the batch": (
        dict(strategy="pipeline", workers=2, batch_size=30, microbatches=4),
        "--microbatches 4 does not divide --batch-size 30",
    ),
    "a split point that does not exist": (dict(strategy="pipeline", workers=2, split="9"), "no block named '9'"),
    "a model that is not a chain of its children": (
        dict(strategy="pipeline", workers=2, model="pipeline_factories:NotAChain"),
        "children applied in order do not give its output, and it has no ModuleList",
    ),
    "model-parallel with micro-batches": (
        dict(strategy="model-parallel", workers=2, microbatches=8),
        "for --microbatches use",
    ),
    "gradient accumulation": (dict(strategy="pipeline", workers=2, grad_accum=2), "instead of --grad-accum"),
    "layers split in a model cut along its graph": (
        dict(NANOGPT, strategy="pipeline", workers=4, tp=2, allow_oversubscribe=True),
        "--tp splits, shards or checkpoints a stage's modules, and this model's stages run its forward graph's",
    ),
    "checkpointed blocks in a model cut along its graph": (
        dict(NANOGPT, strategy="pipeline", workers=2, checkpoint_activations=True),
        "--checkpoint-activations splits, shards or checkpoints a stage's modules",
    ),
    "stage shards that do not divide the replicas": (
        dict(strategy="hybrid", workers=6, dp=3, stages=2, dp_shard=2),
        "--dp-shard 2 shards each stage over that many of the pipeline's 3 replicas",
    ),
    "stages without a staged strategy": (
        dict(strategy="ddp", workers=2, stages=2),
        "--stages lays out pipeline stages",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_layouts_fail_before_anything_is_written(tmp_path, case):
    overrides, message = BAD[case]
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        paratrain.train(dict(SMALL, **{"batch_size": 32, "run_dir": tmp_path / "run", **overrides}))
    assert not (tmp_path / "run").exists()


def test_a_bad_split_is_one_line_and_exit_status_2(tmp_path, capsys):
    from paratrain.cli import main

    code = main(
        [
            "train",
            "--workload",
            "gpt-tiny",
            "--workers",
            "2",
            "--strategy",
            "pipeline",
            "--split",
            "blocks.7",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "no block named 'blocks.7'" in err, err
    assert "embed, blocks.0, blocks.1, blocks.2, blocks.3, head" in err
    assert not (tmp_path / "run").exists()


def test_a_model_whose_blocks_are_a_module_dict_is_split_along_them(tmp_path):
    """torchtitan keeps its blocks in an nn.ModuleDict keyed "0", "1", ..., looped over in forward: its items
    are the pipeline's units, as a ModuleList's are (the dict itself has no forward, and as one unit the whole
    stack would be one stage's). 2 stages reach the parameters of one process."""
    common = dict(SMALL, model="user_factories:dict_layered_net", dataset="user_factories:float_pairs")
    common["batch_size"] = 32
    paratrain.train(dict(common, run_dir=tmp_path / "one", workers=1))
    paratrain.train(dict(common, run_dir=tmp_path / "two", workers=2, strategy="pipeline", split="layers.1"))
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["pipeline"]["split"] == [["stem", "layers.0"], ["layers.1", "layers.2", "head"]]
    one, two = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=True)["model"] for run in ("one", "two"))
    assert one.keys() == two.keys() and "layers.2.fc.weight" in one
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6)


def test_a_model_that_declares_its_chain_is_split_along_it(tmp_path):
    """NotAChain's forward flattens between its children, so they do not chain; declaring its units
    (pipeline_units, the flatten in the first) makes it a pipeline on 2 ranks that reaches the parameters
    of one process, and --split takes the declared names."""
    model = dict(SMALL, model="pipeline_factories:DeclaredChain", batch_size=32)
    paratrain.train(dict(model, run_dir=tmp_path / "one", workers=1))
    paratrain.train(dict(model, run_dir=tmp_path / "two", workers=2, strategy="pipeline", split="fc"))
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["pipeline"]["split"] == [["conv"], ["fc"]]
    one, two = (torch.load(tmp_path / run / "checkpoint.pt", weights_only=True)["model"] for run in ("one", "two"))
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6)


def test_a_nanogpt_layout_is_cut_along_its_forward_graph_and_matches_one_process(two_rank_runs, one_process_runs):
    """nanoGPT's forward sums the token and position embeddings before its blocks and ties its head to the token
    embedding (`wte.weight = lm_head.weight`, the other way round from gpt's): its children in order are not its
    forward, so the pipeline reads its units from the forward graph. 2 stages of 1F1B over 2 micro-batches train
    to the losses and parameters of one process, and the tied weight starts from the head's draw on both stages,
    as the ordinary build has it."""
    split = _summary(two_rank_runs / "nanogpt")["pipeline"]["split"]
    assert split[0][0] == "prologue" and split[-1][-1] == "epilogue", split
    assert sum(map(len, split)) == 6  # the prologue, 4 blocks, the epilogue
    one, two = _losses(one_process_runs / "nanogpt"), _losses(two_rank_runs / "nanogpt")
    assert one.keys() == two.keys() and len(one) >= 4
    assert list(two.values()) == pytest.approx(list(one.values()), rel=1e-5)
    staged = _model(two_rank_runs / "nanogpt")
    assert torch.equal(staged["transformer.wte.weight"], staged["lm_head.weight"])
    _assert_same_parameters(_model(one_process_runs / "nanogpt"), staged)
