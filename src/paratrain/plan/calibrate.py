"""Fit the plan's efficiency from runs measured here (`paratrain plan --calibrate RUN_DIRS...`).

From each completed run of a whole-model strategy (single, ddp, zero1, fsdp) its summary.json gives
the step-time breakdown (data, compute, communication, optimizer, other) and the model FLOPs per
sample and the per-device peak its MFU was computed against. The plan's own step for the run's
layout, uncalibrated, is the yardstick for the rest. Fitted:
- per number of ranks, the busy time of a step against the seconds its FLOPs would take at the
  peak. Busy time is the compute plus the communication the link model does not predict (on CPU
  ranks mostly waiting for the slower rank, which grows with the step: docs/planner.md). With one
  batch size per count: efficiency = the median of ideal / busy. With two or more (1.5x apart at
  least): a least-squares line busy = fixed + ideal / efficiency through each batch size's median,
  whose intercept is the fixed compute per step (dispatching operators, launching kernels) that one
  batch size cannot tell from the efficiency. A plan for N devices takes the figures of the largest
  count measured that is at most N. The same line through the compute alone, the wait left out,
  prices a pipeline's stages, whose waits (the bubble, the slowest stage) the plan prices apart.
- per-step overhead, per number of ranks: the median of data_s + other_s (loading, bookkeeping)
  plus the optimizer time beyond the plan's memory-traffic estimate (a small model's step is mostly
  the optimizer's own per-tensor work), which no FLOP or byte count predicts; two CPU ranks share
  the host's memory bandwidth, so their optimizer steps are slower than one rank's.
- per layout beyond the plain ones, from its own runs (fsdp, hsdp, tp, fsdp+tp, and pipelines: pipeline,
  hybrid, pp+fsdp, pp+tp, told apart by their stages and micro-batches: `LayoutCost`): the measured
  step less the step the plan calibrated so far gives for the run's layout, per number of ranks, as a
  line over the samples a replica steps (two batch sizes at least 1.5x apart) or its median: what the
  layout's own machinery costs that no FLOP or byte count gives (FSDP2's and DTensor's Python work a
  step, tensor-parallel matrices too narrow to run at the whole ones' share of the peak, a pipeline's
  sends, receives and schedule a micro-batch, and the stages' imbalance beyond the plan's). The figures
  above are then fitted from the plain layouts' runs alone (single, ddp, zero1) where any are given, so
  that one layout's machinery does not slow every layout's plan.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.plan.step_time import Efficiency, LayoutCost
from paratrain.runs import RunDir
from paratrain.runs.records import Summary

WHOLE_MODEL = ("single", "ddp", "zero1", "fsdp")
# the layouts whose step the plan prices from FLOPs, bytes and links alone: the efficiency is fitted to theirs
PLAIN = ("single", "ddp", "zero1")
# what calibrates: the whole-model layouts, tensor parallelism (a run's strategy `tp`, or `fsdp` with a tp in its
# mesh) and pipelines (`pipeline`, `hybrid`, with their shards or splits); not model-parallel, a pipeline of one
# micro-batch that the plan has no row of, nor async-ps's updates
STAGED = ("pipeline", "hybrid")
CALIBRATED_LAYOUTS = (*WHOLE_MODEL, "tp", *STAGED)


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
    if summary.strategy not in CALIBRATED_LAYOUTS:
        return (
            f"runs of strategy {summary.strategy!r} do not calibrate the plan (it prices their stages or updates by "
            f"its own model); calibrate from runs of {', '.join(CALIBRATED_LAYOUTS)}"
        )
    if not summary.flops_per_sample or not (summary.mfu_peak and summary.mfu_peak.per_device):
        return (
            "the run has no FLOPs per sample or device peak (its model could not be counted); "
            "calibrate from another run"
        )
    return ""


def fit(runs: list[Summary], predicted: Callable[[Summary, Efficiency], dict[str, Any]]) -> Efficiency:
    """The efficiency, fixed compute and overhead fitted to `runs`, and each other layout's own cost.

    `predicted(summary, eff)` is the plan's step for that run's layout under `eff` (`step_time_s`,
    `exposed_comm_s`, `optimizer_s`, and `layout`, the layout as step_time.layout_key names it): uncalibrated
    (an efficiency of 1), what it leaves out of the plain runs' communication and optimizer time is fitted;
    calibrated, what it leaves out of the other layouts' steps is their own cost.
    """
    whole = [s for s in runs if s.strategy not in STAGED and (s.layout or {}).get("tp", 1) == 1]
    plain = [s for s in whole if s.strategy in PLAIN] or whole
    if not plain:
        raise UsageError(
            "--calibrate: tensor-parallel and pipeline runs are calibrated against the plan of whole-model runs; add "
            f"runs of {', '.join(WHOLE_MODEL)} of the same model"
        )
    eff = _fit_plain(plain, lambda summary: predicted(summary, Efficiency(1.0)))
    others = [s for s in runs if s not in plain]
    if not others:
        return eff
    costs = _layout_costs(others, lambda summary: predicted(summary, eff))
    shown = ", ".join(
        f"{c.layout} on {c.devices} rank(s) {c.fixed_s * 1e3:+.2f} ms a step"
        + (f" {c.per_sample_s * 1e3:+.3f} ms a sample" if c.per_sample_s else "")
        for c in costs
    )
    names = ", ".join(Path(s.run_dir or "?").name for s in others)
    return replace(eff, layout_costs=costs, source=f"{eff.source}; beyond it, measured ({names}): {shown}")


def _fit_plain(runs: list[Summary], predicted: Callable[[Summary], dict[str, Any]]) -> Efficiency:
    """The efficiency, fixed compute and overhead per rank count (the module's docstring)."""
    overheads: dict[int, list[float]] = {}  # per rank count
    # per rank count: (seconds the step's FLOPs would take at the peak, measured busy seconds), and the same
    # with the compute alone (the wait for the other ranks left out: what a pipeline's slots take)
    by_workers: dict[int, list[tuple[float, float]]] = {}
    alone: dict[int, list[tuple[float, float]]] = {}
    for summary in runs:
        b, plan = summary.breakdown, predicted(summary)
        per_rank = summary.batch_size * (summary.grad_accum or 1)
        waiting = max(b.comm_s - plan["exposed_comm_s"], 0.0) if summary.workers > 1 else 0.0
        if b.compute_s > 0:
            ideal = summary.flops_per_sample * per_rank / summary.mfu_peak.per_device
            by_workers.setdefault(summary.workers, []).append((ideal, b.compute_s + waiting))
            alone.setdefault(summary.workers, []).append((ideal, b.compute_s))
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
    without_waiting = tuple((workers, *_compute_line(points)) for workers, points in sorted(alone.items()))
    overhead = tuple((workers, statistics.median(values)) for workers, values in sorted(overheads.items()))
    names = ", ".join(Path(s.run_dir or "?").name for s in runs)
    shown = ", ".join(
        f"{share:.3f} on {workers} rank(s)" + (f" + {fixed_s * 1e3:.2f} ms a step" if fixed else "")
        for workers, (share, fixed_s) in fitted.items()
    )
    shown_alone = ", ".join(
        f"{share:.3f} on {workers} rank(s)" + (f" + {fixed_s * 1e3:.2f} ms a step" if fixed_s else "")
        for workers, share, fixed_s in without_waiting
        if workers > 1
    )
    shown_overhead = ", ".join(f"{seconds * 1e3:.2f} ms on {workers} rank(s)" for workers, seconds in overhead)
    return Efficiency(
        compute=per_count[0][1],
        overhead_s=overhead[0][1],
        by_devices=per_count,
        fixed_by_devices=fixed,
        overhead_by_devices=overhead,
        without_waiting_by_devices=without_waiting,
        source=f"calibrated from {len(runs)} run(s) measured here ({names}): compute efficiency "
        f"{shown} of the peak (waiting for other ranks included"
        + (f"; without it, a pipeline's stages: {shown_alone}" if shown_alone else "")
        + f"), per-step overhead {shown_overhead}",
    )


def _layout_costs(runs: list[Summary], predicted: Callable[[Summary], dict[str, Any]]) -> tuple[LayoutCost, ...]:
    """Per layout and rank count, the measured step (the breakdown's sum) less the calibrated plan's, as a line
    over the samples a replica steps, or their median (`_cost_line`)."""
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for summary in runs:
        plan, b = predicted(summary), summary.breakdown
        measured = b.data_s + b.compute_s + b.comm_s + b.optimizer_s + b.other_s
        samples = summary.batch_size * (summary.grad_accum or 1)
        points.setdefault((plan["layout"], summary.workers), []).append((samples, measured - plan["step_time_s"]))
    return tuple(LayoutCost(layout, workers, *_cost_line(line)) for (layout, workers), line in sorted(points.items()))


def _cost_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(seconds a step, seconds a sample) of a layout's own cost from (samples, seconds beyond the plan) of its
    runs: the line through each batch size's median (`_line_through_medians`) where it grows with the batch;
    else the median of all a step. The median may be negative: the plan can overrate a layout's cost too."""
    line = _line_through_medians(points)
    if line is not None and line[1] >= 0:
        return line
    return statistics.median(y for _, y in points), 0.0


def _compute_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(efficiency, fixed seconds) from (ideal seconds, busy seconds) of runs at one rank count:
    busy = fixed + ideal / efficiency through each batch size's median (`_line_through_medians`) where the
    line is a model (a positive slope, no negative fixed cost); else the median ratio and no fixed cost."""
    line = _line_through_medians(points)
    if line is not None and line[1] > 0 and line[0] >= 0:
        return 1 / line[1], line[0]
    return statistics.median(x / y for x, y in points), 0.0


def _line_through_medians(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through the median y of each x, or None where the x span
    less than 1.5x (the line would be all noise). Medians, so that one slow repeat (a busy machine) does not
    tilt the line: through every run, one of three repeats 27 % slow at the small batch raised a 2-rank fixed
    cost from 12 to 56 ms a step, and a 2-stage pipeline's plan from 11 % to 27 % too slow (docs/planner.md)."""
    by_x: dict[float, list[float]] = {}
    for x, y in points:
        by_x.setdefault(x, []).append(y)
    medians = [(x, statistics.median(ys)) for x, ys in by_x.items()]
    xs = [x for x, _ in medians]
    if max(xs) < 1.5 * min(xs):
        return None
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(y for _, y in medians)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in medians) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope
