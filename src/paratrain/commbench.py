"""`paratrain commbench`: how long collectives take here, and the alpha-beta model that fits them.

N local ranks (pinned as training ranks are, under PyTorch's elastic launcher) time all-reduce,
broadcast, all-gather and reduce-scatter on the process group's backend, and the shared-memory
average that DDP uses between CPU ranks (engine/shm_allreduce.py), over message sizes from
--min-size to --max-size in steps of 2x. Sizes follow nccl-tests' convention: the whole buffer
(all-reduce and broadcast: the tensor; all-gather: the gathered output; reduce-scatter: the
input), float32. Each size is warmed up, then timed in rounds of back-to-back repetitions between
barriers, each round taking the sizes in its own order; a round's time is the slowest rank's
typical call (on CPU the median call, each timed alone; on a GPU the mean), and the collective's
time the median round. The mean call is kept beside it.

Each collective's times are fitted to t(n) = alpha + n / beta (Hockney's latency-bandwidth
model), minimising the relative error at every size, since the sizes span five orders of
magnitude. Where one line misses some size by more than TOLERANCE, the sizes are split in two or
three regimes, each its own alpha-beta line, where they fit best: a collective library switches
algorithm and protocol with the message size (Thakur, Rabenseifner & Gropp 2005: short and long
messages take different algorithms in MPICH), and a buffer outgrows the caches or glibc's mmap
threshold (32 MiB at most), past which each call faults in fresh pages. The result keeps each
size's error so the fit can be judged where it is used. The mean calls are fitted too (`mean_fit`): a training
step pays every call of its loop.

On CPU, each collective is also timed as a training step calls it (`after_compute`): at AFTER_COMPUTE_BYTES,
each call after the same AFTER_COMPUTE_S of matrix products on every rank. Back to back, gloo's threads are
awake and the ranks arrive together; after compute, a call also pays the threads' wake-up, and every rank but
the last waits for the last to arrive (two cores never finish the same work at the same moment). Kept apart: the
mean call of the rank that arrived last, into a buffer not touched before (as FSDP2's gathers write), and how far
the last arrival lags the ranks' mean arrival, after LAG_COMPUTE_S, as a share of that compute (`arrival_lag`).
`paratrain plan` prices a CPU rank's collectives with both (plan/links.py).

A command of its own, above the launcher in the layers (pyproject.toml's import-linter contract):
it places and starts ranks with launch's helpers, and plan reads its fits.
"""

from __future__ import annotations

import datetime as _dt
import functools
import itertools
import math
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from paratrain.config import CommbenchConfig, parse_size
from paratrain.engine.distributed import Placement, init_rank, shutdown
from paratrain.engine.flops import cpu_model
from paratrain.engine.shm_allreduce import open_shared_average
from paratrain.errors import RunFailed
from paratrain.launch.placement import available_cores, check_gpus, core_sets, resolve_backend, resolve_device
from paratrain.runs import write_json

SCHEMA = "paratrain.commbench/1"
OPERATIONS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
SIZE_FACTOR = 2  # nccl-tests' usual -f 2: each size twice the last
ROUNDS = 7
# A fit that misses no measured size by more than this is one line; otherwise more regimes are tried.
TOLERANCE = 0.15
MAX_REGIMES = 3
# A regime has at least this many sizes: one more than its two parameters, so each is checked by a
# size it was not solved from.
REGIME_MIN_SIZES = 3
# A collective as a training step calls it: after this much compute on each rank (a unit's forward at a small
# batch), at this size (an FSDP unit of a small transformer), this many calls.
AFTER_COMPUTE_S = 0.01
AFTER_COMPUTE_BYTES = 2**20
AFTER_COMPUTE_CALLS = 100
LAG_COMPUTE_S = 0.1
LAG_CALLS = 30
LAG_GROUPS = 5
# nccl-tests PERFORMANCE.md: bus bandwidth = algorithm bandwidth x this factor, comparable across ops.
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def default_path(backend: str, device: str, workers: int, cache_dir: Path | None = None) -> Path:
    from paratrain.workloads.datasets import default_cache_dir

    return (cache_dir or default_cache_dir()) / "commbench" / f"{backend}-{device}-w{workers}.json"


def message_sizes(smallest: int, largest: int) -> list[int]:
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= SIZE_FACTOR
    return sizes


