"""The step's account: what the findings explain, phase by phase, and what is left.

A step's time is the model's own work (forward, backward, recompute), communication, the optimizer, data
loading, evaluation and checkpoints, and `other`: the script's Python between them. Each finding says which
phase time it accounts for (`Finding.explains`). The model's work, its all-reduce and its optimizer step are
the step's purpose; what no finding explains there is that work, up to the model's expected cost: forward and
backward far beyond what the model's layers take alone are reported too (doctor/expected.py). `other` has no
purpose of its own: what no finding explains there, an optimizer step out of proportion, the user's own Python
inside forward and DDP's own work in forward (around the model it wraps: broadcasting buffers, searching the
graph) are reported as unexplained, with where the profiled steps spent them (the trace:
launch/trace_summary.py). "Nothing to fix" is said only when every phase is accounted for this way.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from paratrain.doctor.causes import trace_top
from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.expected import model_work_excess
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, size, speedup
from paratrain.launch.trace_summary import PROBE_LABEL

UNEXPLAINED_SHARE = 0.10  # time in `other` that no finding explains, of the step
OPTIMIZER_SHARE = 0.25  # an optimizer step this large a share of the step is out of proportion
PYTHON_SHARE = 0.15  # the user's own Python inside forward and backward (not operators), of the step
DDP_FORWARD_SHARE = 0.10  # DDP's own work in forward, around the model it wraps, of the step
COMM_SHARE = 0.20  # collectives inside forward and backward that no finding explains, of the step


def explained(findings: Sequence[Finding]) -> dict[str, float]:
    """Seconds per step each phase's time is accounted for by the findings."""
    out: dict[str, float] = {}
    for f in findings:
        for phase, seconds in f.explains.items():
            out[phase] = out.get(phase, 0.0) + seconds
    return out


def _phase(ev: RunEvidence, phase: str) -> float:
    return statistics.mean(r["phases_s"].get(phase, 0.0) for r in ev.probe_ranks)


def _places(ev: RunEvidence, phase: str) -> tuple[str, str]:
    """The profiled steps' largest entries of a phase: what the user's code called there (else what ran), and
    where in the user's code; the probe's own hooks left out."""
    calls = [(n, s) for n, s in trace_top(ev, phase, "call") or trace_top(ev, phase, "what") if n != PROBE_LABEL]
    where = [(n, s) for n, s in trace_top(ev, phase, "where") if n != PROBE_LABEL][:2]
    entry = next(
        (r["trace"]["phases"][phase] for r in ev.probe_ranks if phase in (r.get("trace") or {}).get("phases", {})), None
    )
    total = entry["s"] if entry and entry.get("s") else sum(s for _, s in calls) or 1.0
    ran = ", ".join(f"{name} ({pct(s / total)})" for name, s in calls[:3])
    return ran, ", ".join(name for name, _ in where)


def unexplained(ev: RunEvidence, findings: Sequence[Finding]) -> list[Finding]:
    """Time in a phase that should be small and that no finding explains, each with where it went."""
    if not ev.probe_ranks:
        return []
    step = statistics.mean(r["step_s"] for r in ev.probe_ranks)
    done = explained(findings)
    out = []
    left = {
        "other": _phase(ev, "other") - done.get("other", 0.0),
        "optimizer": _phase(ev, "optimizer") - done.get("optimizer", 0.0),
    }
    if left["other"] / step >= UNEXPLAINED_SHARE:
        out.append(_unexplained(ev, "other", left["other"], step, "between the phases: the script's own Python"))
    if left["optimizer"] / step >= OPTIMIZER_SHARE:
        out.append(_unexplained(ev, "optimizer", left["optimizer"], step, "inside optimizer.step()"))
    python = _user_python(ev)
    if python / step >= PYTHON_SHARE:
        out.append(_unexplained(ev, "forward", python, step, "in the user's own Python inside forward, not operators"))
    # A DDP rank's comm is its all-reduce's exposed tail, which exposed_communication prices: only the collectives
    # of another parallelism (FSDP's, tensor parallelism's) are read here.
    comm = _phase(ev, "comm") - done.get("comm", 0.0)
    issued = statistics.mean(r.get("inner_calls_per_step", 0.0) for r in ev.probe_ranks)
    if comm / step >= COMM_SHARE and issued > 0 and not any(r.get("ddp") for r in ev.probe_ranks):
        out.append(_collectives(ev, comm, step))
    ddp_overhead = statistics.mean(r.get("ddp_overhead_s", 0.0) for r in ev.probe_ranks)
    ddp = ddp_overhead - done.get("ddp_forward", 0.0)
    if ddp / step >= DDP_FORWARD_SHARE:
        out.append(_ddp_forward(ev, ddp, step))
    # The model's work itself, against its expected cost: DDP's own work in forward is no part of either.
    done = explained([*findings, *out])
    beyond = {"forward": done.get("forward", 0.0) + ddp_overhead, "backward": done.get("backward", 0.0)}
    excess = model_work_excess(ev, beyond)
    return out + ([excess] if excess else [])


