"""`paratrain find-batch`: the largest per-worker batch that fits, and the throughput knee.

Search (Lightning's `BatchSizeFinder`, mode `binsearch`): double the batch from 1 until a probe
runs out of memory, then bisect between the last batch that fitted and the first that did not. The
batch to use is the largest that fits less a safety margin (Lightning's `margin`, 5 % by default:
added after users found that a batch that barely fitted in the search ran out of memory in the real
run, Lightning PR #21163), never above the training set split over the workers.

Each probe is a real run of a few optimizer steps followed by the evaluation the real run would do
(evaluation batches are larger than training ones), in a process of its own: on CPU, the probe's
ranks run under `--memory-limit` (launch starts even one rank in its own process then, and an
allocation past the limit fails inside the rank: the probe dies, not this command); on GPUs each
probe is a `paratrain train` child process, so a CUDA out-of-memory error and the CUDA context go
with it. Without --memory-limit on CPU the probes get the memory available now, split over the
workers, and the result says so.

The knee: the smallest probed batch whose samples/s is within 5 % of the best probe's. Below it
the device is under-used; above it a larger batch buys memory use and a larger global batch (which
may need more steps, see noise-scale) but little speed. Throughput is measured over the probe's
full steps after the first third (start-up excluded): a batch that does not divide a rank's share of
the training set ends each epoch with a smaller step, which is not the batch probed, and its time is
left out, as the memory meter leaves it out (engine/memory.py).
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paratrain.batch import check_out, check_train_flags, run_config, steps_run_config, train_samples, write_result
from paratrain.config import TrainConfig
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import RunDir

RESULT_FILE = "find_batch.json"
OPTIMIZER_STATES = {"sgd": 1, "lars": 1, "adam": 2, "adamw": 2, "lamb": 2}  # tensors of state per parameter
# What a probe that ran out of memory says: paratrain's own line under --memory-limit, the host
# allocator's, CUDA's caching allocator's (torch.OutOfMemoryError), and the library allocations that
# fail without saying "out of memory", which Lightning's batch-size finder also counts as such
# (lightning.pytorch.utilities.memory.is_oom_error: cuDNN's NOT_SUPPORTED for a workspace that does
# not fit, pytorch/pytorch#4107): cuBLAS's and cuDNN's handles and workspaces, and torch's message
# when no cuDNN algorithm's workspace fits.
OUT_OF_MEMORY = (
    "needs more memory than --memory-limit",
    "out of memory",
    "can't allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",
    "Unable to find a valid cuDNN algorithm",
)
MAX_PROBES = 25  # Lightning's max_trials

Probe = dict[str, Any]


class ProbeFailed(RunFailed):
    """A GPU probe's `paratrain train` child failed: its last line, and all it wrote to stderr."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


def knee(points: list[tuple[int, float]], within: float = 0.05) -> int:
    """The smallest batch whose samples/s is within `within` of the best: (batch, samples/s) pairs."""
    best = max(rate for _, rate in points)
    return min(batch for batch, rate in points if rate >= (1 - within) * best)


def binsearch(fits: Callable[[int], bool], start: int, cap: int) -> tuple[int, int | None]:
    """(largest batch that fits, smallest that does not or None): doubling from `start`, then
    bisection, as Lightning's binsearch mode; never above `cap`. `fits(start)` must hold."""
    low, high = start, None
    while high is None and low < cap:
        trial = min(low * 2, cap)
        if fits(trial):
            low = trial
        else:
            high = trial
    while high is not None and high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, high


def model_state_bytes(cfg: TrainConfig) -> int:
    """Parameters, gradients and optimizer state of one full copy of the model, in bytes."""
    from paratrain.workloads import build_model, load_data

    model = build_model(cfg, load_data(cfg))
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    states = OPTIMIZER_STATES[cfg.optimizer] if cfg.optimizer != "sgd" or cfg.momentum > 0 else 0
    return parameter_bytes * (2 + states)


