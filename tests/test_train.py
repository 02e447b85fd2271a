"""End-to-end training through paratrain.train: real ranks, a real gloo process group."""

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import synthetic

import paratrain
from paratrain.launch.local import RanksFailed
from paratrain.runs import SUMMARY_KEYS, RunDir


def _model_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def _events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in RunDir(run_dir).read_metrics() if e["event"] == kind]


@pytest.mark.parametrize(
    "allreduce, used, bucket_cap_mb", [("shm", "shm", 25.0), ("backend", "gloo", 25.0), ("shm", "shm", 0.01)]
)
def test_ddp_on_two_ranks_equals_one_process_with_the_global_batch(tmp_path, allreduce, used, bucket_cap_mb):
    """2 ranks x batch b must give the parameters one process reaches with batch 2b, whether the
    gradients are averaged through shared memory or through gloo, in one DDP bucket or (10 KB
    buckets: the CNN's gradients in 4 after the first step) in several.

    Tolerance: rtol 1e-4 / atol 1e-6 — the two differ only in float32 summation order (two
    half-batch means averaged by the all-reduce vs one mean), after 8 SGD-momentum steps.
    """
    common = dict(
        epochs=2,
        synthetic_samples=256,
        lr=0.05,
        lr_scaling="linear",
        base_batch_size=64,
        checkpoint_every=2,
        warmup_epochs=1,
    )
    one = paratrain.train(synthetic(tmp_path, run_dir=tmp_path / "one", workers=1, batch_size=64, **common))
    two = paratrain.train(
        synthetic(
            tmp_path,
            run_dir=tmp_path / "two",
            workers=2,
            batch_size=32,
            allreduce=allreduce,
            bucket_cap_mb=bucket_cap_mb,
            **common,
        )
    )
    assert two["allreduce"] == used and one["allreduce"] is None
    assert one["global_batch_size"] == two["global_batch_size"] == 64
    assert one["steps"] == two["steps"] == 8
    a, b = _model_state(tmp_path / "one"), _model_state(tmp_path / "two")
    init = _model_state_at_init(common)
    moved = max((a[k] - init[k]).abs().max().item() for k in a)
    assert moved > 1e-3, "training did not move the parameters: the comparison would prove nothing"
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)


def _model_state_at_init(common: dict) -> dict:
    from paratrain.config import TrainConfig
    from paratrain.workloads import build_model, load_data

    cfg = TrainConfig(workload="synthetic-cnn", synthetic_samples=common["synthetic_samples"])
    return build_model(cfg, load_data(cfg)).state_dict()


def test_gradient_accumulation_on_two_ranks_equals_the_global_batch(tmp_path):
    """DDP with no_sync on all but the last micro-step: 2 ranks x 16 x 2 micro-steps == 1 x 64, the epoch's
    short last step included (288 samples: 4 steps of 64 and one of 32, which is 1 micro-step of 16 a rank,
    the mean of its samples as the one process's batch of 32 is, not half of it)."""
    common = dict(epochs=2, synthetic_samples=288, lr=0.05, lr_scaling="none", checkpoint_every=1)
    paratrain.train(synthetic(tmp_path, run_dir=tmp_path / "one", workers=1, batch_size=64, **common))
    two = paratrain.train(
        synthetic(tmp_path, run_dir=tmp_path / "acc", workers=2, batch_size=16, grad_accum=2, **common)
    )
    assert two["global_batch_size"] == 64 and two["steps"] == 2 * 5
    a, b = _model_state(tmp_path / "one"), _model_state(tmp_path / "acc")
    # Measured as the whole model's relative difference: on an AVX-512 CPU the two agreed element by element
    # to 1e-6; on an AVX2-only one (2026-11-27) they differ by 1.2e-5 after the first epoch's short step and
    # 1.6e-4 after the second (the rounding, which training amplifies about 10x an epoch; without the short
    # step, 256 samples, they agree to 4e-8, not yet explained). A short step weighted as half of one (its
    # loss divided by --grad-accum) differs by 2-3e-3.
    flat = [torch.cat([t.flatten() for k, t in s.items() if t.is_floating_point()]) for s in (a, b)]
    assert (flat[0] - flat[1]).norm() / flat[0].norm() < 5e-4