def _ddp_forward(ev: RunEvidence, seconds: float, step: float) -> Finding:
    """DDP's forward beyond the wrapped model's: with broadcast_buffers (the default) it broadcasts every buffer
    from rank 0 before each forward, with find_unused_parameters it searches the graph after it."""
    rank = ev.probe_ranks[0]
    calls = [
        c
        for c in (rank.get("trace") or {}).get("collectives", [])
        if c["phase"] == "forward" and c["issuer"].startswith("DistributedDataParallel")
    ]
    settings = ", ".join(f"{k}={rank.get(k)}" for k in ("broadcast_buffers", "find_unused_parameters"))
    seen = "; ".join(f"{c['calls']:.0f} {c['name']} a step ({c['bytes'] / 2**20:.2f} MiB)" for c in calls)
    share = seconds / step
    return Finding(
        "unexplained_ddp_forward",
        f"{pct(share)} of every step is DistributedDataParallel's own work in forward, outside the model",
        f"step {ms(step)}; DDP's forward took {ms(seconds)} a step beyond the wrapped model's ({settings})"
        + (f"; in the profiled steps DDP issued {seen}" if seen else ""),
        "before each forward DDP broadcasts the model's buffers from rank 0 when broadcast_buffers=True (the "
        "default), and after it searches the autograd graph when find_unused_parameters=True",
        f"code change in {ev.config.get('script', 'the script')}: "
        "DistributedDataParallel(..., broadcast_buffers=False) when the buffers need no syncing every step (they "
        "are the same on every rank, or each rank's own running statistics are fine)",
        f"up to {speedup(share)} if that work were free (a bound)",
        share,
        where="DistributedDataParallel(broadcast_buffers=...)",
        share=share,
        bound=True,
        explains={"ddp_forward": seconds},
    )


def _collectives(ev: RunEvidence, seconds: float, step: float) -> Finding:
    """Collectives inside forward and backward that no check prices (FSDP2's gathers and reductions, tensor
    parallelism's): said with their count and size, since many small ones each pay the link's latency."""
    calls = statistics.mean(
        r.get("inner_calls_per_step", 0.0) - r.get("model_calls_per_step", 0.0) for r in ev.probe_ranks
    )
    moved = statistics.mean(r.get("inner_bytes_per_step", 0.0) for r in ev.probe_ranks)
    ran, _ = _places(ev, "comm")
    share = seconds / step
    return Finding(
        "unexplained_comm",
        f"{pct(share)} of every step is collectives inside forward and backward that compute does not hide",
        f"step {ms(step)}; {ms(seconds)} a step waiting on collectives in forward and backward: {calls:.0f} calls a "
        f"step of {size(moved / max(calls, 1))} on average ({ms(seconds / max(calls, 1))} each)"
        + (f"; in the profiled steps: {ran}" if ran else ""),
        "the parallelism's own collectives (FSDP's all-gathers and reduce-scatters, tensor parallelism's) are "
        "exposed: each sharded unit pays the link's latency two or three times a step, and a small per-rank batch "
        "leaves little compute to hide them behind",
        f"code change in {ev.config.get('script', 'the script')}: fewer, larger units (fully_shard each block, not "
        "each layer), reshard_after_forward=False on the units (no second all-gather in backward, at the memory of "
        "their unsharded parameters), or a larger per-rank batch",
        f"up to {speedup(share)} if they were hidden or gone (a bound on the communication; fewer units also "
        "remove their hooks' work in forward and backward, not priced here)",
        share,
        where="the parallelism's collectives in forward and backward",
        share=share,
        bound=True,
        explains={"comm": seconds},
    )


def _user_python(ev: RunEvidence) -> float:
    """Seconds per step the model's forward spent in the user's own Python functions' bytecode (not operators,
    not torch's code), scaled from the profiled steps to the measured forward."""
    from paratrain.launch.trace_summary import is_library

    for r in ev.probe_ranks:
        entry = (r.get("trace") or {}).get("phases", {}).get("forward")
        if not entry or not entry.get("s"):
            continue
        own = sum(s for name, s in entry.get("what", []) if "(" in name and not is_library(name))
        return own / entry["s"] * r["phases_s"]["forward"]
    return 0.0


def _unexplained(ev: RunEvidence, phase: str, seconds: float, step: float, what: str) -> Finding:
    ran, where = _places(ev, phase)
    share = seconds / step
    return Finding(
        f"unexplained_{phase}",
        f"{pct(share)} of every step goes {what}, and no check explains it",
        f"step {ms(step)}; {ms(seconds)} a step {what}"
        + (f"; in the profiled steps: {ran}" if ran else "; no trace was recorded (the profiler was off or failed)")
        + (f", called from {where}" if where else ""),
        "time the step spends outside the model's own work, in code the doctor has no model for",
        f"code change in {ev.config.get('script', 'the script')}: look at "
        + (where or "the loop's code between optimizer steps")
        + (f" ({ran.split(' (')[0]})" if ran else "")
        + "; remove it from the step, do it less often, or move it out of the loop",
        f"up to {speedup(share)} if that time were free (a bound)",
        share,
        where=where or None,
        share=share,
        bound=True,
        explains={phase: seconds},
    )
