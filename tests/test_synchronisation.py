"""Synchronising less, sending less, waiting less (#13): local SGD, gradient compression, the
synchronous and the asynchronous parameter server, the bytes each sends, and commbench's fit.

The runs are shared, as in test_strategies_sharded.py: ONE pair of spawned gloo ranks runs the
ddp variants one after another through the ranks' own entry point (`run_rank`, each with its own
process group) and then steps a DDP model by hand under local SGD to compare the replicas after
every step; the async-ps run (3 ranks: 1 server + 2 workers, through the CLI) goes at the same time.
"""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import free_port, start_ranks, train_spawned

from paratrain.cli import main
from paratrain.commbench import OPERATIONS, TOLERANCE, fit_alpha_beta, fit_regimes, regime_for
from paratrain.engine.flops import cpu_model

# 256 samples / a global batch of 64: 4 optimizer steps.
COMMON = dict(workers=2, epochs=1, synthetic_samples=256, batch_size=32, lr=0.05, log_every=1, checkpoint_every=1)
BACKEND = dict(backend="gloo", device_type="cpu", threads_per_worker=1, allreduce="backend")
SHM = dict(BACKEND, allreduce="shm")
STEPS = 4
SPAWNED = {  # run name -> (the config's overrides, the ranks' placement)
    "ddp": (dict(COMMON), BACKEND),
    # Local SGD whose synchronous warm-up outlasts the run: every step is post_localSGD_hook's all-reduce.
    "local-warm": (dict(COMMON, sync_every=4, sync_warmup=100), BACKEND),
    "reduce-ps": (dict(COMMON, reduce="ps"), BACKEND),
    # fp16 composed with the shared-memory average.
    "fp16-shm": (dict(COMMON, grad_compression="fp16"), SHM),
    "powersgd": (dict(COMMON, grad_compression="powersgd", powersgd_rank=2, powersgd_start=2), BACKEND),
}
LOCAL_SGD_PERIOD = 3


def _spawned_rank(rank: int, out: str, ports: list[int]) -> None:
    train_spawned(rank, Path(out), ports, SPAWNED)
    os.environ["MASTER_PORT"] = str(ports[-1])
    _local_sgd_by_hand(rank, Path(out))


def _local_sgd_by_hand(rank: int, out: Path) -> None:
    """A DDP model under --sync-every 3 stepped by hand; after each step, are the replicas equal?"""
    import torch.distributed as dist

    from paratrain.config import TrainConfig
    from paratrain.engine.distributed import RankContext
    from paratrain.engine.strategies import STRATEGIES

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    strategy = STRATEGIES["ddp"](
        TrainConfig(workers=2, sync_every=LOCAL_SGD_PERIOD),
        RankContext(rank, 2, rank, torch.device("cpu")),
        time.perf_counter,
    )
    model = strategy.wrap(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = strategy.build_optimizer(model, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    data = torch.Generator().manual_seed(rank)  # each rank its own batches: local steps diverge
    identical, sent = [], []
    for _ in range(7):
        model(torch.randn(16, 8, generator=data)).pow(2).mean().backward()
        strategy.optimizer_step(optimizer, scaler)
        optimizer.zero_grad(set_to_none=True)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        both = [torch.empty_like(flat) for _ in range(2)]
        dist.all_gather(both, flat)
        identical.append(bool(torch.equal(both[0], both[1])))
        sent.append(strategy.bytes_sent())
    if rank == 0:
        (out / "local-sgd.json").write_text(
            json.dumps(
                {
                    "identical": identical,
                    "bytes_sent": sent,
                    "parameter_bytes": sum(p.numel() * 4 for p in model.parameters()),
                }
            )
        )
    del model, optimizer, strategy  # DDP before its process group (docs/launch.md)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync")
    cache = tmp_path_factory.getbasetemp() / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARATRAIN_CACHE", str(cache))
        ports = [free_port() for _ in range(len(SPAWNED) + 1)]
        spawned = start_ranks(_spawned_rank, (str(out), ports), nprocs=2, join=False)
        # 1 server + 2 workers on 2 cores, stale-synchronous with S = 0: a worker one update ahead waits.
        # A linear model (tests/user_factories.py): the loss falls within the run's 32 updates.
        async_ps = subprocess.run(
            [
                sys.executable,
                "-m",
                "paratrain",
                "train",
                "--workload",
                "synthetic-cnn",
                "--model",
                "user_factories:tiny_net",
                "--synthetic-shape",
                "3,8,8",
                "--device",
                "cpu",
                "--workers",
                "3",
                "--strategy",
                "async-ps",
                "--max-staleness",
                "0",
                "--allow-oversubscribe",
                "--synthetic-samples",
                "512",
                "--batch-size",
                "16",
                "--lr",
                "0.05",
                "--epochs",
                "1",
                "--log-every",
                "4",
                "--threads-per-worker",
                "1",
                "--run-dir",
                str(out / "async-ps"),
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PARATRAIN_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).parent)},
        )
        while not spawned.join():
            pass
    # Checked by the async-ps test, so that a failure there does not hide the others' results.
    (out / "async-ps.stderr").write_text(async_ps.stderr if async_ps.returncode else "")
    return out


