"""The model's own work, priced: the step's forward and backward against what its layers take alone.

At its calibration step the probe times copies of the model's leaf layers, forward and backward, on inputs of
the shapes the step gave them, without the modes a script may leave on around its steps (anomaly detection,
autocast): `layers_alone_s` (launch/probe/twins.py), less the backward pass of its own each layer alone paid
(`layer_launch_s`, timed on a layer that computes nothing). That is the expected cost of the model's work on this
machine at these shapes. Forward and backward beyond it, and beyond what other findings explain there (a
float64 model, a layer's collectives, the user's Python inside forward), is time the model's work should not
take: a debugging mode left on (anomaly detection, a checkpoint's debug mode, a profiler), a dtype this machine
runs slowly (float16 on a CPU), many small operators outside the layers (a loss written as Python loops),
gradients computed for frozen parameters. What the remedy saves is not measured, so the gain is a bound: the
step with the excess gone.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from paratrain.doctor.causes import trace_top
from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, speedup
from paratrain.launch.trace_summary import PROBE_LABEL

EXCESS_SHARE = 0.15  # forward and backward beyond the layers alone, of the step...
EXCESS_RATIO = 1.75  # ...when they take at least this many times the layers alone
MIN_COVERAGE = 0.75  # of the leaf layers the step called, those timed alone: below, no expected cost is known
# Netting each layer's own backward pass out leaves at least this share of their time alone: a layer inside
# the model still launches its operators (a ReLU of 32x64 on a CPU: 37 us alone, 31 of them the launch).
NET_FLOOR = 0.1
HALF = "c10::Half"
HALF_SHARE = 0.5  # float16 operators' share of the step's operator time, on a CPU, that names the dtype


def expected_model_s(rank: Mapping) -> float | None:
    """A rank's expected forward and backward: its layers alone, each less the backward pass of its own it paid
    there (none recorded before the probe timed it), scaled from the layers timed to those called."""
    alone, timed, seen = rank.get("layers_alone_s"), rank.get("twins_timed"), rank.get("twins_seen")
    if not alone or not timed or not seen or timed / seen < MIN_COVERAGE:
        return None
    net = max(alone - timed * rank.get("layer_launch_s", 0.0), NET_FLOOR * alone)
    return net * seen / timed


def _priced(ev: RunEvidence) -> tuple[list[Mapping], float, float, float] | None:
    """The ranks with an expected cost, and their mean step, measured forward and backward, and expected."""
    ranks = [r for r in ev.probe_ranks if expected_model_s(r) is not None]
    if not ranks:
        return None
    step = statistics.mean(r["step_s"] for r in ranks)
    measured = statistics.mean(r["phases_s"].get("forward", 0.0) + r["phases_s"].get("backward", 0.0) for r in ranks)
    return ranks, step, measured, statistics.mean(expected_model_s(r) for r in ranks)


def beyond_layers_s(ev: RunEvidence) -> float:
    """Seconds a step's forward and backward take beyond the layers alone, where that is EXCESS_RATIO times the
    layers' cost or more and EXCESS_SHARE of the step (else 0): not the model's work, so no other check may read it
    as such (a small batch's fixed costs, which a larger batch would share out). Below that share it is left to
    them: at a few samples a step, the model's own per-call costs the layers alone do not pay (the loss, DDP's
    gradient hooks, one backward pass a step) are what a larger batch does share out."""
    priced = _priced(ev)
    if priced is None:
        return 0.0
    _, step, measured, expected = priced
    beyond = measured - expected
    return beyond if measured >= EXCESS_RATIO * expected and beyond >= EXCESS_SHARE * step else 0.0


def model_work_excess(ev: RunEvidence, explained: Mapping[str, float]) -> Finding | None:
    """Forward and backward beyond the layers alone and beyond what other findings explain there, when it is a
    large share of the step and a large multiple of the layers' cost."""
    priced = _priced(ev)
    if priced is None:
        return None
    ranks, step, measured, expected = priced
    excess = measured - expected - explained.get("forward", 0.0) - explained.get("backward", 0.0)
    if excess / step < EXCESS_SHARE or measured < EXCESS_RATIO * expected:
        return None
    forward = statistics.mean(r["phases_s"].get("forward", 0.0) for r in ranks)
    left = (
        max(0.0, forward - explained.get("forward", 0.0)),
        max(0.0, measured - forward - explained.get("backward", 0.0)),
    )
    cause, remedy, where = _signature(ev, ranks)
    ran = _ran(ev)
    share = excess / step
    return Finding(
        "model_work_excess",
        f"forward and backward take {measured / expected:.1f}x what the model's layers take alone: "
        f"{pct(share)} of every step is beyond the model's own work",
        f"step {ms(step)}: forward and backward {ms(measured)}; the same layers alone, at the step's shapes, "
        f"{ms(expected)} (timed in each rank, {ranks[0]['twins_timed']} of {ranks[0]['twins_seen']} layers, "
        f"each less the backward pass of its own it paid alone)"
        + (f"; in the profiled steps forward and backward ran {ran}" if ran else ""),
        cause,
        f"code change in {ev.config.get('script', 'the script')}: {remedy}",
        f"up to {speedup(share)} if forward and backward took what the layers take alone (a bound)",
        share,
        where=where,
        share=share,
        bound=True,
        # in forward's and backward's shares of what other findings left unexplained in them: neither phase is
        # explained beyond what it measured
        explains={"forward": excess * left[0] / sum(left), "backward": excess * left[1] / sum(left)},
    )


