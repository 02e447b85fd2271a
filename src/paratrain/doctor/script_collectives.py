"""The script's own collectives: those it calls between the phases (a loss all-reduced for a log line, a
barrier), and those a library it calls issues one tensor at a time (an optimizer's step or a checkpoint's save
that broadcasts or all-reduces each parameter on its own). Each pays the link's latency and a round through the
process group, and every rank waits for the slowest. The profiled steps name the script's line and the library
function that issued them (launch/trace_summary.py `issuer`, `via`).

    host_sync_stalls      the script's own collectives take COLLECTIVE_SHARE of the step or more: reduce the
                          logged values every COLLECTIVE_EVERY steps
    library_collectives   they come MANY_CALLS or more a step from one library function, SMALL_BYTES or less
                          each: the gain prices them as one call of their bytes on the link the trace measured (a
                          bound when it measured no bandwidth: the transfer taken as free)
"""

from __future__ import annotations

from typing import Any

from paratrain.doctor.causes import _code_change, _script, _step, _steps_text, link_fit
from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, size, speedup

COLLECTIVE_SHARE = 0.10  # the script's own blocking collectives (logging a global loss, a library's), of the step
COLLECTIVE_EVERY = 50  # the remedy for logged values: reduce them every 50 steps
MANY_CALLS = 8  # collectives a step from one library function
SMALL_BYTES = 2**20  # each, on average: latency-bound on any link


def script_collectives(ev: RunEvidence) -> Finding | None:
    if not ev.probe_ranks:
        return None
    # Their own time: the waits inside them for a rank that evaluates alone, or straggles, are those checks'.
    # Less a library's collectives that library_collectives names: the rest is the script's own calls'.
    library, library_s = library_issued(ev)
    collective, step = ev.collective_own_s - library_s, _step(ev)
    if collective / step < COLLECTIVE_SHARE:
        return None
    saving = collective * (1 - 1 / COLLECTIVE_EVERY) / step
    traced = [c for c in _issued(ev) if c not in library]
    return Finding(
        "host_sync_stalls",
        f"the script's own collectives take {pct(collective / step)} of every step",
        f"{_steps_text(ev)}: {ms(collective)} a step in collectives the script calls between the phases"
        + (
            "; in the profiled steps: "
            + ", ".join(f"{c['calls']:.0f} {c['name']} a step at {c['issuer']}" for c in traced[:2])
            if traced
            else ""
        ),
        "a blocking collective every step (an all_reduce of the loss for a log line, a barrier) makes every rank wait "
        "for the slowest and for the network, and reads the value on the host",
        _code_change(
            f"keep running sums on the device and reduce them every {COLLECTIVE_EVERY} steps (or only when logging)", ev
        ),
        f"{speedup(saving)}: {COLLECTIVE_EVERY}x fewer of those collectives",
        saving,
        where=traced[0]["issuer"] if traced else "the script's own torch.distributed calls between the phases",
        explains={"collective": collective},
    )


def _issued(ev: RunEvidence) -> list[dict[str, Any]]:
    """The profiled steps' collectives in the `collective` phase (the script's own, between the phases)."""
    rank = ev.probe_ranks[0] if ev.probe_ranks else {}
    return [c for c in (rank.get("trace") or {}).get("collectives", []) if c["phase"] == "collective"]


def library_issued(ev: RunEvidence) -> tuple[list[dict[str, Any]], float]:
    """The collectives of the library function that issued the most of them, and their seconds a step (the
    collective phase's own time, by their share of its calls), when they are many and small (MANY_CALLS,
    SMALL_BYTES) and take COLLECTIVE_SHARE of the step or more; ([], 0) otherwise."""
    issued = _issued(ev)
    by_via: dict[str, list[dict[str, Any]]] = {}
    for c in issued:
        if c.get("via"):
            by_via.setdefault(c["via"], []).append(c)
    if not by_via:
        return [], 0.0
    calls = max(by_via.values(), key=lambda cs: sum(c["calls"] for c in cs))
    count, moved = sum(c["calls"] for c in calls), sum(c["bytes"] for c in calls)
    seconds = ev.collective_own_s * count / sum(c["calls"] for c in issued)
    if count < MANY_CALLS or moved / count > SMALL_BYTES or seconds / _step(ev) < COLLECTIVE_SHARE:
        return [], 0.0
    return calls, seconds


def library_collectives(ev: RunEvidence) -> Finding | None:
    calls, seconds = library_issued(ev)
    if not calls:
        return None
    count, moved, step = sum(c["calls"] for c in calls), sum(c["bytes"] for c in calls), _step(ev)
    latency, bandwidth = link_fit(ev)
    then = min(seconds, len(calls) * latency + (moved / bandwidth if bandwidth else 0.0))
    saved = seconds - then
    via, caller = calls[0]["via"], calls[0]["issuer"]
    kinds = ", ".join(f"{c['calls']:.0f} {c['name']}" for c in calls)
    link = f"{bandwidth / 1e9:.2f} GB/s" if bandwidth else "its bandwidth unmeasured"
    return Finding(
        "library_collectives",
        f"{pct(seconds / step)} of every step is {count:.0f} small collectives a step from one library call",
        f"step {ms(step)}: {ms(seconds)} a step in {kinds} a step ({size(moved)} together, {size(moved / count)} "
        f"each on average), issued by {via}, called at {caller}; the link: {latency * 1e3:.2f} ms a call at least, "
        f"{link}",
        "the library issues one collective per tensor (a parameter, a gradient, a buffer): each pays the link's "
        "latency and a round through the process group, and every rank waits for each in turn",
        f"code change in {_script(ev)}: let the library send its tensors in buckets, or flattened into one "
        "(its bucketing option: ZeroRedundancyOptimizer(parameters_as_bucket_view=True), a larger bucket size; "
        f"or torch's _flatten_dense_tensors around your own loop) at {caller}",
        f"{'up to ' if not bandwidth else ''}{speedup(saved / step)}: {ms(seconds)} of collectives become "
        f"{len(calls)} call(s) of {size(moved)} ({ms(then)})"
        + ("" if bandwidth else " (a bound: the transfer taken as free)"),
        saved / step,
        where=f"{via}, called at {caller}",
        share=seconds / step,
        bound=not bandwidth,
        explains={"collective": seconds},
    )


LIBRARY_COLLECTIVES = (library_collectives,)