@pytest.mark.parametrize("rule, factor", [("linear", 2.0), ("sqrt", math.sqrt(2.0))])
def test_lr_scaling_and_warmup_reach_the_documented_lr(tmp_path, rule, factor):
    """Goyal et al.: the LR ramps linearly from --lr to --lr x k over the warmup, then stays."""
    cfg = synthetic(
        tmp_path,
        workers=2,
        batch_size=16,
        lr=0.01,
        lr_scaling=rule,
        base_batch_size=16,
        warmup_epochs=1,
        epochs=2,
        log_every=1,
    )
    summary = paratrain.train(cfg)
    steps_per_epoch = 512 // 2 // 16
    assert summary["lr"] == pytest.approx(0.01 * factor)
    lrs = {e["step"]: e["lr"] for e in _events(cfg["run_dir"], "step")}
    for step in (1, 5, steps_per_epoch, steps_per_epoch + 1, 2 * steps_per_epoch):
        taken = step - 1  # the event after optimizer step `step` reports the LR that step used
        expected = 0.01 + (0.01 * factor - 0.01) * min(taken / steps_per_epoch, 1.0)
        assert lrs[step] == pytest.approx(expected), f"step {step}"


def test_run_directory_holds_the_contract(tmp_path):
    cfg = synthetic(tmp_path, workers=2, epochs=3, val_split=0.25)
    summary = paratrain.train(cfg)
    run = RunDir(cfg["run_dir"])
    on_disk = run.read_summary()
    assert on_disk == json.loads(json.dumps(summary))
    assert set(SUMMARY_KEYS) <= set(on_disk)
    assert on_disk["status"] == "completed" and on_disk["workers"] == 2 and on_disk["strategy"] == "ddp"
    assert len(on_disk["epoch_times_s"]) == 3 and on_disk["timed_epochs"] == 2
    assert on_disk["epoch_time_s"] == pytest.approx(statistics.median(on_disk["epoch_times_s"][1:]))
    assert set(on_disk["breakdown"]) >= {"data_s", "compute_s", "comm_s", "other_s"}
    assert on_disk["breakdown"]["comm_s"] > 0, "DDP all-reduces every step: its exposed time cannot be zero"
    assert len(on_disk["peak_memory_bytes"]) == 2 and min(on_disk["peak_memory_bytes"]) > 10 * 2**20
    assert on_disk["val_split"] == "val"
    config = run.read_config()
    assert config["workers"] == 2 and config["resolved"]["global_batch_size"] == 64
    resolved = config["resolved"]
    assert resolved["val_samples"] + resolved["train_samples"] == 512 and abs(resolved["val_samples"] - 128) <= 10
    epochs = _events(cfg["run_dir"], "epoch")
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    # samples/s in the summary is what the epoch events' own timestamps give
    steady = epochs[1:]
    independent = sum(e["epoch_samples"] for e in steady) / sum(e["time_end"] - e["time_start"] for e in steady)
    assert on_disk["samples_per_s"] == pytest.approx(independent, rel=1e-6)
    evals = _events(cfg["run_dir"], "eval")
    assert {(e["epoch"], e["split"]) for e in evals} == {(i, s) for i in range(3) for s in ("test", "val")}
    test_samples = config["resolved"]["test_samples"]
    assert all(e["samples"] == test_samples for e in evals if e["split"] == "test"), (
        "eval shards must cover the split once"
    )
    assert (run.path / "logs" / "rank0.log").exists() and (run.path / "logs" / "rank1.log").exists()


def test_single_process_breakdown_has_no_communication(tmp_path):
    summary = paratrain.train(synthetic(tmp_path, workers=1))
    b = summary["breakdown"]
    assert b["comm_s"] == 0 and b["compute_s"] > 0 and b["data_s"] > 0
    step_time = summary["epoch_time_s"] / summary["steps_per_epoch"]
    assert sum(b.values()) == pytest.approx(step_time, rel=0.25)


