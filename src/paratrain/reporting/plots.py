"""PNG plots of runs, scaling studies and comparisons (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from paratrain.reporting.verdict import cores_text, workers_what
from paratrain.runs import RunDir
from paratrain.runs.records import ParetoFront, Plan, PlanCost, ScalingRow, Study, SweepResult


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def study_plots(result: Study, out: Path) -> dict[str, Path]:
    """Epoch time, samples/s, speedup (with the ideal line), efficiency, accuracy vs global batch.

    Error bars are the min-max over repeats. The one-process-on-all-cores reference of a CPU study
    is a dotted line in the time and throughput plots, and the speedup against it a second series.
    """
    rows = result.points()
    workloads = list(dict.fromkeys(r.workload for r in rows))
    counts = sorted({r.workers for r in rows})
    mode = result.mode
    specs = {
        "epoch_time": ("epoch time (s)", "epoch_time_s", "epoch_time_s_range"),
        "throughput": ("samples/s", "samples_per_s", "samples_per_s_range"),
        "speedup": ("speedup (T(base) / T(N))", "speedup", "speedup_range"),
        "efficiency": ("efficiency (speedup / N)", "efficiency", "speedup_range"),
    }
    paths = {}
    for name, (label, key, spread) in specs.items():
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for i, workload in enumerate(workloads):
            _study_series(ax, name, key, spread, f"C{i}", result.points(workload), result.reference(workload))
        if name == "speedup":
            ax.plot(counts, counts, "k--", linewidth=1, label="ideal")
        if name == "efficiency":
            ax.axhline(1.0, color="k", linestyle="--", linewidth=1, label="ideal")
            ax.set_ylim(0, 1.1)
        ax.set_xlabel("workers")
        ax.set_ylabel(label)
        ax.set_xticks(counts)
        ax.set_title(f"{label} ({mode} scaling)")
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize="small")
            paths[name] = _save(fig, out / f"{name}.png")
        else:
            plt.close(fig)

    accuracy = _accuracy_plot(rows, workloads, out)
    return {**paths, **({"accuracy": accuracy} if accuracy else {})}


def _study_series(
    ax: Any, name: str, key: str, spread: str, color: str, mine: list[ScalingRow], ref: ScalingRow | None
) -> None:
    """One workload's line (with min-max bars over repeats) in one study plot; the speedup plot adds
    the speedup against one process on all cores, and the time plots that process as a dotted line.
    A studied script that reports samples/s only has no epoch time: no line."""
    workload = mine[0].workload
    mine = [r for r in mine if getattr(r, key) is not None]
    if not mine:
        return
    base = f" (vs {workers_what(mine[0])})"
    series = [(key, spread, workload + (base if name == "speedup" else ""), "-")]
    if name == "speedup" and ref:
        series.append(
            (
                "speedup_vs_all_cores",
                "speedup_vs_all_cores_range",
                f"{workload} (vs one process, all {cores_text(ref)} cores)",
                "--",
            )
        )
    for value, span, legend, style in series:
        xs = [r.workers for r in mine]
        ys = [getattr(r, value) for r in mine]
        # Efficiency is proportional to speedup, so its bars are the speedup's, rescaled.
        scale = [r.efficiency / r.speedup if name == "efficiency" else 1.0 for r in mine]
        spans = [getattr(r, span) for r in mine]
        lo = [y - s[0] * k if s else 0.0 for y, s, k in zip(ys, spans, scale)]
        hi = [s[1] * k - y if s else 0.0 for y, s, k in zip(ys, spans, scale)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=color, linestyle=style, label=legend)
    if ref and name in ("epoch_time", "throughput") and getattr(ref, key) is not None:
        ax.axhline(
            getattr(ref, key),
            color=color,
            linestyle=":",
            linewidth=1.2,
            label=f"{workload}: one process, all {cores_text(ref)} cores",
        )


def _accuracy_plot(rows: list[ScalingRow], workloads: list[str], out: Path) -> Path | None:
    """Accuracy against the global batch, one line per workload."""
    measured = [r for r in rows if r.val_accuracy is not None and r.global_batch_size is not None]
    if not measured:  # a studied script that reports no accuracy or global batch
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for workload in workloads:
        mine = [r for r in measured if r.workload == workload]
        ax.plot([r.global_batch_size for r in mine], [r.val_accuracy for r in mine], marker="o", label=workload)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size")
    # The split the table's accuracy column names: a study's runs measure on the test split unless given --val-split.
    splits = {r.val_split or "test" for r in measured}
    ax.set_ylabel(f"{splits.pop() if len(splits) == 1 else 'val/test'} accuracy")
    ax.set_title("accuracy against global batch")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out / "accuracy.png")


def curves_plots(runs: list[RunDir], labels: list[str], out: Path, prefix: str) -> dict[str, Path]:
    """Training loss and held-out accuracy (the validation split where a run has one, else the test
    split) against steps, samples seen and wall time."""
    axes_keys = (("step", "optimizer steps"), ("samples", "samples seen"), ("time", "wall time (s)"))
    paths = {}
    for metric in ("loss", "accuracy"):
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
        splits: set[str] = set()
        for run, label in zip(runs, labels):
            events = list(run.read_metrics())
            if metric == "loss":
                points = [(e["step"], e["samples"], e["time"], e["loss"]) for e in events if e["event"] == "step"]
            else:
                ends = {e["epoch"]: e for e in events if e["event"] == "epoch"}
                split = "val" if any(e.get("split") == "val" for e in events) else "test"
                splits.add(split)
                points = [
                    (ends[e["epoch"]]["step"], ends[e["epoch"]]["samples"], ends[e["epoch"]]["time_end"], e["accuracy"])
                    for e in events
                    if e["event"] == "eval" and e["split"] == split and e["epoch"] in ends
                ]
            for i, (ax, (_, xlabel)) in enumerate(zip(axes, axes_keys)):
                ax.plot(
                    [p[i] for p in points],
                    [p[3] for p in points],
                    marker="." if metric == "accuracy" else None,
                    label=label,
                )
                ax.set_xlabel(xlabel)
                ax.grid(alpha=0.3)
        # The split the accuracy was measured on, named as compare's and report's tables name it.
        axes[0].set_ylabel(
            "training loss" if metric == "loss" else f"{splits.pop() if len(splits) == 1 else 'val/test'} accuracy"
        )
        axes[0].legend()
        paths[metric] = _save(fig, out / f"{prefix}{metric}.png")
    return paths


def batch_plot(events: list[dict[str, Any]], start: int, path: Path) -> Path:
    """--batch-schedule: the global batch against the optimizer step (a step at each `batch` event) and,
    adaptive, the noise scale read at every log point with its standard error (`noise` events), and the
    noise scale that moved the batch."""
    changes = [e for e in events if e["event"] == "batch"]
    last = max((e["step"] for e in events if "step" in e), default=0)
    steps = [0, *(c["step"] for c in changes), last]
    batches = [start, *(c["global_batch"] for c in changes)]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.step(steps, [*batches, batches[-1]], where="post", label="global batch")
    readings = [e for e in events if e["event"] == "noise" and e.get("noise_scale")]
    if readings:
        at = [r["step"] for r in readings]
        noise = [r["noise_scale"] for r in readings]
        error = [r.get("noise_scale_stderr") or 0.0 for r in readings]
        ax.plot(at, noise, color="tab:gray", linewidth=1, label="gradient noise scale (± standard error)")
        # The band's floor stays above 0: the axis is logarithmic.
        low = [max(n - e, n / 10) for n, e in zip(noise, error)]
        ax.fill_between(at, low, [n + e for n, e in zip(noise, error)], color="tab:gray", alpha=0.2, linewidth=0)
    noisy = [c for c in changes if c.get("noise_scale") is not None]
    if noisy:
        ax.plot([c["step"] for c in noisy], [c["noise_scale"] for c in noisy], "x", label="noise scale that moved it")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("samples")
    ax.set_title("the global batch over the run (--batch-schedule)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def breakdown_plot(breakdowns: list[dict[str, float | None]], labels: list[str], path: Path) -> Path:
    """Stacked bars: where each run's step time goes (seconds per step by phase: summary.json's
    `breakdown`, a scaling row's)."""
    phases = ("data_s", "compute_s", "comm_s", "optimizer_s", "other_s")
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(labels) + 1.6))  # wide enough for the five-entry legend
    left = [0.0] * len(labels)
    for phase in phases:
        values = [(b.get(phase) or 0.0) * 1e3 for b in breakdowns]
        ax.barh(labels, values, left=left, label=phase.removesuffix("_s"))
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("ms per optimizer step")
    ax.legend(ncol=5, fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return _save(fig, path)


def sweep_plots(result: SweepResult, out: Path) -> dict[str, Path]:
    """Per swept parameter: each metric and the trial time against its values; the optimisation
    history; with several metrics, the Pareto front of the first two."""
    trials = result.completed()
    metrics = result.metric
    params = list(result.space["parameters"])
    paths: dict[str, Path] = {}
    if not trials:
        return paths
    for param in params:
        paths[f"by-{param}"] = _save(sweep_param_figure(result, param), out / f"sweep-by-{param}.png")

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    numbers = [t.number for t in trials]
    first = [t.metrics[metrics[0]] for t in trials]
    ax.scatter(numbers, first, label="trial")
    better = min if result.objective[0] == "minimize" else max
    best = [better(first[: i + 1]) for i in range(len(first))]
    ax.step(numbers, best, where="post", color="C1", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(metrics[0])
    ax.set_title("optimisation history")
    ax.grid(alpha=0.3)
    ax.legend()
    paths["history"] = _save(fig, out / "sweep-history.png")

    if len(metrics) > 1:
        front = {t.number for t in result.best.pareto_front} if isinstance(result.best, ParetoFront) else set()
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        xs, ys = [t.metrics[metrics[1]] for t in trials], [t.metrics[metrics[0]] for t in trials]
        ax.scatter(xs, ys, color="0.6", label="trial")
        on = sorted((x, y) for t, x, y in zip(trials, xs, ys) if t.number in front)
        ax.plot([p[0] for p in on], [p[1] for p in on], "o-", color="C3", label="Pareto front")
        ax.set_xlabel(f"{metrics[1]} ({result.objective[1]})")
        ax.set_ylabel(f"{metrics[0]} ({result.objective[0]})")
        ax.set_title("Pareto front")
        ax.grid(alpha=0.3)
        ax.legend()
        paths["pareto"] = _save(fig, out / "sweep-pareto.png")

    if result.algorithm == "grid" and len(params) == 2:
        paths["heatmap"] = _heatmap(result, params, out / "sweep-heatmap.png")
    return paths


def sweep_param_figure(result: SweepResult, param: str) -> Any:
    """The figure of sweep-by-PARAM.png: one panel per metric and the trial time against `param`'s
    values; a validation metric's test counterpart, where the trials report one, in the panel beside
    it. With a second parameter the points take its values' colours (a legend naming the parameter
    and each value; a colorbar where it has more values than colours)."""
    trials = result.completed()
    shown = []
    for metric in [m for m in result.metric if m != "time_s"]:
        test = "test_" + metric.removeprefix("val_")
        shown += [
            metric,
            *(
                [test]
                if metric.startswith("val_") and test not in result.metric and any(test in t.metrics for t in trials)
                else []
            ),
        ]
    shown.append("time_s")
    # At most three panels a row, each the size of a single plot: labels stay readable at page width.
    cols = min(len(shown), 3)
    fig, axes = plt.subplots(
        -(-len(shown) // cols), cols, figsize=(4.2 * cols, 3.4 * -(-len(shown) // cols)), squeeze=False
    )
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    values = [t.params.get(param) for t in trials]
    categorical = any(isinstance(v, str) for v in values)
    order = sorted(set(values), key=str) if categorical else None
    others = [p for p in result.space["parameters"] if p != param]
    colours, key = _colours_by(others[0], [t.params.get(others[0]) for t in trials]) if others else (None, None)
    for ax, metric in zip(axes.flat, shown):
        xs = [order.index(v) for v in values] if categorical else values
        ys = [t.metrics.get(metric, float("nan")) for t in trials]
        ax.scatter(xs, ys, c=colours, alpha=0.8)
        if categorical:
            ax.set_xticks(range(len(order)), order)
        elif _spans_decades(values):
            ax.set_xscale("log", base=2 if all(float(v).is_integer() for v in values) else 10)
        ax.set_xlabel(param)
        ax.set_ylabel("trial time (s)" if metric == "time_s" else metric)
        ax.grid(alpha=0.3)
    if isinstance(key, list):
        axes.flat[0].legend(handles=key, title=others[0], fontsize="small", title_fontsize="small")
    elif key is not None:
        fig.colorbar(key, ax=axes.flat[len(shown) - 1], label=others[0])  # one panel's: tight_layout takes no more
    fig.suptitle(f"{', '.join(shown)} against {param}" + (f", coloured by {others[0]}" if others else ""))
    return fig


# A second parameter with more values than this is coloured along a colormap, not value by value.
DISTINCT_COLOURS = 10


def _colours_by(param: str, values: list[Any]) -> tuple[list[Any], Any]:
    """Each point's colour by its value of `param`, and the key to them: legend handles (one colour a
    value) or, for a numeric parameter with more values than DISTINCT_COLOURS, a colorbar mappable."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.lines import Line2D

    distinct = sorted(set(values), key=_order)
    if len(distinct) > DISTINCT_COLOURS and all(isinstance(v, (int, float)) for v in values):
        norm = (LogNorm if _spans_decades(values) else Normalize)(min(values), max(values))
        mappable = ScalarMappable(norm=norm, cmap="viridis")
        return [mappable.to_rgba(v) for v in values], mappable
    colour = {v: f"C{i % DISTINCT_COLOURS}" for i, v in enumerate(distinct)}
    return (
        [colour[v] for v in values],
        [Line2D([], [], marker="o", linestyle="", color=colour[v], label=_label(v)) for v in distinct],
    )


def heatmap_cells(result: SweepResult, metric: str) -> tuple[list[Any], list[Any], list[list[float]]]:
    """A two-parameter grid as a table: the first parameter's values (rows), the second's
    (columns), and the metric's mean over each cell's completed trials (NaN where none completed)."""
    first, second = list(result.space["parameters"])
    done = [t for t in result.completed() if metric in t.metrics]
    rows = sorted({t.params[first] for t in result.trials}, key=_order)
    cols = sorted({t.params[second] for t in result.trials}, key=_order)
    cells = [
        [
            float(np.mean(values))
            if (values := [t.metrics[metric] for t in done if t.params[first] == r and t.params[second] == c])
            else float("nan")
            for c in cols
        ]
        for r in rows
    ]
    return rows, cols, cells


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def _heatmap(result: SweepResult, params: list[str], path: Path) -> Path:
    """One panel per objective: the grid's cells coloured by the metric, each cell annotated."""
    metrics = result.metric
    repeats = result.space.get("repeats", 1)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2), squeeze=False)
    for ax, metric, objective in zip(axes[0], metrics, result.objective):
        rows, cols, cells = heatmap_cells(result, metric)
        grid = np.array(cells)
        # Better is bright (yellow) whether the metric is minimised or maximised.
        image = ax.imshow(grid, cmap="viridis_r" if objective == "minimize" else "viridis", aspect="auto")
        fig.colorbar(image, ax=ax, label=metric)
        ax.set_xticks(range(len(cols)), [_label(c) for c in cols])
        ax.set_yticks(range(len(rows)), [_label(r) for r in rows])
        ax.set_xlabel(params[1])
        ax.set_ylabel(params[0])
        finite = grid[np.isfinite(grid)]
        middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                dark = value > middle if objective == "minimize" else value < middle
                ax.text(
                    j, i, f"{value:.3g}", ha="center", va="center", fontsize="small", color="white" if dark else "black"
                )
        ax.set_title(f"{metric} ({objective}{f', mean of {repeats}' if repeats > 1 else ''})")
    return _save(fig, path)


def _label(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _spans_decades(values: list[Any]) -> bool:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and v > 0]
    return len(numbers) == len(values) and bool(numbers) and max(numbers) / min(numbers) >= 16


def monitor_plot(ev: Any, path: Path) -> Path | None:
    """The monitor's timelines per device (RunEvidence `ev`): each rank's CPU % and resident memory,
    each GPU's utilisation, against seconds since training started, with the phases marked: epochs
    (dotted lines) and evaluation and checkpoints (shaded). Legends carry each device's idle share."""
    from paratrain.doctor import idle_fractions

    ranks, gpus = ev.rank_samples, ev.gpu_samples
    if not ranks and not gpus:
        return None
    origin = ev.start_unix or min(s["time"] for s in ev.system)
    idle = idle_fractions(ev)
    panels = [p for p, present in (("cpu", ranks), ("rss", ranks), ("gpu", gpus)) if present]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.3 * len(panels) + 0.6), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        devices = gpus if panel == "gpu" else ranks
        for i, (device, samples) in enumerate(devices.items()):
            label = f"GPU {device}" if panel == "gpu" else f"rank {device}"
            key, scale = {
                "cpu": ("cpu_percent", 1.0),
                "rss": ("rss_bytes", 2.0**-20),
                "gpu": ("utilization_percent", 1.0),
            }[panel]
            shown = f"{label} (idle {idle.get(label, 0.0):.0%})" if panel != "rss" else label
            ax.plot(
                [s["time"] - origin for s in samples],
                [s[key] * scale for s in samples],
                color=f"C{i}",
                linewidth=1.2,
                label=shown,
            )
        ax.set_ylabel({"cpu": "CPU % (100 = a core)", "rss": "resident MiB", "gpu": "GPU utilisation %"}[panel])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper right", ncol=min(4, len(devices)))
        for phase in ev.phases():
            if phase.kind == "eval":
                ax.axvspan(phase.start - origin, phase.end - origin, color="C1", alpha=0.15, linewidth=0)
            else:
                ax.axvline(phase.start - origin, color="0.4", linestyle=":", linewidth=1)
    top = axes[0, 0]
    for phase in ev.phases():
        if phase.kind == "train":
            top.annotate(
                f"epoch {phase.epoch + 1}",
                (phase.start - origin, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize="small",
                va="bottom",
                color="0.3",
            )
    checkpoints = " and checkpoints" if ev.config.get("checkpoint_every") else ""
    axes[-1, 0].set_xlabel(
        f"seconds since the ranks started (metrics.jsonl time; shaded: evaluation{checkpoints}; dotted: epoch starts)"
        if ev.start_unix
        else "seconds since the first sample"
    )
    return _save(fig, path)


def plan_plots(plan: Plan, out: Path) -> dict[str, Path]:
    """A plan's three plots: predicted scaling with the ideal line, memory per device by strategy at
    the largest device count planned, and device-hours against wall time with the bend marked."""
    return {
        "scaling": _plan_scaling_plot(plan, out),
        "memory": _plan_memory_plot(plan, out),
        **({"pareto": _plan_pareto_plot(plan.pareto, out)} if plan.pareto else {}),
    }


def _plan_scaling_plot(plan: Plan, out: Path) -> Path:
    curve = [c for c in plan.curve if c.strategy]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    xs = [c.devices for c in curve]
    ax.plot(xs, xs, ":", color="grey", label="ideal (speedup = devices)")
    for strategy in dict.fromkeys(c.strategy for c in curve):
        mine = [c for c in curve if c.strategy == strategy]
        ax.plot([c.devices for c in mine], [c.speedup for c in mine], "o", label=f"best: {strategy}")
    ax.plot(xs, [c.speedup for c in curve], "-", color="C0", alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("devices")
    ax.set_ylabel("predicted speedup")
    ax.set_title(f"{plan.model.name} on {plan.device.name} ({plan.device.precision})", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out / "plan_scaling.png")


def _plan_memory_plot(plan: Plan, out: Path) -> Path:
    top = max(r.devices for r in plan.rows)
    rows = [r for r in plan.rows if r.devices == top]
    parts = (
        "parameters_bytes",
        "gradients_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "transient_bytes",
        "gathered_bytes",
        "buffers_bytes",
        "runtime_bytes",
    )
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    bottom = np.zeros(len(rows))
    for part in parts:
        values = np.array([r.memory.get(part, 0) / 2**30 for r in rows])  # plans before transient_bytes lack it
        if values.any():
            ax.bar([r.strategy for r in rows], values, bottom=bottom, label=part.replace("_bytes", ""))
            bottom += values
    usable = plan.device.memory_bytes * plan.device.usable_fraction / 2**30
    ax.axhline(usable, color="red", linestyle="--", label=f"usable {usable:.1f} GiB")
    ax.set_ylabel("GiB per device")
    ax.set_title(f"memory per device, {top} device(s)", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out / "plan_memory.png")


def _plan_pareto_plot(pareto: PlanCost, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    points = pareto.points
    frontier = [p for p in points if p.devices in pareto.frontier]
    ax.plot(
        [p.wall_hours for p in points],
        [p.device_hours for p in points],
        "o",
        color="grey",
        markersize=3,
        label="dominated: slower and no cheaper",
    )
    ax.plot([p.wall_hours for p in frontier], [p.device_hours for p in frontier], "o-", markersize=4, label="frontier")
    for p in frontier:
        ax.annotate(
            str(p.devices),
            (p.wall_hours, p.device_hours),
            fontsize=6,
            xytext=(2, 2),
            textcoords="offset points",
        )
    bend = next((p for p in points if p.devices == pareto.bend_devices), None)
    if bend:
        ax.plot([bend.wall_hours], [bend.device_hours], "r*", markersize=12, label=f"bend: {bend.devices} devices")
    ax.legend(fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"wall time (hours) for {pareto.samples:,} samples")
    ax.set_ylabel("device-hours")
    ax.set_title("cost against time: the Pareto frontier", fontsize=9)
    return _save(fig, out / "plan_pareto.png")


def batch_plots(results: dict[str, dict[str, Any]], out: Path) -> dict[str, Path]:
    """The batch-size measurements (paratrain find-batch, noise-scale, lr-find) of one --out directory."""
    paths = {}
    if "noise_scale" in results:
        noise = results["noise_scale"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
        series = [s for s in noise["series"] if s["b_simple"] is not None]
        left.plot([s["step"] for s in series], [s["b_simple"] for s in series])
        left.set_xlabel("optimizer step")
        left.set_ylabel("B_simple (ratio of moving averages)")
        left.set_title(f"gradient noise scale; batches {noise['small_batch']} and {noise['big_batch']}", fontsize=9)
        if noise["curve"]:
            batches = [c["batch"] for c in noise["curve"]]
            right.plot(batches, [c["steps_vs_min"] for c in noise["curve"]], "o-", label="steps / S_min")
            right.plot(batches, [c["examples_vs_min"] for c in noise["curve"]], "s-", label="examples / E_min")
            right.axvline(
                noise["critical_batch"], color="grey", ls=":", label=f"critical batch ≈ {noise['critical_batch']:,.0f}"
            )
            right.set_xscale("log", base=2)
            right.set_yscale("log")
            right.set_xlabel("batch size")
            right.set_title("predicted cost to reach the same loss (McCandlish et al. 2018)", fontsize=9)
            right.legend(fontsize=7)
        paths["noise_scale"] = _save(fig, out / "noise_scale.png")
    if "find_batch" in results:
        found = results["find_batch"]
        fitted = [p for p in found["probes"] if p["fits"]]
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        ax.plot([p["batch"] for p in fitted], [p["samples_per_s"] for p in fitted], "o-", color="C0")
        ax.axvline(found["knee_batch"], color="C0", ls=":", label=f"knee {found['knee_batch']}")
        ax.axvline(found["max_batch"], color="C3", ls="--", label=f"largest that fits {found['max_batch']}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch per worker")
        ax.set_ylabel("samples/s", color="C0")
        memory = ax.twinx()
        memory.plot([p["batch"] for p in fitted], [p["peak_memory_bytes"] / 2**20 for p in fitted], "s--", color="C1")
        memory.set_ylabel("peak memory per rank (MiB)", color="C1")
        ax.legend(fontsize=7, loc="upper left")
        paths["find_batch"] = _save(fig, out / "find_batch.png")
    if "lr_find" in results:
        found = results["lr_find"]
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        lrs = [c["lr"] for c in found["curve"]]
        ax.plot(lrs, [c["loss"] for c in found["curve"]], color="C0", alpha=0.3, label="loss")
        ax.plot(lrs, [c["smoothed"] for c in found["curve"]], color="C0", label="smoothed")
        ax.axvline(found["suggested_lr"], color="C3", ls="--", label=f"suggested {found['suggested_lr']:.3g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        ax.set_title(f"LR range test at global batch {found['global_batch_size']}", fontsize=9)
        ax.legend(fontsize=7)
        paths["lr_find"] = _save(fig, out / "lr_find.png")
    return paths
