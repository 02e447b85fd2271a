"""Properties (issue #58) of the probe's summary (launch/probe_summary.py) and of the profiled steps' trace
(launch/trace_summary.py), on any number of ranks and micro-steps: the five phases sum to the step; samples
per second count every micro-batch of every rank; the all-reduce's own time is the least-waiting rank's,
whatever the ranks' order; a trace's phases sum to the profiled time. Then 3 and 4 ranks accumulating, by
hand. Records are written as the formula tests write them (`step`, `write_probe`, `trace_events`)."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_formulas_causes import trace_events
from test_formulas_probe_summary import step, write_probe

from paratrain.launch.probe import PHASES
from paratrain.launch.probe_summary import own_time_s, summarise, used_steps
from paratrain.launch.trace_summary import summarise_trace

FEW = settings(max_examples=40, deadline=None)
BREAKDOWN = {  # summary.json's five phases, of the probe's
    "data_s": ("data",),
    "compute_s": ("forward", "backward", "recompute"),
    "comm_s": ("comm", "collective"),
    "optimizer_s": ("optimizer",),
    "other_s": ("other", "eval", "checkpoint"),
}


def summarised(ranks: dict[int, list[dict]]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        return summarise(write_probe(Path(d) / "run", ranks))


@st.composite
def probed_ranks(draw):
    """1-16 ranks, each with its own phase times scaled step by step, and its own number of steps; every step's
    wall time is the sum of its phases."""
    n = draw(st.integers(1, 16))
    ranks = {}
    for rank in range(n):
        phases = draw(st.fixed_dictionaries({p: st.floats(0.0, 0.05) for p in PHASES}))
        scales = draw(st.lists(st.floats(0.5, 2.0), min_size=3, max_size=20))
        ranks[rank] = [
            step(i, wall=sum(s * v for v in phases.values()), **{p: s * v for p, v in phases.items()})
            for i, s in enumerate(scales)
        ]
    return ranks


@FEW
@given(ranks=probed_ranks())
def test_the_five_phases_sum_to_the_step_on_any_number_of_ranks(ranks):
    """Each probe phase lands in exactly one of the five, and they sum to the ranks' mean step."""
    out = summarised(ranks)
    breakdown, probe = out["breakdown"], out["probe"]
    for rank in probe["ranks"]:
        assert sum(rank["phases_s"].values()) == pytest.approx(rank["step_s"])
    assert sum(breakdown.values()) == pytest.approx(probe["step_s"])
    assert probe["step_s"] == pytest.approx(statistics.mean(r["step_s"] for r in probe["ranks"]))
    for name, phases in BREAKDOWN.items():
        assert breakdown[name] == pytest.approx(sum(probe["phases_s"][p] for p in phases))


@FEW
@given(
    batches=st.lists(st.integers(1, 512), min_size=1, max_size=64),
    micro=st.integers(1, 8),
    steps=st.integers(3, 12),
    walls=st.lists(st.floats(0.01, 1.0), min_size=64, max_size=64),
)
def test_samples_per_second_count_every_micro_batch_of_every_rank(batches, micro, steps, walls):
    """Rank r feeds `micro` micro-batches of batches[r] samples a step: its samples per step are their sum, and the
    run's samples/s all ranks' steady samples over the slowest rank's steady time."""
    ranks = {
        r: [step(i, wall=walls[r], samples=micro * b, micro=micro) for i in range(steps)] for r, b in enumerate(batches)
    }
    probe = summarised(ranks)["probe"]
    for rank, b in zip(probe["ranks"], batches):
        assert (rank["samples_per_step"], rank["micro_per_step"]) == (micro * b, micro)
    steady = probe["ranks"][0]["steady_steps"]
    slowest = max(walls[: len(batches)]) * steady
    assert probe["samples_per_s"] == pytest.approx(micro * sum(batches) * steady / slowest)