def test_resume_after_a_kill_reproduces_the_uninterrupted_loss_curve(tmp_path):
    common = [
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        "4096",
        "--workers",
        "2",
        "--threads-per-worker",
        "1",
        "--batch-size",
        "32",
        "--epochs",
        "6",
        "--lr",
        "0.02",
        "--augment",
        "flip,crop",
        "--log-every",
        "16",
        "--checkpoint-every",
        "1",
        "--quiet",
    ]
    cli = [sys.executable, "-m", "paratrain", "train", *common]
    subprocess.run([*cli, "--run-dir", str(tmp_path / "full")], check=True, capture_output=True)

    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [*cli, "--run-dir", str(interrupted)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (interrupted / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (interrupted / "summary.json").exists(), "the run finished before it could be interrupted"
    done = torch.load(interrupted / "checkpoint.pt", weights_only=True)["epoch"]
    assert 1 <= done < 6

    resumed = subprocess.run(
        [*cli, "--run-dir", str(interrupted), "--resume", "--json"], check=True, capture_output=True, text=True
    )
    assert json.loads(resumed.stdout)["status"] == "completed"
    full_steps = [(e["step"], e["loss"]) for e in _events(tmp_path / "full", "step")]
    resumed_steps = [(e["step"], e["loss"]) for e in _events(interrupted, "step")]
    assert [s for s, _ in resumed_steps] == [s for s, _ in full_steps], "events lost or repeated across the resume"
    for (step, a), (_, b) in zip(full_steps, resumed_steps):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), f"loss differs at step {step}"
    a, b = _model_state(tmp_path / "full"), _model_state(interrupted)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_bundled_subset_trains_and_learns(tmp_path):
    summary = paratrain.train(
        dict(
            workload="cifar10-cnn",
            workers=2,
            threads_per_worker=1,
            epochs=4,
            batch_size=32,
            lr=0.005,
            run_dir=tmp_path / "run",
            quiet=True,
        )
    )
    assert summary["test_accuracy"] > 0.2, "the tutorial CNN should beat chance (10 %) on the bundled subset"


def test_dataloader_path_feeds_the_same_batches_as_the_in_memory_path(tmp_path):
    common = dict(workers=2, epochs=1, checkpoint_every=1, synthetic_samples=256, augment="flip")
    paratrain.train(synthetic(tmp_path, run_dir=tmp_path / "memory", **common))
    paratrain.train(synthetic(tmp_path, run_dir=tmp_path / "loader", loader_workers=1, **common))
    a, b = _model_state(tmp_path / "memory"), _model_state(tmp_path / "loader")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_bf16_activation_checkpointing_and_a_resnet_train(tmp_path):
    summary = paratrain.train(
        synthetic(
            tmp_path,
            model="resnet18",
            synthetic_shape="3,8,8",
            synthetic_samples=32,
            batch_size=16,
            epochs=1,
            precision="bf16",
            checkpoint_activations=True,
            optimizer="lamb",
            schedule="cosine",
        )
    )
    assert summary["status"] == "completed" and math.isfinite(summary["train_loss"])


def test_user_model_and_dataset_factories(tmp_path):
    summary = paratrain.train(
        dict(
            model="user_factories:tiny_net",
            dataset="user_factories:float_pairs",
            num_classes=2,
            workers=2,
            threads_per_worker=1,
            epochs=3,
            batch_size=16,
            lr=0.05,
            quiet=True,
            run_dir=tmp_path / "run",
        )
    )
    assert summary["status"] == "completed"
    assert summary["test_accuracy"] > 0.7, "a linear model separates this data"


def test_a_failing_rank_fails_the_run_with_one_line_and_a_failed_summary(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paratrain",
            "train",
            "--model",
            "user_factories:exploding_net",
            "--workload",
            "synthetic-cnn",
            "--synthetic-shape",
            "3,8,8",
            "--synthetic-samples",
            "128",
            "--workers",
            "2",
            "--threads-per-worker",
            "1",
            "--run-dir",
            str(run_dir),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "rank 1 failed" in proc.stderr and "boom on rank 1" in proc.stderr
    summary = RunDir(run_dir).read_summary()
    assert summary["status"] == "failed" and "boom on rank 1" in summary["error"]
    assert "boom on rank 1" in (run_dir / "logs" / "rank1.log").read_text()


# Odd-sized held-out sets: the synthetic split in memory (test 51, val 51), and a user's dataset,
# which evaluation reads through a DataLoader (test 63).
HELD_OUT = {
    "in memory": dict(synthetic_samples=255, val_split=0.2),
    "dataloader": dict(model="user_factories:tiny_net", dataset="user_factories:odd_float_pairs", num_classes=2),
}


@pytest.mark.parametrize("held_out", sorted(HELD_OUT))
def test_two_rank_evaluation_equals_one_rank_evaluation_of_the_same_weights(tmp_path, held_out):
    """Split over 2 ranks, every held-out sample counts exactly once (no padding, no overlap), so
    loss and accuracy are those of one rank evaluating the same weights."""
    from paratrain.config import TrainConfig
    from paratrain.engine.distributed import RankContext
    from paratrain.engine.loop import Trainer

    cfg = synthetic(tmp_path, workers=2, epochs=1, checkpoint_every=1, lr=0.05, **HELD_OUT[held_out])
    paratrain.train(cfg)
    resolved = RunDir(cfg["run_dir"]).read_config()["resolved"]
    splits = ["test", "val"] if resolved["val_samples"] else ["test"]
    assert all(resolved[f"{split}_samples"] % 2 == 1 for split in splits)
    two_ranks = {e["split"]: e for e in _events(cfg["run_dir"], "eval")}

    (tmp_path / "one").mkdir()
    one = Trainer(
        TrainConfig.model_validate({**cfg, "workers": 1, "run_dir": tmp_path / "one"}),
        RankContext(0, 1, 0, torch.device("cpu")),
        RunDir(tmp_path / "one"),
    )
    one.strategy.unwrap(one.model).load_state_dict(_model_state(cfg["run_dir"]))  # the weights the 2 ranks evaluated
    one_rank = one.evaluate(epoch=0)
    for sink in one.sinks:
        sink.close()
    for split in splits:
        assert two_ranks[split]["samples"] == one_rank[split]["samples"] == resolved[f"{split}_samples"]
        assert two_ranks[split]["accuracy"] == one_rank[split]["accuracy"]
        assert two_ranks[split]["loss"] == pytest.approx(one_rank[split]["loss"], rel=1e-6)


def _rank_counting_gradient_syncs(config: dict, placement: dict, run_dir: str) -> tuple[int, dict | None]:
    """paratrain's rank entry point with DDP's comm hooks wrapped to count all-reduce rounds (the
    bucket marked last ends a round): the gradient synchronisations of this rank."""
    from paratrain.engine.loop import run_rank
    from paratrain.engine.strategies import ddp

    rounds = []
    for name in ("_backend_allreduce", "_shm_average"):
        # hook= binds this iteration's hook; DDP requires the name `bucket`
        def counting(state, bucket, hook=getattr(ddp, name)):  # noqa: B008
            rounds.append(bucket.is_last())
            return hook(state, bucket)

        setattr(ddp, name, counting)
    summary = run_rank(config, placement, run_dir)
    return sum(rounds), summary


@pytest.mark.parametrize("allreduce, used", [("backend", "gloo"), ("shm", "shm")])
def test_gradient_accumulation_synchronises_once_per_optimizer_step(tmp_path, allreduce, used):
    """8 micro-steps a rank per epoch, grad_accum 3: optimizer steps after micro-steps 3, 6 and 8
    (the epoch's last), so 3 synchronisations per epoch; DDP's no_sync keeps the other 5 local."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from paratrain.config import TrainConfig, validate
    from paratrain.launch.placement import plan_placement

    cfg = validate(
        TrainConfig,
        synthetic(
            tmp_path, workers=2, epochs=2, synthetic_samples=256, batch_size=16, grad_accum=3, allreduce=allreduce
        ),
    )
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    results = elastic_launch(launch, _rank_counting_gradient_syncs)(
        cfg.model_dump(mode="json"), plan_placement(cfg).to_dict(), str(tmp_path / "run")
    )
    summary = results[0][1]
    assert summary["allreduce"] == used and summary["steps"] == 2 * 3
    assert {rank: syncs for rank, (syncs, _) in results.items()} == {0: 6, 1: 6}


def test_resume_restores_the_global_rng_that_dropout_draws_from(tmp_path, monkeypatch):
    """A run that crashed in epoch 2 and resumed from its epoch-1 checkpoint must equal the
    uninterrupted run exactly: the same dropout masks need torch's global RNG restored. One rank
    (in this process, so the three runs take seconds): the RNG state is per process, and the
    2-rank resume test above covers the per-rank bookkeeping."""
    common = dict(
        model="user_factories:dropout_net",
        synthetic_shape="3,8,8",
        synthetic_samples=256,
        workers=1,
        epochs=2,
        batch_size=16,
        lr=0.05,
        checkpoint_every=1,
        log_every=1,
    )
    steps_per_epoch = 256 // 16
    paratrain.train(synthetic(tmp_path, run_dir=tmp_path / "full", **common))

    resumed = synthetic(tmp_path, run_dir=tmp_path / "resumed", **common)
    monkeypatch.setenv("DROPOUT_NET_CRASH_AT", str(steps_per_epoch + 3))
    with pytest.raises(RanksFailed, match=f"crashed at training forward {steps_per_epoch + 3}"):
        paratrain.train(resumed)
    assert torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=True)["epoch"] == 1
    monkeypatch.delenv("DROPOUT_NET_CRASH_AT")
    assert paratrain.train({**resumed, "resume": True})["status"] == "completed"

    full_steps = [(e["step"], e["loss"]) for e in _events(tmp_path / "full", "step")]
    assert [(e["step"], e["loss"]) for e in _events(tmp_path / "resumed", "step")] == full_steps
    a, b = _model_state(tmp_path / "full"), _model_state(tmp_path / "resumed")
    assert all(torch.equal(a[key], b[key]) for key in a), (
        "the resumed run's parameters differ from the uninterrupted run's"
    )