def find_batch(
    train: dict[str, Any],
    out: Path,
    margin: float = 0.05,
    max_batch: int | None = None,
    probe_steps: int = 12,
    knee_within: float = 0.05,
    on_probe: Callable[[str, Probe], None] = lambda kind, probe: None,
    *,
    max_batch_reason: str = "--max-batch",
) -> dict[str, Any]:
    """Probe batch sizes of `train`'s workload; write OUT/find_batch.json and return it. `max_batch_reason`
    names what set `max_batch` (recommend bounds the search by its own rule)."""
    check_train_flags(train, "find-batch")
    if "batch_size" in train:
        raise UsageError("paratrain find-batch chooses --batch-size itself; drop it")
    check_out(out)
    from paratrain.launch.placement import plan_placement

    base = run_config(train)
    on_cpu = plan_placement(base).device_type == "cpu"
    limit, limit_source = _memory_limit(train, base, on_cpu)
    samples = train_samples(base)
    share = -(-samples // base.data_parallel_size)  # a rank's samples an epoch (DistributedSampler pads)
    cap = samples // (base.data_parallel_size * base.grad_accum)
    if max_batch is not None:
        cap = min(cap, max_batch)
    probes: dict[int, Probe] = {}
    scratch = Path(tempfile.mkdtemp(prefix="paratrain-find-batch-"))

    def fits(batch: int) -> bool:
        if len(probes) >= MAX_PROBES:
            return False
        on_probe("start", {"batch": batch})
        values = {
            **train,
            "batch_size": batch,
            # A log point is a host sync: one every step only where the short steps that end epochs must be left
            # out one by one (the batch does not divide a rank's share of the data).
            "log_every": 1 if share % (batch * base.grad_accum) else max(1, probe_steps // 3),
            **({"memory_limit": limit} if on_cpu else {}),
        }
        probes[batch] = _probe(values, probe_steps, scratch / f"batch-{batch}", on_cpu)
        on_probe("done", probes[batch])
        return probes[batch]["fits"]

    try:
        if not fits(1):
            raise UsageError(
                f"the workload does not run at batch 1 ({probes[1]['error']}); "
                + ("raise --memory-limit" if on_cpu else "use a smaller model or more GPU memory")
            )
        largest, failed = binsearch(fits, 1, cap)
    except RunFailed:
        raise  # a probe failed for another reason than memory: its run directory stays, the error names its log
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "train": json.loads(json.dumps(train, default=str)),
        "device": "cpu" if on_cpu else "cuda",
        "options": {"margin": margin, "max_batch": max_batch, "probe_steps": probe_steps, "knee_within": knee_within},
        "workers": base.workers,
        "memory_limit": limit if on_cpu else None,
        "memory_limit_source": limit_source if on_cpu else None,
        "probe_steps": probe_steps,
        **_outcome(probes, largest, failed, max_batch, max_batch_reason, margin, knee_within),
    }
    write_result(Path(out) / RESULT_FILE, result)
    return result


def _memory_limit(train: dict[str, Any], base: TrainConfig, on_cpu: bool) -> tuple[str | None, str]:
    """The limit the probes run under and where it came from: --memory-limit, or on CPU what the
    machine had available, split over the workers. Refused when the model's own state does not fit it."""
    limit, source = base.memory_limit, "--memory-limit"
    if not on_cpu:
        return limit, source
    if limit is None:
        import psutil

        limit = f"{psutil.virtual_memory().available // base.workers // 2**20}M"
        source = f"the memory available when the search started, split over {base.workers} worker(s)"
    needed = model_state_bytes(base)
    if run_config(train, memory_limit=limit).memory_limit_bytes < needed:
        raise UsageError(
            f"--memory-limit {limit} is below the model's own state ({needed / 2**20:,.0f} MiB of parameters, "
            f"gradients and {base.optimizer} state): no batch can fit; raise --memory-limit"
        )
    return limit, source


def _outcome(
    probes: dict[int, Probe],
    largest: int,
    failed: int | None,
    max_batch: int | None,
    max_batch_reason: str,
    margin: float,
    knee_within: float,
) -> dict[str, Any]:
    """find_batch.json's findings from the probes: the largest batch that fitted and why the search
    stopped there, the batch to use (less the margin when memory stopped it), the knee."""
    fitted = sorted((p["batch"], p["samples_per_s"]) for p in probes.values() if p["fits"])
    return {
        "margin": margin,
        "knee_within": knee_within,
        "max_batch": largest,
        "first_failed": failed,
        "limited_by": "memory"
        if failed is not None
        else (max_batch_reason if max_batch is not None and largest == max_batch else "the training set"),
        "safe_batch": max(1, int(largest * (1 - margin))) if failed is not None else largest,
        "knee_batch": knee(fitted, knee_within),
        "best_samples_per_s": max(rate for _, rate in fitted),
        "probes": sorted(probes.values(), key=lambda p: p["batch"]),
    }


def _probe(values: dict[str, Any], steps: int, run_dir: Path, on_cpu: bool) -> Probe:
    """One probe run; whether it fitted, its samples/s and memory."""
    cfg = steps_run_config(values, steps, quiet=True, run_dir=run_dir)
    batch = cfg.batch_size
    try:
        if on_cpu:
            from paratrain.launch.builtin import train as run_training

            run_training(cfg)
        else:
            _train_in_child(cfg, run_dir)
    except RunFailed as exc:
        # Everything the probe wrote: the marker may sit on any line of a traceback (CUDA errors end
        # with a hint about TORCH_USE_CUDA_DSA), and a rank's traceback is in its log.
        logs = sorted((run_dir / "logs").glob("rank*.log")) if (run_dir / "logs").is_dir() else []
        said = "\n".join(
            [
                str(exc),
                exc.output if isinstance(exc, ProbeFailed) else "",
                *(log.read_text(errors="replace") for log in logs),
            ]
        )
        if not any(marker in said for marker in OUT_OF_MEMORY):
            raise
        return {
            "batch": batch,
            "fits": False,
            "error": "out of memory",
            "samples_per_s": None,
            "peak_memory_bytes": None,
        }
    summary = RunDir(run_dir).summary_record()
    per_log = cfg.log_every * batch * cfg.data_parallel_size * cfg.grad_accum
    rates = full_step_rates(_events(run_dir, "step"), per_log)
    rates = rates[len(rates) // 3 :]  # start-up excluded
    return {
        "batch": batch,
        "fits": True,
        "error": None,
        "samples_per_s": statistics.median(rates) if rates else summary.samples_per_s,
        "peak_memory_bytes": max(m or 0 for m in summary.peak_memory_bytes or []),
        "activations_peak_bytes": max(m or 0 for m in summary.memory.activations_peak_bytes),
    }


def full_step_rates(steps: list[dict[str, Any]], global_batch: int) -> list[float]:
    """samples/s of the log points whose interval trained `global_batch` samples (full steps only), in order."""
    trained = [later - earlier for earlier, later in itertools.pairwise([0] + [e["samples"] for e in steps])]
    return [e["samples_per_s"] for e, n in zip(steps, trained) if n == global_batch]


def _train_in_child(cfg: TrainConfig, run_dir: Path) -> None:
    """A GPU probe in a child process: a CUDA out-of-memory error ends it, not this command."""
    config_file = run_dir.with_suffix(".json")
    config_file.write_text(json.dumps(cfg.model_dump(mode="json", exclude_defaults=True)))
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "train", "--config", str(config_file)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise ProbeFailed(
            done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}",
            done.stderr,
        )


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [
        e for e in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if e["event"] == kind
    ]