def _signature(ev: RunEvidence, ranks: list[Mapping]) -> tuple[str, str, str]:
    """The cause, remedy and place the probe's facts point at: anomaly mode, a checkpoint's debug mode, float16 on
    a CPU, or the code the profiled steps ran in."""
    if any(r.get("anomaly_mode") for r in ranks):
        return (
            "autograd's anomaly detection is on: every operator records its stack, and backward checks every "
            "result for NaN",
            "turn it off once debugging is done: torch.autograd.set_detect_anomaly(False) (Lightning: "
            "Trainer(detect_anomaly=False))",
            "torch.autograd.set_detect_anomaly(True)",
        )
    if any(r.get("checkpoint_debug") for r in ranks):
        return (
            "torch.utils.checkpoint runs with debug=True: every operator of the checkpointed blocks records its "
            "stack, in forward and again in the recompute",
            "drop debug=True from torch.utils.checkpoint.checkpoint(...) once the recompute is debugged",
            "torch.utils.checkpoint.checkpoint(..., debug=True)",
        )
    dtypes = next((r["trace"].get("dtypes_s") for r in ranks if (r.get("trace") or {}).get("dtypes_s")), {})
    if ev.on_cpu and dtypes and dtypes.get(HALF, 0.0) >= HALF_SHARE * sum(dtypes.values()):
        return (
            "the model runs in float16 on a CPU, which has no fast float16 kernels: each operator converts or "
            "runs a slow path",
            "on CPUs autocast to bfloat16, torch.autocast('cpu', dtype=torch.bfloat16), with no GradScaler (or "
            "keep float32)",
            "float16 operators (autocast or .half())",
        )
    where = [name for name, _ in trace_top(ev, "backward", "where") + trace_top(ev, "forward", "where")]
    place = ", ".join(dict.fromkeys(n for n in where if n != PROBE_LABEL)) or "the model's forward"
    return (
        "forward and backward do more than the model's layers: a debugging mode left on (anomaly detection, "
        "checkpoint(debug=True), a profiler), many small operators outside the layers (a loss written as Python "
        "loops), or a dtype this machine runs slowly",
        f"look at {place}: vectorise work done in Python loops, turn debugging modes off",
        place,
    )


def _ran(ev: RunEvidence) -> str:
    """The profiled steps' largest operators and calls in forward and backward, with their seconds a step."""
    entries = trace_top(ev, "backward", "what")[:3] + trace_top(ev, "forward", "what")[:3]
    return ", ".join(f"{name} ({ms(s)})" for name, s in entries if name != PROBE_LABEL)