def _summary(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "summary.json").read_text())


def _model(runs: Path, name: str) -> dict:
    return torch.load(runs / name / "checkpoint.pt", weights_only=True)["model"]


def test_local_sgd_warm_up_is_plain_ddp(runs):
    """--sync-every H averages every step's gradients during --sync-warmup, as DDP does (so a run
    whose warm-up covers it, like --sync-every 1, is plain DDP): the same parameters, bit for bit."""
    from paratrain.config import TrainConfig

    # --sync-every 1 is the default: the very configuration of plain DDP, not a variant of it.
    assert TrainConfig(workers=2, sync_every=1).identity() == TrainConfig(workers=2).identity()
    ddp, warm = _model(runs, "ddp"), _model(runs, "local-warm")
    for name in ddp:
        assert torch.equal(ddp[name], warm[name]), name
    summary = _summary(runs, "local-warm")
    assert summary["sync"]["sync_every"] == 4 and summary["allreduce"] == "gloo"
    assert summary["comm_bytes_per_step"] == _summary(runs, "ddp")["comm_bytes_per_step"]


def test_local_sgd_replicas_differ_between_averages_and_agree_after(runs):
    """PeriodicModelAverager averages after steps 1, 4, 7 (its first step, then every 3rd): the
    replicas are identical right after those steps and differ after the others; only those steps send
    (the parameters, once)."""
    record = json.loads((runs / "local-sgd.json").read_text())
    assert record["identical"] == [True, False, False, True, False, False, True]
    steps_sending = [
        i for i, (before, after) in enumerate(zip([0] + record["bytes_sent"], record["bytes_sent"])) if after > before
    ]
    assert steps_sending == [0, 3, 6]
    assert record["bytes_sent"][-1] == 3 * record["parameter_bytes"]


def test_reduce_to_one_rank_equals_allreduce(runs):
    """--reduce ps (reduce to rank 0, broadcast back) trains exactly what the all-reduce trains, and
    rank 0, the server, hands over twice the bytes of the other rank."""
    ddp, ps = _model(runs, "ddp"), _model(runs, "reduce-ps")
    for name in ddp:
        assert torch.equal(ddp[name], ps[name]), name
    summary = _summary(runs, "reduce-ps")
    assert summary["allreduce"] == "reduce+broadcast (gloo)"
    server, worker = summary["comm_bytes_per_step"]
    assert server == 2 * worker == 2 * _summary(runs, "ddp")["comm_bytes_per_step"][1]


def test_fp16_compression_halves_the_bytes_through_shared_memory(runs):
    ddp, fp16 = _summary(runs, "ddp"), _summary(runs, "fp16-shm")
    assert fp16["allreduce"] == "shm" and "fp16" in fp16["sync"]["why"]
    assert [b * 2 for b in fp16["comm_bytes_per_step"]] == ddp["comm_bytes_per_step"]
    parameters = sum(t.numel() for t in _model(runs, "ddp").values())
    assert ddp["comm_bytes_per_step"] == [4 * parameters] * 2  # every gradient, float32, once a step
    assert fp16["train_loss"] < 2.5 and abs(fp16["val_loss"] - ddp["val_loss"]) < 0.01


def test_powersgd_sends_what_its_rank_implies(runs):
    """Vogels et al.: each gradient matrix n x m is sent as P (n x r) and Q (m x r), r = min(n, m, rank),
    where that is worth it (torch: when n*m exceeds twice (n+m)*r); other tensors go whole. The
    first --powersgd-start steps send every gradient whole."""
    rank, start = 2, 2
    whole = compressed = 0
    for tensor in _model(runs, "ddp").values():
        n, m = tensor.shape[0], tensor.numel() // tensor.shape[0]
        r = min(n, m, rank)
        whole += n * m
        compressed += (n + m) * r if 2 * (n + m) * r < n * m else n * m
    expected = 4 * (start * whole + (STEPS - start) * compressed) / STEPS
    summary = _summary(runs, "powersgd")
    assert summary["comm_bytes_per_step"] == [expected, expected]
    assert summary["sync"]["powersgd_rank"] == rank and summary["allreduce"] == "gloo"
    assert compressed < whole / 5


