"""How a phase's time moves through a run's steady steps: growing step after step (something accumulates: hooks
registered in the loop, a list of tensors summed every step), or jumping once and staying (work that begins at
some step: statistics switched on after a warm-up). Read from the probe's per-step records
(launch/probe_summary.py), for the doctor's growing_steps and slower_from_step.

The steps are read in GROWTH_BINS runs of consecutive steps, each by its median: one slow step (a collection, a
checkpoint) moves no median, so a trend stands out of noisy steps. A straight line and a single jump are both
fitted to the medians; the one that fits better says which it is. Both must also stand beyond the machine's drift:
a VM slowing down for a while makes every phase grow (forward and backward 1.45x together, R² 0.63 on the raw
steps, measured on a run with nothing accumulating), while what accumulates grows in one phase.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from paratrain.launch.probe import PHASES

# A phase growing through the run: ending this many times as long as it began, this much longer, on a straight
# line fitting the runs' medians this well (R²) and better than one jump, over at least this many steps.
GROWTH, GROWTH_MIN_S, GROWTH_FIT, GROWTH_STEPS = 1.5, 0.002, 0.8, 20
GROWTH_BINS = 10  # runs of consecutive steps, each read by its median
JUMP_FIT = 0.9  # a single jump fitting the medians this well (R²), better than a line: a step change...
JUMP_RUNS = 2  # ...with this many runs at each level
# Waiting for the other ranks: it jumps when another rank's work does, no cause of its own.
WAITING = ("comm", "collective")
# The model's own work, whose drift through the run is the machine's.
MODEL_WORK, MODEL_WORK_MIN_S = ("forward", "backward", "recompute", "optimizer"), 0.001


def _medians(used: list[dict[str, Any]], key: Any) -> tuple[list[float], list[float]]:
    """The steps' numbers and `key(step)` by runs of consecutive steps: the median of each."""
    n = len(used)
    bins = min(GROWTH_BINS, n)
    edges = [round(i * n / bins) for i in range(bins + 1)]
    runs = [used[a:b] for a, b in itertools.pairwise(edges)]
    xs = [statistics.median(float(s.get("step", 0)) for s in run) for run in runs]
    ys = [statistics.median(key(s) for s in run) for run in runs]
    return xs, ys


def _jump(ys: list[float]) -> tuple[float, int]:
    """R² of the best single jump through the medians (one level before it, one after, each held JUMP_RUNS runs or
    more: one slow run at the end is no new level), and the first run after it."""
    total = sum((y - statistics.mean(ys)) ** 2 for y in ys)
    best, at = 0.0, JUMP_RUNS
    for k in range(JUMP_RUNS, len(ys) - JUMP_RUNS + 1):
        before, after = ys[:k], ys[k:]
        sse = sum((y - statistics.mean(before)) ** 2 for y in before) + sum(
            (y - statistics.mean(after)) ** 2 for y in after
        )
        if 1 - sse / total > best:
            best, at = 1 - sse / total, k
    return best, at


def trends(used: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """{"growing": {phase: [the line at the run's first step (step 0: what accumulates began with the run), at the
    last steady step, the line's R²]}, "jumped": {phase: [the first step at the new level, the level before, after,
    the jump's R²]}} for the phases that moved GROWTH times, GROWTH_MIN_S, and GROWTH times as much as the rest of
    the model's work drifted over the same steps (`drift`); empty ones left out."""
    if len(used) < GROWTH_STEPS:
        return {}
    last = float(used[-1].get("step", len(used) - 1))
    growing, jumped = {}, {}
    for phase in PHASES:
        xs, ys = _medians(used, lambda s, p=phase: s.get(p, 0.0))
        if len(set(xs)) < 2 or len(set(ys)) < 2:
            continue
        slope, intercept = statistics.linear_regression(xs, ys)
        line = statistics.correlation(xs, ys) ** 2
        jump, at = _jump(ys)
        machine = drift(used, [p for p in MODEL_WORK if p != phase])
        start, end = max(0.0, intercept), intercept + slope * last
        if line >= GROWTH_FIT and line > jump and end - start >= GROWTH_MIN_S and end >= GROWTH * start * machine:
            growing[phase] = [round(start, 6), round(end, 6), round(line, 3)]
            continue
        if phase in WAITING:
            continue
        before, after = statistics.mean(ys[:at]), statistics.mean(ys[at:])
        moved = after - before >= GROWTH_MIN_S and after >= GROWTH * before * _jumped_by(used, phase, at)
        if jump >= JUMP_FIT and moved:  # a jump a line fits better is a growth, taken above
            jumped[phase] = [_first_after(used, phase, at, len(ys)), round(before, 6), round(after, 6), round(jump, 3)]
    return {k: v for k, v in (("growing", growing), ("jumped", jumped)) if v}


def _first_after(used: list[dict[str, Any]], phase: str, at: int, bins: int) -> int:
    """The first step at the new level: in the runs either side of the jump, the step that splits them best."""
    n = len(used)
    a, b = round((at - 1) * n / bins), round((at + 1) * n / bins)
    ys = [s.get(phase, 0.0) for s in used[a:b]]

    def sse(k: int) -> float:
        return sum((y - statistics.mean(part)) ** 2 for part in (ys[:k], ys[k:]) for y in part)

    k = min(range(1, len(ys)), key=sse)
    return int(used[a + k].get("step", a + k))


def _jumped_by(used: list[dict[str, Any]], phase: str, at: int) -> float:
    """How many times as long the rest of the model's work is after the runs' jump as before it (1 when too small
    to say): a machine that slowed at once slows it too."""
    _, ys = _medians(used, lambda s: sum(s.get(p, 0.0) for p in MODEL_WORK if p != phase))
    before, after = statistics.mean(ys[:at]), statistics.mean(ys[at:])
    return after / before if statistics.mean(ys) >= MODEL_WORK_MIN_S and before > 0 else 1.0


def drift(used: list[dict[str, Any]], phases: list[str]) -> float:
    """How many times as long the phases' summed time is at the last steady step as at the first, on a straight
    line through the runs' medians (1 when it is too small to say)."""
    xs, ys = _medians(used, lambda s: sum(s.get(p, 0.0) for p in phases))
    if statistics.mean(ys) < MODEL_WORK_MIN_S or len(set(ys)) < 2:
        return 1.0
    slope, intercept = statistics.linear_regression(xs, ys)
    first, last = intercept + slope * xs[0], intercept + slope * xs[-1]
    return last / first if first > 0 else 1.0