def run_commbench(cfg: CommbenchConfig) -> dict[str, Any]:
    """Measure, fit, write the JSON file; returns what was written (with `path`)."""
    cuda = resolve_device(cfg.device)
    backend = resolve_backend(cfg.backend, cuda)
    if cuda:
        check_gpus(cfg.workers)
        threads, cpu_sets = cfg.threads_per_worker or 1, None
    else:
        threads, cpu_sets = core_sets(cfg.workers, cfg.threads_per_worker, cfg.allow_oversubscribe, available_cores())
    placement = Placement(
        backend=backend,
        device_type="cuda" if cuda else "cpu",
        threads_per_worker=threads,
        cpu_sets=cpu_sets,
        allreduce="backend",
    )
    out = cfg.out or default_path(backend, placement.device_type, cfg.workers)
    out.parent.mkdir(parents=True, exist_ok=True)
    sizes = message_sizes(parse_size(cfg.min_size), parse_size(cfg.max_size))
    # The shared-memory average is DDP's path only between CPU ranks that own their cores.
    with_shm = not cuda and cpu_sets is not None
    timings, after_compute, lag = _measure(cfg.workers, placement, sizes, cfg.seconds_per_size, with_shm)
    collectives = [
        _fitted(op, path, measured, cfg.workers, after_compute.get(op) if path == backend else None)
        for (op, path), measured in timings.items()
    ]
    training_path = "shm" if with_shm else backend
    allreduce = next(c for c in collectives if c["op"] == "all_reduce" and c["path"] == training_path)
    result = {
        "schema": SCHEMA,
        "ranks": cfg.workers,
        "backend": backend,
        "device": placement.device_type,
        "threads_per_worker": threads,
        "pinned": cpu_sets is not None,
        "torch": torch.__version__,
        "host": platform.node(),
        "cpu": cpu_model(),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # The all-reduce on the path DDP averages gradients with here: what a planner models a step with.
        "fit": {
            "op": "all_reduce",
            "path": training_path,
            "alpha_s": allreduce["alpha_s"],
            "beta_bytes_per_s": allreduce["beta_bytes_per_s"],
            "line_max_error": allreduce["line_max_error"],
            "regimes": allreduce["regimes"],
            "max_error": allreduce["max_error"],
            "ranks": cfg.workers,
        },
        "collectives": collectives,
        # CPU: how far the last rank to arrive lags the ranks' mean arrival, a share of the compute before it
        **({"arrival_lag": {"compute_s": LAG_COMPUTE_S, "share": lag}} if lag is not None else {}),
    }
    write_json(out, result)
    return {**result, "path": str(out)}


