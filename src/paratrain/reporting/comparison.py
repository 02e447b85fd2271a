"""A comparison of runs, each against the first: its rows (figures, ratios, memory per rank) and its
table's cells, which `paratrain compare` prints and its page shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.formatting import human
from paratrain.runs import RunDir
from paratrain.runs.records import Memory

MEMORY_FIGURES = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes", "rss_peak_bytes")


def memory_per_rank(memory: Memory | None) -> dict[str, int | None]:
    """The largest rank's figures: what must fit on each device. `model_state_bytes` is parameters +
    gradients + optimizer state, the part that sharding divides."""
    figures = {k: getattr(memory, k) if memory else [] for k in MEMORY_FIGURES}
    worst = {k: max(v) if v else None for k, v in figures.items()}
    states = (
        [sum(v) for v in zip(*(figures[k] for k in MEMORY_FIGURES[:3]))]
        if all(figures[k] for k in MEMORY_FIGURES[:3])
        else []
    )
    return {"model_state_bytes": max(states) if states else None, **worst}


def comparison_rows(runs: list[RunDir]) -> list[dict[str, Any]]:
    """Final metrics, throughput and memory per rank of each run, with the ratio to the first run:
    None where either did not complete (a failed run's missing figures are not zeros)."""
    rows = []
    for run in runs:
        if not run.summary.exists():
            raise UsageError(f"{run.path} has no summary.json: the run did not finish")
        s = run.summary_record()
        load = s.machine_load
        rows.append(
            {
                "run": str(run.path),
                "status": s.status,
                "error": s.error,
                "contended": s.contended,
                "other_load": load.other_fraction if load else None,
                "workers": s.workers,
                "strategy": s.strategy,
                "global_batch_size": s.global_batch_size,
                **memory_per_rank(s.memory),
                "samples_per_s": s.samples_per_s,
                "epoch_time_s": s.epoch_time_s,
                "train_loss": s.train_loss,
                "val_accuracy": s.val_accuracy,
                "wall_time_s": s.wall_time_s,
            }
        )
    first = rows[0]
    for row in rows:
        row["throughput_vs_first"] = (
            row["samples_per_s"] / first["samples_per_s"] if _comparable(row, first, "samples_per_s") else None
        )
        row["val_accuracy_diff"] = (
            row["val_accuracy"] - first["val_accuracy"] if _comparable(row, first, "val_accuracy") else None
        )
    return rows


def _comparable(row: dict[str, Any], first: dict[str, Any], key: str) -> bool:
    """Whether `key` of `row` can be set against the first run's: both completed and measured it."""
    return all(r["status"] == "completed" and r[key] is not None for r in (row, first))


def comparison_table(rows: list[dict[str, Any]], split: str) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The comparison's columns and cells, as the page and the terminal both show them."""
    columns = (
        "run",
        "strategy",
        "workers",
        "global batch",
        "samples/s",
        "x first",
        "epoch time",
        "train loss",
        f"{split} accuracy",
        "Δ accuracy (points)",
        "model state / rank",
        "activations / rank",
        "peak RSS / rank",
        "wall time",
    )
    cells = [
        (
            Path(r["run"]).name + ("" if r["status"] == "completed" else f" ({r['status']})"),
            r["strategy"] or "-",
            human("workers", r["workers"]),
            human("global_batch_size", r["global_batch_size"]),
            human("samples_per_s", r["samples_per_s"]),
            "-" if r["throughput_vs_first"] is None else f"{r['throughput_vs_first']:.2f}x",
            human("epoch_time_s", r["epoch_time_s"]),
            human("train_loss", r["train_loss"]),
            human("val_accuracy", r["val_accuracy"]),
            "-" if r["val_accuracy_diff"] is None else f"{r['val_accuracy_diff'] * 100:+.1f}",
            human("model_state_bytes", r["model_state_bytes"]),
            human("activations_peak_bytes", r["activations_peak_bytes"]),
            human("rss_peak_bytes", r["rss_peak_bytes"]),
            human("wall_time_s", r["wall_time_s"]),
        )
        for r in rows
    ]
    return columns, cells


def held_out_split(runs: list[RunDir]) -> str:
    """What the runs' accuracy was measured on, for column titles: val, test, or val/test when mixed."""
    splits = {run.summary_record().val_split or "test" for run in runs}
    return splits.pop() if len(splits) == 1 else "val/test"
