"""The doctor's checks of a scaling study and of a sweep: each reads the study's or the sweep's records
and returns a Finding (or findings) or None. The run checks are in checks.py, the per-rank ones in
rank_checks.py."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from paratrain.doctor.checks import EDGE_SHARE  # the thresholds live in one place
from paratrain.doctor.finding import Finding
from paratrain.formatting import human, speedup
from paratrain.runs.records import Study, Trial


def lr_not_scaled(study: Study, configs: dict[str, dict[str, Any]]) -> Finding | None:
    """Weak scaling grew the global batch while the LR stayed put."""
    rows = study.points()
    if study.mode != "weak" or len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    rules = {configs.get(r.run_dir or "", {}).get("lr_scaling") for r in rows}
    # rules first: a study of a user's script (`scale --script`) has no LR rule and may report no global batch
    if (
        rules != {"none"}
        or first.global_batch_size is None
        or last.global_batch_size is None
        or last.global_batch_size <= first.global_batch_size
        or last.lr != first.lr
    ):
        return None
    grow = last.global_batch_size / first.global_batch_size
    return Finding(
        "lr_not_scaled",
        f"weak scaling grew the global batch {grow:.0f}x but not the LR",
        f"global batch {first.global_batch_size} -> {last.global_batch_size}, LR {first.lr:g} at every point "
        f"(--lr-scaling none){_accuracy_change(first.val_accuracy, last.val_accuracy)}",
        "with k times the batch, SGD takes k times fewer steps of the same size: it covers less distance per epoch "
        "(Goyal et al. 2017 scale the LR linearly, with warmup)",
        f"paratrain scale --workers {','.join(str(r.workers) for r in rows)} --lr-scaling linear --warmup-epochs 1 "
        "(plus the study's other flags)",
        "accuracy per epoch, not time (the linear scaling rule; no number predicted)",
        None,
        "advice",
    )


def _accuracy_change(first: float | None, last: float | None) -> str:
    return "" if first is None or last is None else f"; accuracy {first:.1%} -> {last:.1%}"


def batch_knee(trials: list[Trial], best: Trial | None) -> Finding | None:
    """A sweep over batch_size measured throughput per batch: is the chosen batch below the knee
    (the smallest batch within 5 % of the best samples/s)?"""
    done = [t for t in trials if t.state == "COMPLETE" and "batch_size" in t.params and t.metrics.get("samples_per_s")]
    if best is None or "batch_size" not in best.params or len({t.params["batch_size"] for t in done}) < 3:
        return None
    rates: dict[int, float] = {}
    for b in {t.params["batch_size"] for t in done}:
        rates[b] = statistics.median(t.metrics["samples_per_s"] for t in done if t.params["batch_size"] == b)
    top = max(rates.values())
    knee = min(b for b, r in rates.items() if r >= 0.95 * top)
    chosen = best.params["batch_size"]
    if chosen >= knee:
        return None
    saving = 1 - rates[chosen] / rates[knee]
    return Finding(
        "batch_below_knee",
        f"the best trial's batch {chosen} is below the throughput knee ({knee})",
        "samples/s by batch: " + ", ".join(f"{b}: {rates[b]:,.0f}" for b in sorted(rates)),
        "a small per-device batch leaves the device under-used: each step's fixed costs dominate",
        f"train with --batch-size {knee} (and the LR scaled with it, --lr-scaling linear), or keep {chosen} if its "
        "accuracy is worth the time",
        f"{speedup(saving)} per sample ({rates[knee]:,.0f} against {rates[chosen]:,.0f} samples/s, measured)",
        saving,
        global_batch_factor=knee / chosen,
    )


def best_at_edge(space: dict[str, Any], trials: list[Trial], best: Trial | None, metric: str) -> list[Finding]:
    """The best trial's value of a numeric parameter at the end of what the space allows: a list of 3 or more
    numbers at its smallest or largest, a range within EDGE_SHARE of either end. A sweep can only find the best
    inside its space; at the edge the better values may lie beyond it (docs/batch-size.md: the best of batches
    8, 16 and 32 was 8, and 4 trained better still)."""
    if best is None:
        return []
    found = []
    for name, spec in (space.get("parameters") or {}).items():
        value = best.params.get(name)
        if not _number(value):
            continue
        side = _edge_side(spec, value)
        if side is None:
            continue
        if spec.get("values") is not None:
            searched = ", ".join(human(name, v) for v in sorted(spec["values"]))
            beyond = _next_value(sorted(spec["values"]), side, spec.get("type"))
            means = _means_by_value(trials, name)
            evidence = f"{name} searched over {searched}; {metric} by {name}: " + ", ".join(
                f"{human(name, v)}: {human(metric, m)}" for v, m in means.items()
            )
            kinds = {type(v) for v in spec["values"]}
            extended = space.get("algorithm") == "grid" and kinds in ({int}, {float})
            remedy = (
                f"add {name} values beyond {human(name, value)}"
                + (f" (e.g. {human(name, beyond)})" if beyond is not None else "")
                + " to the config file and "
                + (
                    "rerun the same command: the grid is extended, its finished trials kept"
                    if extended
                    else "sweep again with a new --out (only a grid's lists of numbers can be extended in place)"
                )
            )
        else:
            scale = " in log space" if spec.get("scaling") in ("loguniform", "lognormal") else ""
            evidence = (
                f"{name} searched from {human(name, spec['low'])} to {human(name, spec['high'])}{scale}; the best "
                f"trial's {human(name, value)} is within the {'lowest' if side == 'smallest' else 'highest'} "
                f"{EDGE_SHARE:.0%} of it"
            )
            bound = "min" if side == "smallest" else "max"
            remedy = f"move {name}'s {bound} beyond {human(name, value)} and sweep again with a new --out"
        found.append(
            Finding(
                "best_at_edge",
                f"the best trial's {name}, {human(name, value)}, is at the {side} end of the space",
                evidence,
                "a sweep finds the best inside the space it is given; at the edge of it, better values may lie beyond",
                remedy,
                "not predicted: the values beyond the edge are unmeasured",
                None,
            )
        )
    return found


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _edge_side(spec: dict[str, Any], value: float) -> str | None:
    """'smallest' or 'largest' when `value` is at that end of the parameter's space, else None."""
    values = spec.get("values")
    if values is not None:
        numbers = sorted({v for v in values if _number(v)})
        if len(numbers) < 3 or len(numbers) < len(values):  # two values: the best is always at an end
            return None
        return "smallest" if value == numbers[0] else "largest" if value == numbers[-1] else None
    low, high = spec.get("low"), spec.get("high")
    if low is None or high is None or high <= low:
        return None  # a normal prior without bounds has no edge
    if spec.get("scaling") in ("loguniform", "lognormal") and low > 0:
        low, high, value = math.log(low), math.log(high), math.log(min(max(value, low), high))
    share = (value - low) / (high - low)
    return "smallest" if share <= EDGE_SHARE else "largest" if share >= 1 - EDGE_SHARE else None