def _measure(
    workers: int, placement: Placement, sizes: list[int], seconds: float, with_shm: bool
) -> tuple[dict[tuple[str, str], list[tuple[int, float, float]]], dict[str, dict[str, float]], float | None]:
    """Every collective timed at every size on `workers` ranks started by the elastic launcher: rank 0's (bytes,
    typical seconds, mean seconds) per (collective, path); and on CPU, each collective after compute, and the
    last rank's lag (_after_compute)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from paratrain.launch.local import failure_line, quiet_elastic_logs, scoped_environ, worker_env

    quiet_elastic_logs()
    # The agent's per-rank files go to a directory removed afterwards, never left in /tmp.
    with (
        tempfile.TemporaryDirectory(prefix="paratrain-commbench-") as logs,
        scoped_environ(worker_env(placement.threads_per_worker)),
    ):
        launch = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=workers,
            run_id=str(uuid.uuid4()),
            rdzv_backend="c10d",
            rdzv_endpoint="localhost:0",
            max_restarts=0,
            monitor_interval=0.1,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=logs),
        )
        try:
            results = elastic_launch(launch, _bench_rank)(placement.to_dict(), sizes, seconds, with_shm)
        except ChildFailedError as exc:
            rank, failure = min(exc.failures.items())
            message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
            reason = failure_line(message) or f"exit code {failure.exitcode}"
            raise RunFailed(f"commbench: rank {rank} failed: {reason}; nothing was saved") from None
    return results[0]


def _fitted(
    op: str, path: str, measured: list[tuple[int, float, float]], ranks: int, after_compute: dict[str, float] | None
) -> dict[str, Any]:
    """One collective's entry: its straight alpha-beta line, its regimes, the line through its mean calls, its
    calls after compute (CPU), and every size measured (typical and mean seconds, algorithm and bus bandwidth,
    the fit and its error)."""
    points = [(n, typical) for n, typical, _ in measured]
    line, fit = fit_alpha_beta(points), fit_regimes(points)
    mean = fit_alpha_beta([(n, mean) for n, _, mean in measured])
    return {
        "mean_fit": {"alpha_s": mean["alpha_s"], "beta_bytes_per_s": mean["beta_bytes_per_s"]},
        **({"after_compute": after_compute} if after_compute else {}),
        "op": op,
        "path": path,
        "alpha_s": line["alpha_s"],
        "beta_bytes_per_s": line["beta_bytes_per_s"],
        "line_max_error": _largest(line["errors"]),
        "regimes": fit["regimes"],
        "max_error": _largest(fit["errors"]),
        "points": [
            {
                "bytes": n,
                "seconds": t,
                "mean_seconds": mean,
                "algbw_bytes_per_s": n / t,
                "busbw_bytes_per_s": n / t * BUS_FACTOR[op](ranks),
                "fit_seconds": f,
                "error": e,
            }
            for (n, t, mean), f, e in zip(measured, fit["fitted"], fit["errors"])
        ],
    }


def _bench_rank(placement: dict[str, Any], sizes: list[int], seconds: float, with_shm: bool) -> dict:
    ctx = init_rank(Placement(**placement))
    try:
        device, world = ctx.device, ctx.world_size
        shm = open_shared_average(ctx.rank, world) if with_shm else None
        timings: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
        backend = dist.get_backend()
        for op in OPERATIONS:
            timings[(op, backend)] = [
                (n, *t)
                for n, t in zip(sizes, _time_sizes([_collective(op, n, world, device) for n in sizes], seconds, device))
            ]
        if shm is not None:

            def average(n: int) -> Callable[[], Any]:
                flat = torch.ones(n // 4, device=device)
                return lambda: shm.average_(flat)

            timings[("all_reduce", "shm")] = [
                (n, *t) for n, t in zip(sizes, _time_sizes([average(n) for n in sizes], seconds, device))
            ]
        after, lag = ({}, None) if device.type == "cuda" else _after_compute(world, device)
        return (timings, after, lag) if ctx.is_main else ({}, {}, None)
    finally:
        shutdown()


def _after_compute(world: int, device: torch.device) -> tuple[dict[str, dict[str, float]], float]:
    """Each collective at AFTER_COMPUTE_BYTES called after AFTER_COMPUTE_S of matrix products, the same number of
    them on every rank (rank 0's count for that time): per collective, the mean call of the rank that arrived last
    (it waits for no one: the call's own cost, the threads' wake-up included). And how far the last rank to arrive
    lags the ranks' mean arrival, after LAG_COMPUTE_S of the same products, as a share of that compute: what every
    rank but the last waits, on average (measured on the longer compute of a large batch's units, where it counts:
    after 10 ms it came out a larger share, 2-4 %, than a step's lag at 64 samples a rank, about 2 %)."""
    a = torch.randn(128, 128, device=device)
    start, products = time.perf_counter(), 0
    while time.perf_counter() - start < AFTER_COMPUTE_S:
        a @ a
        products += 1
    count = torch.tensor([products], device=device)
    dist.broadcast(count, src=0)
    result = {}
    for op in OPERATIONS:
        _collective(op, AFTER_COMPUTE_BYTES, world, device)()
        # a result buffer of its own for every call, never written before it, as FSDP2 allocates its gathers'
        fresh = functools.partial(_collective, op, AFTER_COMPUTE_BYTES, world, device, fresh_result=True)
        begun, arrived, ended = _after_products(fresh, int(count.item()), AFTER_COMPUTE_CALLS, a, world)
        last = arrived.argmax(dim=0, keepdim=True)
        result[op] = {
            "bytes": AFTER_COMPUTE_BYTES,
            "compute_s": AFTER_COMPUTE_S,
            "mean_seconds": float((ended.gather(0, last) - arrived.gather(0, last)).mean()),
        }
    one = torch.ones(1, device=device)
    lag_products = int(count.item() * LAG_COMPUTE_S / AFTER_COMPUTE_S)
    begun, arrived, _ = _after_products(lambda: lambda: dist.all_reduce(one), lag_products, LAG_CALLS, a, world)
    return result, lag_share(begun, arrived, LAG_GROUPS)


def lag_share(begun: torch.Tensor, arrived: torch.Tensor, groups: int) -> float:
    """How far the last rank's arrival lags the ranks' mean arrival, as a share of the compute before it (ranks x
    calls of compute starts and arrivals): pooled over each of `groups` runs of consecutive calls (a mean of
    per-call shares lets a descheduled call weigh more than its time), the median group's. One stretch of a VM's
    two cores running apart must not stand for the machine: 20 calls pooled gave 0.7, 0.75, 0.9, 2.2, 3.1 and 18 %
    in six runs within five minutes here (2026-12-01), and the plan multiplies every CPU step's compute by it."""
    lag = arrived.max(dim=0).values - arrived.mean(dim=0)
    compute = (arrived - begun).mean(dim=0)
    shares = [float(lg.sum() / c.sum()) for lg, c in zip(lag.chunk(groups), compute.chunk(groups))]
    return statistics.median(shares)


def _after_products(
    make_call: Callable[[], Callable[[], Any]], products: int, repeats: int, a: torch.Tensor, world: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`repeats` times: a call made, a barrier, `products` matrix products of `a`, the call. Every rank's (compute
    start, arrival at the call, the call's end), ranks x repeats, on one clock: perf_counter is CLOCK_MONOTONIC,
    the host's."""
    own = torch.zeros(3, repeats, dtype=torch.float64)
    for i in range(repeats):
        call = make_call()
        dist.barrier()
        own[0, i] = time.perf_counter()
        for _ in range(products):
            a @ a
        own[1, i] = time.perf_counter()
        call()
        own[2, i] = time.perf_counter()
    every = [torch.zeros_like(own).to(a.device) for _ in range(world)]
    dist.all_gather(every, own.to(a.device))
    return tuple(torch.stack([e[k].cpu() for e in every]) for k in range(3))  # type: ignore[return-value]


def _collective(
    op: str, nbytes: int, world: int, device: torch.device, fresh_result: bool = False
) -> Callable[[], Any]:
    """A call of `op` on `nbytes` in all; with `fresh_result`, what it writes (an all-gather's whole, a
    reduce-scatter's part) newly allocated and never touched, so that the call pays its pages' first touch."""
    elements = max(world, nbytes // 4 // world * world)  # a whole number of float32 per rank
    make = torch.empty if fresh_result else torch.ones
    whole = (make if op == "all_gather" else torch.ones)(elements, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(whole)
    if op == "broadcast":
        return lambda: dist.broadcast(whole, src=0)
    part = (torch.ones if op == "all_gather" else make)(elements // world, device=device)
    if op == "all_gather":
        return lambda: dist.all_gather_single(whole, part)
    return lambda: dist.reduce_scatter_single(part, whole)


def _time_sizes(
    runs: list[Callable[[], Any]], seconds: float, device: torch.device, rounds: int = ROUNDS
) -> list[tuple[float, float]]:
    """(typical, mean) seconds of one call of each of `runs` (one per size): the median over
    `rounds` of the slowest rank's typical and mean call in back-to-back repetitions (the median
    round, so that a round another process interrupted does not count); every rank runs the same
    repetitions. The rounds go over the sizes in turn, so that a noisy second of the machine costs
    one round of many sizes rather than every round of one. A tenth of the time goes to warming each
    size up first (connections, buffers, the backend's threads): one call was not enough, the first
    size timed came out slowest. The buffers of every size are alive together: about twice the
    largest size (docs/synchronisation.md)."""
    repeats = []
    for run in runs:
        once = _round(run, 1, device)[1]
        _round(run, max(2, min(200, math.ceil(seconds / 10 / max(once, 1e-9)))), device)
        repeats.append(max(1, min(400, math.ceil(seconds / rounds / max(once, 1e-9)))))
    times: list[list[tuple[float, float]]] = [[] for _ in runs]
    for round_index in range(rounds):
        # Each round takes the sizes in its own order, the same on every rank: the first size after
        # the largest came out slower, and a place in the order must not favour a size.
        for i in random.Random(round_index).sample(range(len(runs)), len(runs)):
            times[i].append(_round(runs[i], repeats[i], device))
    return [(statistics.median(t for t, _ in size), statistics.median(m for _, m in size)) for size in times]


def _round(run: Callable[[], Any], repeats: int, device: torch.device) -> tuple[float, float]:
    """(typical, mean) seconds of one call over `repeats` calls, the slowest rank's. On a GPU both
    are the mean of calls timed together (nccl-tests' way: a synchronisation per call would cost
    more than a small collective). On CPU the backend's collectives block, so each call is timed
    alone and the typical call is the median: on this machine a varying share of gloo's calls (10-25 %
    in benchmarks/gloo_call_latency.py's runs) takes 3-8 ms instead of 0.3 ms at every size, a delay
    of the machine's scheduling, not of the message, and the mean follows that share."""
    dist.barrier()
    if device.type == "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        _sync(device)
        typical = mean = (time.perf_counter() - start) / repeats
    else:
        calls = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            calls.append(time.perf_counter() - start)
        typical, mean = statistics.median(calls), statistics.fmean(calls)
    slowest = torch.tensor([typical, mean], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest[0].item(), slowest[1].item()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_alpha_beta(points: list[tuple[int, float]]) -> dict[str, Any]:
    """Least squares of t = alpha + n * g (g = 1/beta) in relative error: rows (1/t, n/t) . (alpha, g) = 1.

    alpha and g are kept non-negative (a negative latency or an infinite bandwidth is no model):
    when the free fit gives one below zero it is refitted with that term at zero.
    """
    sizes = torch.tensor([float(n) for n, _ in points], dtype=torch.float64)
    times = torch.tensor([t for _, t in points], dtype=torch.float64)
    design = torch.stack([1 / times, sizes / times], dim=1)
    ones = torch.ones_like(times)
    alpha, g = torch.linalg.lstsq(design, ones.unsqueeze(1)).solution.squeeze(1).tolist()
    if alpha < 0:
        alpha, g = 0.0, float((design[:, 1] @ ones) / (design[:, 1] @ design[:, 1]))
    elif g <= 0:
        alpha, g = float((design[:, 0] @ ones) / (design[:, 0] @ design[:, 0])), 0.0
    fitted = (alpha + sizes * g).tolist()
    return {
        "alpha_s": alpha,
        "beta_bytes_per_s": 1 / g if g > 0 else None,
        "fitted": fitted,
        "errors": [(f - t) / t for f, t in zip(fitted, times.tolist())],
    }


def fit_regimes(points: list[tuple[int, float]]) -> dict[str, Any]:
    """The fewest alpha-beta lines, one per regime of consecutive sizes (REGIME_MIN_SIZES or more
    each, MAX_REGIMES at most), that fit every size within TOLERANCE; if none does, the split whose
    worst size fits best. `regimes`: [{"up_to_bytes" (the regime's largest measured size; None for
    the last, which takes every larger message), "alpha_s", "beta_bytes_per_s"}], smallest sizes first."""
    points = sorted(points)
    best: tuple[float, list[dict[str, Any]], list[int]] | None = None
    for count in range(1, MAX_REGIMES + 1):
        for inner in itertools.combinations(range(REGIME_MIN_SIZES, len(points) - REGIME_MIN_SIZES + 1), count - 1):
            cuts = [0, *inner, len(points)]
            if count > 1 and any(b - a < REGIME_MIN_SIZES for a, b in itertools.pairwise(cuts)):
                continue
            fits = [fit_alpha_beta(points[a:b]) for a, b in itertools.pairwise(cuts)]
            worst = max(_largest(f["errors"]) for f in fits)
            if best is None or worst < best[0]:
                best = (worst, fits, cuts)
        if best is not None and best[0] <= TOLERANCE:
            break
    _, fits, cuts = best  # count 1 always gives a line
    regimes = [
        {
            "up_to_bytes": points[end - 1][0] if end < len(points) else None,
            "alpha_s": f["alpha_s"],
            "beta_bytes_per_s": f["beta_bytes_per_s"],
        }
        for f, end in zip(fits, cuts[1:])
    ]
    return {
        "regimes": regimes,
        "fitted": [x for f in fits for x in f["fitted"]],
        "errors": [e for f in fits for e in f["errors"]],
    }


def regime_for(regimes: list[dict[str, Any]], nbytes: float) -> dict[str, Any]:
    """The regime a message of `nbytes` falls in: the first whose largest size it does not exceed."""
    return next(r for r in regimes if r["up_to_bytes"] is None or nbytes <= r["up_to_bytes"])


def _largest(errors: list[float]) -> float:
    return max(abs(e) for e in errors)