@FEW
@given(
    comms=st.lists(st.lists(st.floats(0.0, 0.1), min_size=6, max_size=6), min_size=2, max_size=16),
    own=st.floats(0.0, 0.05),
    data=st.data(),
)
def test_the_all_reduce_is_the_rank_that_waited_least_whatever_the_ranks_order(comms, own, data):
    """Rank 0 reaches every all-reduce last (its comm is the all-reduce's own time); the others wait on top of
    it. The own time is rank 0's mean, in any order of the ranks, and no rank's mean is below it."""
    per_rank = [[own] * 6] + [[own + w for w in waits] for waits in comms]
    order = data.draw(st.permutations(range(len(per_rank))))
    steps = [used_steps([step(i, comm=c[i]) for i in range(6)]) for c in per_rank]
    found = own_time_s([steps[i] for i in order], "comm")
    assert found == pytest.approx(own)
    assert all(statistics.mean(s["comm"] for s in rank) >= found - 1e-12 for rank in steps)


@st.composite
def profiled_steps(draw):
    """1-4 profiled steps: forward, backward (a recompute nested inside it, or none), optimizer, then a gap in no
    phase; the script's <module> runs throughout and an operator inside each phase (times in µs)."""
    phases, calls, t = [], [], 0
    spans = dict.fromkeys(("forward", "backward", "recompute", "optimizer", "other"), 0)
    for _ in range(draw(st.integers(1, 4))):
        for name in ("forward", "backward", "optimizer"):
            length = draw(st.integers(10, 1000))
            phases.append((name, t, t + length))
            calls.append(("cpu_op", f"aten::{name}", t + draw(st.integers(0, length - 2)), t + length - 1))
            nested = draw(st.integers(1, length - 2)) if name == "backward" and draw(st.booleans()) else 0
            if nested:
                phases.append(("recompute", t + 1, t + 1 + nested))
            spans[name] += length - nested
            spans["recompute"] += nested
            t += length
        gap = draw(st.integers(0, 500))
        spans["other"] += gap
        t += gap
    calls.insert(0, ("python_function", "train.py(1): <module>", 0, t))
    return trace_events(phases, calls), spans, t


@FEW
@given(trace=profiled_steps())
def test_a_traces_phases_sum_to_the_profiled_time_each_at_its_innermost_range(trace):
    events, spans, end = trace
    summary = summarise_trace(events)
    steps = summary["steps"]
    for name, micros in spans.items():
        seconds = summary["phases"].get(name, {"s": 0.0})["s"]
        assert seconds * steps == pytest.approx(micros / 1e6, abs=1e-9), name
    assert sum(p["s"] for p in summary["phases"].values()) * steps == pytest.approx(end / 1e6)
    for p in summary["phases"].values():  # what ran: the phase's time at most (entries rounded to the µs)
        assert sum(s for _, s in p["what"]) <= p["s"] + 5e-7 * len(p["what"]) + 1e-12


# -- 3 and 4 ranks accumulating, by hand ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 4])
def test_3_and_4_ranks_accumulating_4_micro_batches_by_hand(n):
    # Each rank: 4 micro-batches of 8 samples a step (32), 10 steps of which 8 steady, 0.2 s each: the last rank
    # works 0.1 s more in `other`, the others wait for it in comm (10 ms of all-reduce + 100 ms). samples/s: n x 8
    # steps x 32 samples over 1.6 s (3 ranks: 480, 4: 640); the all-reduce's own time is the last rank's 10 ms.
    ranks = {r: [step(i, wall=0.2, samples=32, micro=4, comm=0.11) for i in range(10)] for r in range(n - 1)}
    ranks[n - 1] = [step(i, wall=0.2, samples=32, micro=4, comm=0.01, other=0.11) for i in range(10)]
    out = summarised(ranks)
    probe = out["probe"]
    assert [r["samples_per_step"] for r in probe["ranks"]] == [32] * n
    assert probe["samples_per_s"] == pytest.approx({3: 480, 4: 640}[n])
    assert probe["all_reduce_s"] == pytest.approx(0.01)
    # The five phases sum to the 0.2 s step: comm is the ranks' mean, (n - 1) x 110 ms and 10 ms, over n.
    assert out["breakdown"]["comm_s"] == pytest.approx({3: 0.23 / 3, 4: 0.085}[n])
    assert sum(out["breakdown"].values()) == pytest.approx(0.2) == probe["step_s"]
