"""Fit the plan's efficiency from runs measured here (`paratrain plan --calibrate RUN_DIRS...`).

From each completed run of a whole-model strategy (single, ddp, zero1, fsdp) its summary.json gives
the step-time breakdown (data, compute, communication, optimizer, other) and the model FLOPs per
sample and the per-device peak its MFU was computed against. The plan's own step for the run's
layout, uncalibrated, is the yardstick for the rest. Fitted:
- per number of ranks, the busy time of a step against the seconds its FLOPs would take at the
  peak. Busy time is the compute plus the communication the link model does not predict (on CPU
  ranks mostly waiting for the slower rank, which grows with the step: docs/planner.md). With one
  batch size per count: efficiency = the median of ideal / busy. With two or more (1.5x apart at
  least): a least-squares line busy = fixed + ideal / efficiency, whose intercept is the fixed
  compute per step (dispatching operators, launching kernels) that one batch size cannot tell from
  the efficiency. A plan for N devices takes the figures of the largest count measured that is at
  most N.
- per-step overhead, per number of ranks: the median of data_s + other_s (loading, bookkeeping)
  plus the optimizer time beyond the plan's memory-traffic estimate (a small model's step is mostly
  the optimizer's own per-tensor work), which no FLOP or byte count predicts; two CPU ranks share
  the host's memory bandwidth, so their optimizer steps are slower than one rank's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from paratrain.errors import UsageError
from paratrain.plan.step_time import Efficiency
from paratrain.runs import RunDir
from paratrain.runs.records import Summary

WHOLE_MODEL = ("single", "ddp", "zero1", "fsdp")


def read_runs(paths: Sequence[Path]) -> list[Summary]:
    """The usable runs' summaries (each with the `run_dir` it was read from); a path that is no run, or a
    run that cannot calibrate, is refused."""
    runs = []
    for path in paths:
        run = RunDir(Path(path))
        if not run.is_run() or not run.summary.is_file():
            raise UsageError(
                f"--calibrate {path}: not a paratrain run directory (no config.json and summary.json); "
                "pass the --run-dir of finished paratrain train runs"
            )
        summary = run.summary_record()
        why = _unusable(summary)
        if why:
            raise UsageError(f"--calibrate {path}: {why}")
        runs.append(summary.model_copy(update={"run_dir": str(path)}))
    return runs


def _unusable(summary: Summary) -> str:
    if summary.status != "completed":
        return f"the run did not complete (status {summary.status!r}); calibrate from completed runs"
    if summary.strategy not in WHOLE_MODEL:
        return (
            f"strategy {summary.strategy!r} splits the model, so its compute time is not the model's; "
            f"calibrate from runs of {', '.join(WHOLE_MODEL)}"
        )
    if not summary.flops_per_sample or not (summary.mfu_peak and summary.mfu_peak.per_device):
        return (
            "the run has no FLOPs per sample or device peak (its model could not be counted); "
            "calibrate from another run"
        )
    return ""


def fit(runs: list[Summary], predicted: Callable[[Summary], dict[str, float]]) -> Efficiency:
    """The efficiency, fixed compute and overhead fitted to `runs`.

    `predicted(summary)` is the plan's uncalibrated step for that run's layout (`exposed_comm_s`,
    `optimizer_s`): what it leaves out of the measured communication and optimizer time is fitted.
    """
    overheads: dict[int, list[float]] = {}  # per rank count
    # per rank count: (seconds the step's FLOPs would take at the peak, measured busy seconds)
    by_workers: dict[int, list[tuple[float, float]]] = {}
    for summary in runs:
        b, plan = summary.breakdown, predicted(summary)
        per_rank = summary.batch_size * (summary.grad_accum or 1)
        waiting = max(b.comm_s - plan["exposed_comm_s"], 0.0) if summary.workers > 1 else 0.0
        if b.compute_s > 0:
            ideal = summary.flops_per_sample * per_rank / summary.mfu_peak.per_device
            by_workers.setdefault(summary.workers, []).append((ideal, b.compute_s + waiting))
        overheads.setdefault(summary.workers, []).append(
            b.data_s + b.other_s + max(b.optimizer_s - plan["optimizer_s"], 0.0)
        )
    if not by_workers:
        raise UsageError("--calibrate: no run has a measured compute time; calibrate from runs of at least one epoch")
    fitted = {workers: _compute_line(points) for workers, points in sorted(by_workers.items())}
    per_count = tuple((workers, share) for workers, (share, _) in fitted.items())
    fixed = (
        tuple((workers, fixed_s) for workers, (_, fixed_s) in fitted.items())
        if any(f for _, f in fitted.values())
        else ()
    )
    overhead = tuple((workers, statistics.median(values)) for workers, values in sorted(overheads.items()))
    names = ", ".join(Path(s.run_dir or "?").name for s in runs)
    shown = ", ".join(
        f"{share:.3f} on {workers} rank(s)" + (f" + {fixed_s * 1e3:.2f} ms a step" if fixed else "")
        for workers, (share, fixed_s) in fitted.items()
    )
    shown_overhead = ", ".join(f"{seconds * 1e3:.2f} ms on {workers} rank(s)" for workers, seconds in overhead)
    return Efficiency(
        compute=per_count[0][1],
        overhead_s=overhead[0][1],
        by_devices=per_count,
        fixed_by_devices=fixed,
        overhead_by_devices=overhead,
        source=f"calibrated from {len(runs)} run(s) measured here ({names}): compute efficiency "
        f"{shown} of the peak (waiting for other ranks included), per-step overhead {shown_overhead}",
    )


def _compute_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(efficiency, fixed seconds) from (ideal seconds, busy seconds) of runs at one rank count:
    busy = fixed + ideal / efficiency by least squares when the runs span batch sizes (at least
    1.5x apart, or the line is all noise) and the line is a model (a positive slope, no negative
    fixed cost); else the median ratio and no fixed cost."""
    ideals = [x for x, _ in points]
    if max(ideals) >= 1.5 * min(ideals):
        mean_x, mean_y = statistics.fmean(ideals), statistics.fmean(y for _, y in points)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in ideals)
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return 1 / slope, intercept
    return statistics.median(x / y for x, y in points), 0.0