def test_async_parameter_server_trains_within_its_staleness_bound(runs):
    failure = (runs / "async-ps.stderr").read_text()
    assert not failure, failure
    summary = _summary(runs, "async-ps")
    assert summary["status"] == "completed" and summary["strategy"] == "async-ps"
    ps = summary["ps"]
    steps = summary["steps"]
    assert ps["servers"] == 1 and ps["workers"] == 2 and ps["updates"] == 2 * steps
    assert ps["staleness"]["max"] == 0  # --max-staleness 0: never one update ahead
    assert sum(ps["delay"]["counts"].values()) == 2 * steps
    losses = [
        json.loads(line)["loss"]
        for line in (runs / "async-ps" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "step"
    ]
    # 32 updates of a linear classifier on the synthetic classes (each its own mean image).
    assert len(losses) == 4 and all(map(math.isfinite, losses))
    assert losses[-1] < losses[0] / 2 and summary["test_loss"] < 0.5, (losses, summary["test_loss"])
    # Workers push their gradients and the server answers with parameters of the same size.
    worker_bytes, server_bytes = summary["comm_bytes_per_step"][0], summary["comm_bytes_per_step"][2]
    assert worker_bytes > 0 and server_bytes == pytest.approx(2 * worker_bytes)
    assert summary["breakdown"]["comm_s"] > 0  # push and pull are exposed communication


def test_alpha_beta_fit_recovers_the_model_and_reports_its_error():
    sizes = [1024 * 4**k for k in range(10)]
    exact = [(n, 50e-6 + n / 2e9) for n in sizes]
    fit = fit_alpha_beta(exact)
    assert fit["alpha_s"] == pytest.approx(50e-6, rel=1e-6) and fit["beta_bytes_per_s"] == pytest.approx(2e9, rel=1e-6)
    assert max(map(abs, fit["errors"])) < 1e-9
    # +-5 % alternating noise: the fit stays within about that at every size, in relative terms.
    noisy = [(n, t * (1.05 if i % 2 else 0.95)) for i, (n, t) in enumerate(exact)]
    fit = fit_alpha_beta(noisy)
    assert max(map(abs, fit["errors"])) < 0.08
    assert fit["alpha_s"] == pytest.approx(50e-6, rel=0.1) and fit["beta_bytes_per_s"] == pytest.approx(2e9, rel=0.1)


def test_a_line_that_fits_stays_one_regime_and_one_that_cannot_is_split_where_the_regime_changes():
    sizes = [1024 * 4**k for k in range(10)]
    line = [(n, 50e-6 + n / 2e9) for n in sizes]
    fit = fit_regimes(line)
    assert len(fit["regimes"]) == 1 and fit["regimes"][0]["up_to_bytes"] is None
    assert max(map(abs, fit["errors"])) < 1e-9
    # Small messages: 600 us of latency and a fast copy; from 16M on, half the bandwidth and no
    # latency (a buffer past the caches): no single line is within the tolerance of both ends.
    small, large = (lambda n: 600e-6 + n / 20e9), (lambda n: n / 1e9)
    bent = [(n, small(n) if n <= 4 * 2**20 else large(n)) for n in sizes]
    assert max(map(abs, fit_alpha_beta(bent)["errors"])) > TOLERANCE
    fit = fit_regimes(bent)
    low, high = fit["regimes"]
    assert low["up_to_bytes"] == 4 * 2**20 and high["up_to_bytes"] is None
    assert low["alpha_s"] == pytest.approx(600e-6, rel=1e-6) and low["beta_bytes_per_s"] == pytest.approx(
        20e9, rel=1e-6
    )
    assert high["beta_bytes_per_s"] == pytest.approx(1e9, rel=1e-6)
    assert max(map(abs, fit["errors"])) < 1e-9 and len(fit["errors"]) == len(sizes)
    assert regime_for(fit["regimes"], 1e6) is low and regime_for(fit["regimes"], 5 * 2**20) is high
    # Past 32M every call also faults in fresh pages: a third regime, at a quarter of the bandwidth.
    sizes = [1024 * 2**k for k in range(19)]
    three = [(n, small(n) if n <= 4 * 2**20 else large(n) if n <= 32 * 2**20 else n / 0.25e9) for n in sizes]
    assert max(map(abs, fit_regimes(three)["errors"])) < 1e-9
    assert [r["up_to_bytes"] for r in fit_regimes(three)["regimes"]] == [4 * 2**20, 32 * 2**20, None]


def test_commbench_times_cpu_calls_one_by_one_and_takes_the_typical_call(tmp_path):
    """A call delayed now and then (by the machine's scheduling, not the message) must not move the
    typical call, only the mean beside it: on CPU, `_round` times each call alone."""
    import torch.distributed as dist

    from paratrain.commbench import _round

    calls = iter(range(100))

    def run() -> None:  # every fourth call 80 ms, the others 1 ms (a sleep here may wake a few ms late)
        time.sleep(0.080 if next(calls) % 4 == 3 else 0.001)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        typical, mean = _round(run, 12, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    # The median is one of the nine short calls; the mean carries the three long ones (at least 20 ms).
    assert 0.001 <= typical < 0.012
    assert mean >= 3 * 0.080 / 12 and mean == pytest.approx((9 * 0.001 + 3 * 0.080) / 12, rel=0.25)


def test_commbench_measures_every_collective_and_the_plan_reads_its_fit(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert (
        main(["commbench", "--workers", "2", "--max-size", "256K", "--seconds-per-size", "0.02", "--out", str(out)])
        == 0
    )
    capsys.readouterr()
    bench = json.loads(out.read_text())
    assert bench["schema"] == "paratrain.commbench/1" and bench["ranks"] == 2 and bench["backend"] == "gloo"
    series = {(c["op"], c["path"]): c for c in bench["collectives"]}
    assert set(series) == {
        ("all_reduce", "gloo"),
        ("broadcast", "gloo"),
        ("all_gather", "gloo"),
        ("reduce_scatter", "gloo"),
        ("all_reduce", "shm"),
    }  # 2 cores, one pinned to each rank: DDP's shared-memory path too
    for c in series.values():
        assert [p["bytes"] for p in c["points"]] == [1024 * 2**k for k in range(9)]
        assert all(
            p["seconds"] > 0 and p["error"] == pytest.approx((p["fit_seconds"] - p["seconds"]) / p["seconds"])
            for p in c["points"]
        )
        assert c["max_error"] == pytest.approx(max(abs(p["error"]) for p in c["points"]))
    assert bench["fit"]["path"] == "shm" and bench["fit"]["regimes"] == series[("all_reduce", "shm")]["regimes"]
    # the mean calls' line beside the typical one; gloo's collectives also as a step calls them, after compute
    assert all(c["mean_fit"]["alpha_s"] >= 0 for c in series.values())
    assert all(series[(op, "gloo")]["after_compute"]["mean_seconds"] > 0 for op in OPERATIONS)
    assert "after_compute" not in series[("all_reduce", "shm")]
    assert bench["cpu"] == cpu_model()
    assert (
        main(
            [
                "plan",
                "--workload",
                "synthetic-cnn",
                "--device",
                "cpu",
                "--gpus",
                "2",
                "--interconnect",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    link, regime = plan["device"]["intra_node_link"], regime_for(bench["fit"]["regimes"], plan["model"]["param_bytes"])
    assert link["name"] == "commbench:bench.json" and link["base_latency_s"] == pytest.approx(regime["alpha_s"])


@pytest.mark.parametrize(
    "args, wanted",
    [
        (["--sync-every", "0"], "--sync-every"),
        (["--workers", "2", "--grad-compression", "powersgd", "--allreduce", "shm"], "--allreduce shm cannot carry"),
        (["--strategy", "async-ps", "--workers", "1"], "at least 2 ranks"),
        (["--strategy", "async-ps", "--workers", "2", "--ps-ranks", "2"], "--ps-ranks 2 leaves none"),
        (["--strategy", "async-ps", "--workers", "2", "--max-staleness", "-1"], "--max-staleness"),
        (["--strategy", "zero1", "--workers", "2", "--reduce", "ps"], "shards them"),
        pytest.param(
            ["--workers", "2", "--grad-compression", "bf16"],
            "builds with CUDA",
            marks=pytest.mark.skipif(
                torch.version.cuda is not None, reason="a CUDA build of torch accepts the bf16 hook"
            ),
        ),
    ],
)
def test_bad_synchronisation_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, wanted):
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--workload",
            "synthetic-cnn",
            "--device",
            "cpu",
            "--synthetic-samples",
            "64",
            "--threads-per-worker",
            "1",
            "--run-dir",
            str(run_dir),
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and wanted in err and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "args, wanted",
    [
        (["--workers", "1"], "--workers"),
        (["--min-size", "1M", "--max-size", "1K"], "swap them"),
        (["--out", "{tmp}"], "is a directory"),
    ],
)
def test_bad_commbench_input_is_one_line_before_anything_runs(tmp_path, capsys, args, wanted):
    code = main(["commbench", *[a.format(tmp=tmp_path) for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and wanted in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