def _next_value(values: list[float], side: str, kind: str | None) -> float | None:
    """The next value beyond the end of an ordered list, by its own step: its ratio when the list is geometric
    (8, 16, 32 -> 4 or 64), else the difference of its two end values. None when that leaves the list's kind:
    an integer list's next value a fraction, a list of positive numbers' next value 0 or less."""
    end, inner = (values[0], values[1]) if side == "smallest" else (values[-1], values[-2])
    ratios = [b / a for a, b in itertools.pairwise(values)] if values[0] > 0 else []
    if ratios and max(ratios) - min(ratios) <= 1e-9 * max(ratios) and ratios[0] != 1:
        beyond = end * end / inner
    else:
        beyond = end + (end - inner)
    if values[0] > 0 and beyond <= 0:
        return None
    whole = all(isinstance(v, int) for v in values) or kind == "integer"
    if whole:
        return int(beyond) if float(beyond).is_integer() else None
    return beyond


def _means_by_value(trials: list[Trial], name: str) -> dict[Any, float]:
    """The objective's mean over the completed trials at each value of `name`, in the values' order (a
    multi-objective sweep's first objective, the one the evidence names)."""
    by_value: dict[Any, list[float]] = {}
    for t in trials:
        value = t.value[0] if isinstance(t.value, (list, tuple)) and t.value else t.value
        if t.state == "COMPLETE" and isinstance(value, (int, float)) and name in t.params:
            by_value.setdefault(t.params[name], []).append(float(value))
    return {v: statistics.mean(by_value[v]) for v in sorted(by_value)}
