"""Steps that keep slowing down: a phase whose time grows step after step (launch/step_trend.py), because
something accumulates with every step; or steps that got slower at one step and stayed so, because some work
began there. Forward hooks registered inside the loop run one more time each
step; a list that keeps tensors with their autograd graphs, a tensor grown by torch.cat, a cache never cleared
make the work, the allocations or the garbage collector's rounds grow with them. No single step looks wrong;
the run gets slower as it goes, so a longer run loses more.

    growing_steps   a phase grows on a straight line through the steady steps: the prediction is the run with
                    that phase at the line's time at the first step
    slower_from_step
                    a phase jumped to a new level at one step and kept it: the prediction, a bound, is the run with
                    that phase at its level before the jump
"""

from __future__ import annotations

import statistics

from paratrain.doctor.causes import _phase, _script, _step, trace_top
from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, speedup
from paratrain.launch.probe.window import TRACE_STEPS, WINDOW_AFTER_STEP
from paratrain.launch.trace_summary import PROBE_LABEL

GROWTH_SAVING = 0.05  # of the step, the growth's mean cost that names it


def _costliest(ev: RunEvidence, trend: str, level: int) -> tuple[str, list[list[float]], float]:
    """Of the phases with a `trend` in a rank's record, the one costing most: its mean over the steady steps less
    its time at `level` of the fits (the line at the first step, the level before the jump), counted on the ranks
    where it has that trend (none on the others); its fits and that cost a step. ("", [], 0) for none."""
    fits: dict[str, list[list[float]]] = {}
    for r in ev.probe_ranks:
        for phase, fit in (r.get(trend) or {}).items():
            fits.setdefault(phase, []).append(fit)
    if not fits:
        return "", [], 0.0
    share = {p: len(f) / len(ev.probe_ranks) for p, f in fits.items()}
    costs = {p: (_phase(ev, p) - statistics.mean(fit[level] for fit in f)) * share[p] for p, f in fits.items()}
    phase = max(costs, key=costs.get)
    return phase, fits[phase], costs[phase]


def growing_steps(ev: RunEvidence) -> Finding | None:
    """The phase growing most, on the ranks where it grows: its mean over the steady steps less the line's time
    at the run's first step is what the accumulation costs a step, on average over this run."""
    phase, grown, cost = _costliest(ev, "growing", 0)
    if not grown or cost / _step(ev) < GROWTH_SAVING:
        return None
    step = _step(ev)
    start = statistics.mean(fit[0] for fit in grown)
    end = statistics.mean(fit[1] for fit in grown)
    steps = statistics.mean(r.get("steady_steps", 0) for r in ev.probe_ranks)
    where = [n for n, _ in trace_top(ev, phase, "call") + trace_top(ev, phase, "where") if n != PROBE_LABEL]
    return Finding(
        "growing_steps",
        f"the steps keep slowing down: {phase} grows from {ms(start)} to {ms(end)} over the run, "
        f"{pct(cost / step)} of the mean step",
        f"step {ms(step)} on average; {phase} {ms(_phase(ev, phase))} on average, on a straight line from "
        f"{ms(start)} at the first step to {ms(end)} at the last, over {steps:.0f} steps "
        f"(R² {statistics.mean(fit[2] for fit in grown):.2f}, {len(grown)} of "
        f"{len(ev.probe_ranks)} ranks)"
        + (f"; in the profiled steps {phase} ran {', '.join(where[:3])}" if where else ""),
        "something accumulates with every step: a forward hook registered inside the loop (register_forward_hook "
        "or register_full_backward_hook each step, its handle never removed) runs once more at every step; a "
        "list that keeps tensors with their graphs (losses kept without .item() or .detach()), a tensor grown "
        "by torch.cat, a cache never cleared grow the work, the allocations and the garbage collector's rounds",
        f"code change in {_script(ev)}: register hooks once, before the loop (or keep the handle and call "
        ".remove()); keep detached values (.detach(), .item()) and collect them in a list, concatenated once "
        f"at the end; look at what {phase} does more of at each step",
        f"{speedup(cost / step)}: {phase} at its first step's time throughout (a longer run gains more)",
        cost / step,
        where=where[0] if where else f"the {phase} phase",
        share=cost / step,
        explains={phase: cost},
    )


def slower_from_step(ev: RunEvidence) -> Finding | None:
    """The phase that jumped most, on the ranks where it jumped: its mean over the steady steps less its level
    before the jump is what the new work costs a step, on average over this run."""
    phase, fits, cost = _costliest(ev, "jumped", 1)
    if not fits or cost / _step(ev) < GROWTH_SAVING:
        return None
    step = _step(ev)
    first = round(statistics.median(fit[0] for fit in fits))
    before, after = statistics.mean(fit[1] for fit in fits), statistics.mean(fit[2] for fit in fits)
    profiled = WINDOW_AFTER_STEP + TRACE_STEPS
    where = [n for n, _ in trace_top(ev, phase, "where") if n != PROBE_LABEL] if first <= profiled else []
    return Finding(
        "slower_from_step",
        f"the steps got slower from step {first} on: {phase} went from {ms(before)} to {ms(after)} a step, "
        f"{pct(cost / step)} of the mean step",
        f"step {ms(step)} on average; {phase} {ms(before)} a step before step {first}, {ms(after)} from it on "
        f"(medians of runs of steps; one jump fits them with R² {statistics.mean(fit[3] for fit in fits):.2f}, "
        f"better than a steady growth; {len(fits)} of {len(ev.probe_ranks)} ranks)"
        + (
            f"; in the profiled steps {phase} ran {', '.join(where[:3])}"
            if where
            else f"; the profiled steps (up to step {profiled}) came before it, so they do not show the new work"
        ),
        "some work began at that step and runs at every step since: statistics or logging switched on after a "
        "warm-up, an evaluation or a schedule that became per-step, a curriculum's longer sequences",
        f"code change in {_script(ev)}: find what the script starts at step {first} (a condition on the step "
        "count or the epoch); run it every 100 steps, or not at all, if it is not needed at every step",
        f"up to {speedup(cost / step)}: {phase} at its level before step {first} throughout (a bound: how much of "
        "the new work the remedy keeps is unknown)",
        cost / step,
        where=where[0] if where else f"the script's code that begins at step {first}",
        share=cost / step,
        bound=True,
        explains={phase: cost},
    )


GROWTH = (growing_steps, slower_from_step)
