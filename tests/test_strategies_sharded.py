"""zero1 and fsdp on 2 gloo ranks: the parameters of one process, fsdp checkpoints resharded onto
another number of ranks, and the memory each rank holds.

Every 2-rank launch costs ~10 s of start-up on this 2-core machine (an elastic agent, two fresh
interpreters importing torch), so the runs are shared: one fsdp run goes through `paratrain.train`
(launch, run directory, DCP checkpoints, resume), and zero1, fsdp without resharding and the
memory check run one after another in ONE pair of spawned ranks, through the ranks' own entry point
(`run_rank`, each run with its own gloo process group) and the strategy classes themselves; the
--memory-limit run (the CLI in a subprocess) goes at the same time.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import free_port, start_ranks, synthetic, train_spawned

import paratrain
from paratrain.cli import main
from paratrain.runs import RunDir

# 384 samples / a global batch of 64 = 6 steps an epoch, 18 in all; log every step.
COMMON = dict(
    epochs=3, synthetic_samples=384, lr=0.05, lr_scaling="linear", base_batch_size=64, checkpoint_every=1, log_every=1
)
TWO_RANKS = dict(COMMON, workers=2, batch_size=32)
SPAWNED = {  # run name -> the config's overrides, run by the spawned pair of ranks
    "zero1": dict(TWO_RANKS, strategy="zero1"),
    # ZeRO-2-like, and 2 micro-steps of 16 per optimizer step: accumulation under set_requires_gradient_sync(False).
    "fsdp-keep": dict(TWO_RANKS, strategy="fsdp", reshard_after_forward=False, batch_size=16, grad_accum=2),
}

# Data parallelism on one worker (a scaling study's first point, a script's --workers 1): a process group of one
ONE_WORKER = {
    "ddp-one": dict(strategy="ddp"),
    "ddp-shm-one": dict(strategy="ddp", allreduce="shm"),
    "zero1-one": dict(strategy="zero1"),
}


def _spawned_rank(rank: int, out: str, ports: list[int]) -> None:
    """One of the two spawned ranks: the SPAWNED runs, then the memory check on gpt-small."""
    # zero1 averages through shared memory, as ddp does by default on CPU ranks.
    placement = dict(backend="gloo", device_type="cpu", threads_per_worker=1, allreduce="shm")
    train_spawned(rank, Path(out), ports, {name: (overrides, placement) for name, overrides in SPAWNED.items()})
    os.environ["MASTER_PORT"] = str(ports[-1])
    _memory_of_strategies(rank, Path(out))
    _gradients_after_discarding(rank, Path(out))


def _memory_of_strategies(rank: int, out: Path) -> None:
    """gpt-small (10.8 M parameters) with Adam, one training step under ddp, zero1 and fsdp on a
    2-rank gloo group; what each rank holds, counted by engine.memory.held_bytes."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from paratrain.config import TrainConfig
    from paratrain.engine.distributed import RankContext
    from paratrain.engine.memory import held_bytes
    from paratrain.engine.optim import build_optimizer
    from paratrain.engine.strategies import STRATEGIES
    from paratrain.workloads import gpt

    dist.init_process_group("gloo")
    ctx = RankContext(rank, 2, rank, torch.device("cpu"))
    held = {}
    for name in ("ddp", "zero1", "fsdp"):
        torch.manual_seed(0)
        model = gpt.GPT(gpt.resolve("gpt-small"))
        strategy = STRATEGIES[name](TrainConfig(workers=2, strategy=name, optimizer="adam"), ctx, time.perf_counter)
        wrapped = strategy.wrap(model)
        optimizer = strategy.build_optimizer(wrapped, lambda m: build_optimizer("adam", m, lr=1e-3))
        tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(rank))
        loss = F.cross_entropy(wrapped(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        held[name] = held_bytes(wrapped, optimizer)
        held[name]["model_parameters"] = model.num_params() if name == "ddp" else None
        del wrapped, optimizer, model
    (out / f"memory-rank{rank}.json").write_text(json.dumps(held))
    dist.destroy_process_group()


def _gradients_after_discarding(rank: int, out: Path) -> None:
    """fsdp on the memory check's 2-rank group: a backward under no_sync (the adaptive batch's timing passes,
    engine/loop.py), then discard_gradients, then a synchronised backward; and that backward alone. Each
    rank writes the two sets of its gradient shards."""
    from torch import nn

    from paratrain.config import TrainConfig
    from paratrain.engine.distributed import RankContext
    from paratrain.engine.strategies import STRATEGIES

    ctx = RankContext(rank, 2, rank, torch.device("cpu"))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    grads = {}
    for timed in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        strategy = STRATEGIES["fsdp"](TrainConfig(workers=2, strategy="fsdp"), ctx, time.perf_counter)
        wrapped = strategy.wrap(model)
        optimizer = strategy.build_optimizer(wrapped, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
        if timed:
            with strategy.no_sync(wrapped):
                wrapped(2 * x).square().mean().backward()
            strategy.discard_gradients(wrapped, optimizer)
        wrapped(x).sum().backward()
        grads["after-discarding" if timed else "alone"] = [p.grad.to_local().tolist() for p in wrapped.parameters()]
    (out / f"discarded-rank{rank}.json").write_text(json.dumps(grads))


def _copy_first_checkpoint(run_dir: Path, copy: Path, stop: threading.Event) -> None:
    """Copy the run directory as it is at its first checkpoint (checkpoint.pt, then the DCP
    directory it names, which stays until the save after next), while the run goes on."""
    ckpt = run_dir / "checkpoint.pt"
    while not ckpt.exists() and not stop.is_set():
        time.sleep(0.002)
    if stop.is_set():
        return
    copy.mkdir()
    (copy / "checkpoint.pt").write_bytes(ckpt.read_bytes())
    named = torch.load(copy / "checkpoint.pt", weights_only=True)["dcp"]
    shutil.copytree(run_dir / named, copy / named)
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy(run_dir / name, copy / name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    with pytest.MonkeyPatch.context() as patch:
        # The session's dataset cache (conftest's autouse fixture is function-scoped: not set yet here).
        patch.setenv("PARATRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        _run_all(out)
    return out


def _run_all(out: Path) -> None:
    ports = [free_port() for _ in range(len(SPAWNED) + 1)]
    spawned = start_ranks(_spawned_rank, (str(out), ports), nprocs=2, join=False)
    # A 101 M-parameter gpt (2 blocks 2048 wide; 403 MB of float32 weights) on a few tokens: the weights
    # fit under 1G beside the interpreter's ~300 MiB, the gradients do not.
    limited = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paratrain",
            "train",
            "--workload",
            "gpt-tiny",
            "--n-embd",
            "2048",
            "--n-head",
            "16",
            "--n-layer",
            "2",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
            "--samples-per-epoch",
            "8",
            "--eval-samples",
            "2",
            "--epochs",
            "1",
            "--threads-per-worker",
            "1",
            "--memory-limit",
            "1G",
            "--run-dir",
            str(out / "limited"),
            "--quiet",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    paratrain.train(synthetic(out, run_dir=out / "single", workers=1, batch_size=64, **COMMON))
    for name, layout in ONE_WORKER.items():
        paratrain.train(synthetic(out, run_dir=out / name, workers=1, batch_size=64, **layout, **COMMON))
    stop = threading.Event()
    copier = threading.Thread(target=_copy_first_checkpoint, args=(out / "fsdp", out / "fsdp-at-checkpoint", stop))
    copier.start()
    try:
        paratrain.train(synthetic(out, run_dir=out / "fsdp", strategy="fsdp", **TWO_RANKS))
    finally:
        stop.set()
        copier.join()
    # The copy resumes on ONE rank with the same global batch (1 x 64 instead of 2 x 32).
    paratrain.train(
        synthetic(
            out,
            run_dir=out / "fsdp-at-checkpoint",
            strategy="fsdp",
            resume=True,
            **dict(COMMON, workers=1, batch_size=64),
        )
    )
    (out / "limited.err").write_text(limited.communicate()[1] + f"exit {limited.returncode}")
    while not spawned.join():
        pass


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model's parameters in a run's last checkpoint: checkpoint.pt's, or (fsdp) the DCP shards
    read back into full tensors in this process."""
    import torch.distributed.checkpoint as dcp

    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    if "dcp" not in ckpt:
        return ckpt["model"]
    full = {name: torch.empty_like(t) for name, t in _params(run_dir.parent / "single").items()}
    dcp.load({"model": full}, checkpoint_id=run_dir / ckpt["dcp"], no_dist=True)
    return full


def _losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in RunDir(run_dir).read_metrics() if e["event"] == "step"}


@pytest.mark.parametrize("name", ["zero1", "fsdp", "fsdp-keep"])
def test_two_sharded_ranks_reach_the_parameters_of_one_process(runs, name):
    """2 ranks x batch 32 (fsdp-keep: 2 x 16 x 2 micro-steps) == 1 process x 64, after 18 SGD-momentum
    steps. Tolerance rtol 1e-4 / atol 1e-6, as for DDP: the runs differ only in float32 summation
    order (two half-batch gradients averaged by an all-reduce or reduce-scatter vs one mean)."""
    single, sharded = _params(runs / "single"), _params(runs / name)
    summary = json.loads((runs / name / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 18 and summary["global_batch_size"] == 64
    init = _params_at_init()
    assert max((single[k] - init[k]).abs().max().item() for k in single) > 1e-3, "training did not move the parameters"
    assert single.keys() == sharded.keys()
    for key in single:
        torch.testing.assert_close(sharded[key], single[key], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ONE_WORKER)
def test_data_parallelism_on_one_worker_trains_as_one_process_does(runs, name):
    """ddp (through the backend or shared memory) and zero1 on one worker, which failed before 2026-12-01 (DDP
    wrapped a model outside any process group): the same 18 steps to the same parameters as --strategy single."""
    summary = json.loads((runs / name / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 18, summary.get("error")
    single, one = _params(runs / "single"), _params(runs / name)
    assert single.keys() == one.keys()
    for key in single:
        torch.testing.assert_close(one[key], single[key], rtol=1e-5, atol=1e-7)


def _params_at_init() -> dict[str, torch.Tensor]:
    from paratrain.config import TrainConfig
    from paratrain.workloads import build_model, load_data

    cfg = TrainConfig(workload="synthetic-cnn", synthetic_samples=COMMON["synthetic_samples"])
    return build_model(cfg, load_data(cfg)).state_dict()


def test_an_fsdp_checkpoint_of_two_ranks_resumes_on_one_and_continues_the_curve(runs):
    """The copy taken at the 2-rank run's first checkpoint, resumed on 1 rank with the same global
    batch, logs the uninterrupted 2-rank run's losses step for step and ends at its parameters
    (rtol 1e-4: one rank sums 64 per-sample losses where two ranks sum 32 each, float32 order)."""
    resumed = RunDir(runs / "fsdp-at-checkpoint").read_summary()
    assert resumed["status"] == "completed" and resumed["workers"] == 1 and resumed["strategy"] == "fsdp"
    full, after = _losses(runs / "fsdp"), _losses(runs / "fsdp-at-checkpoint")
    assert sorted(after) == sorted(full) == list(range(1, 19)), "steps lost or repeated across the resume"
    logs = (runs / "fsdp-at-checkpoint" / "logs" / "rank0.log").read_text()
    assert "resumed after epoch" in logs and "resumed after epoch 3" not in logs, "the copy was not taken mid-run"
    for step in full:
        assert after[step] == pytest.approx(full[step], rel=1e-4), f"loss differs at step {step}"
    a, b = _params(runs / "fsdp"), _params(runs / "fsdp-at-checkpoint")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-6)


def test_memory_per_rank_shrinks_with_fsdp_and_zero1(runs):
    """gpt-small with Adam on 2 ranks: fsdp holds at most 0.55x of ddp's parameters + gradients +
    optimizer state per rank, zero1 at most 0.55x of ddp's optimizer state; ddp holds the whole
    model (4 bytes a parameter for each of parameters and gradients, 8 for Adam's two moments)."""
    ranks = [json.loads((runs / f"memory-rank{rank}.json").read_text()) for rank in (0, 1)]
    # Counted from what each rank holds: the two ranks' shards and partitions add up to the whole.
    whole = ranks[0]["ddp"]
    for name, figure in (
        ("fsdp", "parameters_bytes"),
        ("fsdp", "gradients_bytes"),
        ("fsdp", "optimizer_bytes"),
        ("zero1", "optimizer_bytes"),
    ):
        assert sum(r[name][figure] for r in ranks) == pytest.approx(whole[figure], rel=0.01), (name, figure)
    for rank, held in enumerate(ranks):
        ddp, zero1 = held["ddp"], held["zero1"]
        params = ddp["model_parameters"]
        assert params >= 10_000_000
        assert ddp["parameters_bytes"] == pytest.approx(4 * params, rel=0.01)
        assert ddp["gradients_bytes"] == pytest.approx(4 * params, rel=0.01)
        assert ddp["optimizer_bytes"] == pytest.approx(8 * params, rel=0.01)
        total = {name: h["parameters_bytes"] + h["gradients_bytes"] + h["optimizer_bytes"] for name, h in held.items()}
        assert total["fsdp"] <= 0.55 * total["ddp"], (rank, total)
        assert zero1["optimizer_bytes"] <= 0.55 * ddp["optimizer_bytes"], (rank, zero1, ddp)
        assert zero1["parameters_bytes"] == ddp["parameters_bytes"]


def test_fsdp_discards_the_gradients_a_timing_pass_left_unsynchronised(runs):
    """A backward under no_sync leaves FSDP holding unsharded gradients that the next reduce-scatter would add
    in; after discard_gradients the next step's gradients are exactly those of the step alone (the adaptive
    batch times passes at the next batch between steps)."""
    for rank in (0, 1):
        grads = json.loads((runs / f"discarded-rank{rank}.json").read_text())
        assert any(any(row) for row in grads["alone"]), "no gradient to compare"
        assert grads["after-discarding"] == grads["alone"], rank


def test_summaries_report_memory_per_rank(runs):
    """summary.json's memory block, end to end: per-rank lists; fsdp's ranks hold half the CNN's
    parameters, zero1's ranks together the optimizer state of one process; activations and RSS seen."""
    single = RunDir(runs / "single").read_summary()["memory"]
    fsdp = RunDir(runs / "fsdp").read_summary()["memory"]
    zero1 = json.loads((runs / "zero1" / "summary.json").read_text())["memory"]
    for block in (single, fsdp, zero1):
        assert set(block) == {
            "parameters_bytes",
            "gradients_bytes",
            "optimizer_bytes",
            "activations_peak_bytes",
            "rss_peak_bytes",
        }
        assert all(len(values) == len(block["rss_peak_bytes"]) for values in block.values())
        assert min(block["activations_peak_bytes"]) > 0 and min(block["rss_peak_bytes"]) > 100 * 2**20
    whole = single["parameters_bytes"][0]
    assert single["optimizer_bytes"] == [whole]  # SGD's momentum: one buffer a parameter
    assert all(b <= 0.55 * whole for b in fsdp["parameters_bytes"] + fsdp["gradients_bytes"] + fsdp["optimizer_bytes"])
    assert sum(zero1["optimizer_bytes"]) == whole and max(zero1["optimizer_bytes"]) < whole
    # Half the batch per rank: about half of one process's saved activations; and a true peak, not a
    # sum: fsdp-keep's two micro-steps of 16 hold a quarter batch's at a time (the first micro-step's
    # are released by its backward before the second saves its own).
    assert max(fsdp["activations_peak_bytes"]) <= 0.55 * single["activations_peak_bytes"][0]
    keep = json.loads((runs / "fsdp-keep" / "summary.json").read_text())["memory"]
    assert max(keep["activations_peak_bytes"]) <= 0.55 * min(fsdp["activations_peak_bytes"])


def _cli(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_a_shard_unit_the_model_lacks_is_refused(tmp_path, capsys):
    code, err = _cli(
        capsys,
        [
            "train",
            "--workload",
            "synthetic-cnn",
            "--strategy",
            "fsdp",
            "--workers",
            "2",
            "--shard-unit",
            "NoSuchClass",
            "--run-dir",
            str(tmp_path / "run"),
        ],
    )
    assert code == 2 and err.count("\n") == 1 and "--shard-unit NoSuchClass" in err and "Conv2d" in err, err
    assert not (tmp_path / "run").exists()


def test_an_fsdp_resume_onto_a_different_model_is_refused(runs, capsys):
    run_dir = runs / "fsdp"
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    code, err = _cli(
        capsys,
        [
            "train",
            "--workload",
            "synthetic-cnn",
            "--model",
            "resnet18",
            "--strategy",
            "fsdp",
            "--workers",
            "1",
            "--batch-size",
            "64",
            "--synthetic-samples",
            "384",
            "--epochs",
            "3",
            "--lr",
            "0.05",
            "--base-batch-size",
            "64",
            "--threads-per-worker",
            "1",
            "--run-dir",
            str(run_dir),
            "--resume",
        ],
    )
    assert code == 2 and err.count("\n") == 1 and "different configuration" in err and "--model" in err, err
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before, "the refused resume wrote something"


def test_a_checkpoint_whose_shards_are_missing_is_refused(runs, tmp_path, capsys):
    """checkpoint.pt names its DCP directory; without it (a copy that left it behind) --resume is
    refused before anything starts, instead of failing in the ranks."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("checkpoint.pt", "config.json"):
        shutil.copy(runs / "fsdp" / name, copy / name)
    code, err = _cli(
        capsys,
        [
            "train",
            "--workload",
            "synthetic-cnn",
            "--strategy",
            "fsdp",
            "--workers",
            "2",
            "--batch-size",
            "32",
            "--synthetic-samples",
            "384",
            "--epochs",
            "3",
            "--lr",
            "0.05",
            "--base-batch-size",
            "64",
            "--threads-per-worker",
            "1",
            "--run-dir",
            str(copy),
            "--resume",
        ],
    )
    assert code == 2 and err.count("\n") == 1 and "missing or incomplete" in err, err
    assert sorted(p.name for p in copy.iterdir()) == ["checkpoint.pt", "config.json"]


def test_a_rank_over_the_memory_limit_ends_the_run_with_one_line(runs):
    """--memory-limit (RLIMIT_DATA in the rank's own process, even for one worker): the allocation
    that crosses it fails, and the run ends with one line naming the limit and the remedy."""
    err = (runs / "limited.err").read_text()
    message, status = err.rsplit("exit ", 1)
    assert status == "1" and message.count("\n") == 1, err
    assert "--memory-limit 1G" in message and "--strategy fsdp" in message and "pipeline" in message
    log = (runs / "limited" / "logs" / "rank0.log").read_text()
    assert "can't allocate memory" in log and "backward" in log, "it must fail where the gradients are allocated"
    assert RunDir(runs / "limited").read_summary()["status"] == "failed"
