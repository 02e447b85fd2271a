"""Fit the plan's efficiency from runs measured here (`paratrain plan --calibrate RUN_DIRS...`).

From each completed run of a whole-model strategy (single, ddp, zero1, fsdp) its summary.json gives
the step-time breakdown (data, compute, communication, optimizer, other) and the model FLOPs per
sample and the per-device peak its MFU was computed against. Three figures are fitted, each the
median over the runs:
- compute efficiency: FLOPs per sample x samples per rank per step / (compute seconds x peak), per
  number of ranks (ranks sharing a host's memory bandwidth compute slower: a plan for N devices takes
  the figure of the largest count measured that is at most N);
- per-step overhead: data_s + other_s (loading, bookkeeping), which no FLOP count predicts;
- synchronisation: in runs of more than one rank, the measured exposed communication minus what the
  link model predicts for it (on CPU ranks mostly waiting for the slower rank: docs/benchmarks.md).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from paratrain.errors import UsageError
from paratrain.plan.step_time import Efficiency
from paratrain.runs import RunDir

WHOLE_MODEL = ("single", "ddp", "zero1", "fsdp")


def read_runs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The usable runs' summaries; a path that is no run, or a run that cannot calibrate, is refused."""
    runs = []
    for path in paths:
        run = RunDir(Path(path))
        if not run.is_run() or not run.summary.is_file():
            raise UsageError(f"--calibrate {path}: not a paratrain run directory (no config.json and summary.json); "
                             "pass the --run-dir of finished paratrain train runs")
        summary = run.read_summary()
        why = _unusable(summary)
        if why:
            raise UsageError(f"--calibrate {path}: {why}")
        summary["_config"] = run.read_config()
        summary["_path"] = str(path)
        runs.append(summary)
    return runs


def _unusable(summary: dict[str, Any]) -> str:
    if summary.get("status") != "completed":
        return f"the run did not complete (status {summary.get('status')!r}); calibrate from completed runs"
    if summary.get("strategy") not in WHOLE_MODEL:
        return (f"strategy {summary.get('strategy')!r} splits the model, so its compute time is not the model's; "
                f"calibrate from runs of {', '.join(WHOLE_MODEL)}")
    peak = summary.get("mfu_peak") or {}
    if not summary.get("flops_per_sample") or not peak.get("per_device"):
        return "the run has no FLOPs per sample or device peak (its model could not be counted); calibrate from another run"
    return ""


def fit(runs: list[dict[str, Any]], predicted_comm: Callable[[dict[str, Any]], float]) -> Efficiency:
    """The median efficiency, overhead and synchronisation cost over `runs`.

    `predicted_comm(summary)` is the plan's exposed communication for that run's layout, subtracted
    from the measured one to leave what the link model does not cover.
    """
    efficiencies, overheads, syncs = [], [], []
    by_workers: dict[int, list[float]] = {}
    for summary in runs:
        b = summary["breakdown"]
        per_rank = summary["batch_size"] * summary.get("grad_accum", 1)
        if b["compute_s"] > 0:
            share = summary["flops_per_sample"] * per_rank / (b["compute_s"] * summary["mfu_peak"]["per_device"])
            efficiencies.append(share)
            by_workers.setdefault(summary["workers"], []).append(share)
        overheads.append(b["data_s"] + b["other_s"])
        if summary["workers"] > 1:
            syncs.append(max(b["comm_s"] - predicted_comm(summary), 0.0))
    if not efficiencies:
        raise UsageError("--calibrate: no run has a measured compute time; calibrate from runs of at least one epoch")
    names = ", ".join(Path(s["_path"]).name for s in runs)
    per_count = tuple(sorted((workers, statistics.median(shares)) for workers, shares in by_workers.items()))
    shown = ", ".join(f"{share:.3f} on {workers} rank(s)" for workers, share in per_count)
    return Efficiency(compute=statistics.median(efficiencies), overhead_s=statistics.median(overheads),
                      sync_s=statistics.median(syncs) if syncs else 0.0, by_devices=per_count,
                      source=f"calibrated from {len(runs)} run(s) measured here ({names}): compute efficiency "
                             f"{shown} of the peak, per-step overhead "
                             f"{statistics.median(overheads) * 1e3:.2f} ms"
                             + (f", synchronisation {statistics.median(syncs) * 1e3:.2f} ms" if syncs else ""))
