"""Properties (issue #58) of the doctor's rules that compare ranks, over 2 to 64 ranks: a straggler is named only
when the others wait for it, against the others (not a fixed rank, not all ranks with itself), whatever the
ranks' order and ids; the lone evaluator, the checkpointing rank and uneven shards likewise. Then the same
rules at 3 and 4 ranks by hand. Records are built as the formula tests build them (`probed_run`, `built_run`)
and read as the doctor reads them; no run is launched."""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_formulas_doctor import probed_run
from test_formulas_doctor_runs import built_run

from paratrain.doctor import checks
from paratrain.doctor import rank_checks as rc
from paratrain.doctor import script_checks as sc
from paratrain.doctor.evidence import IDLE_CPU_PERCENT, RunEvidence, read_run

FEW = settings(max_examples=60, deadline=None)
OWN = ("data", "forward", "backward", "optimizer", "other")  # a rank's own work (rank_checks.straggler)


def probed(ranks: list[dict[str, Any]], probe: dict[str, Any] | None = None) -> RunEvidence:
    """The doctor's evidence of a launched script whose probe block holds `ranks` (probed_run's defaults)."""
    with tempfile.TemporaryDirectory() as d:
        return read_run(probed_run(Path(d) / "run", ranks, probe=probe))


def monitored(per_instant: list[list[float]]) -> RunEvidence:
    """A built-in run on len(per_instant[0]) ranks whose monitor read each rank's CPU % at one instant a
    second (test_formulas_doctor_runs._system spaces ranks 20 ms apart, which 64 ranks would spread over
    several of the doctor's tenth-of-a-second instants)."""
    system = [
        {"time": 100.0 + t, "kind": "rank", "rank": rank, "cpu_percent": cpu, "num_threads": 1}
        for t, cpus in enumerate(per_instant)
        for rank, cpu in enumerate(cpus)
    ]
    with tempfile.TemporaryDirectory() as d:
        return built_run(Path(d) / "run", {"workers": len(per_instant[0])}, system=system)


def named_rank(text: str) -> int:
    return int(re.search(r"rank (\d+)", text).group(1))


# -- a straggler in the probe's phases (rank_checks.straggler) -----------------------------------------------


@st.composite
def waiting_ranks(draw, distinct: bool = False):
    """Ranks whose own work differs and who wait for the slowest at the all-reduce: each rank's comm is its wait
    (the slowest rank's own work less its own) plus the all-reduce's own time, so every step is equally long.
    Own work is split between forward and backward in a proportion of each rank's own."""
    n = draw(st.integers(2, 64))
    # Within 1.6x of each other: the slowest rank's ratio to the others' median falls on both sides of 1.2.
    base = draw(st.floats(0.005, 0.1))
    busy = [base * f for f in draw(st.lists(st.floats(1.0, 1.6), min_size=n, max_size=n, unique=distinct))]
    split = draw(st.lists(st.floats(0.1, 0.9), min_size=n, max_size=n))
    data = draw(st.floats(0.0, 0.01))
    all_reduce = draw(st.floats(0.0, 0.02))
    top = max(busy)
    ranks = [
        {
            "phases_s": {"data": data, "forward": b * f, "backward": b * (1 - f), "comm": top - b + all_reduce},
            "samples_per_step": 32.0,
        }
        for b, f in zip(busy, split)
    ]
    return ranks, all_reduce


def own_work(rank: dict[str, Any]) -> float:
    return sum(rank["phases_s"].get(p, 0.0) for p in OWN)


@FEW
@given(world=waiting_ranks())
def test_a_straggler_is_named_exactly_when_the_others_wait_for_it(world):
    """Named (as a straggler or a slow rank) if and only if the others' median wait at the all-reduce is a tenth
    of the step and the rank's own work 1.2x theirs; the rank named is the one that waited least; its saving is
    the step each phase as fast as the fastest rank ran it, plus the all-reduce's own time."""
    ranks, all_reduce = world
    busy = [own_work(r) for r in ranks]
    slow = busy.index(max(busy))
    others = [i for i in range(len(ranks)) if i != slow]
    waits = [ranks[i]["phases_s"]["comm"] - all_reduce for i in others]
    step = statistics.mean(own_work(r) + r["phases_s"]["comm"] for r in ranks)
    median_busy = statistics.median(busy[i] for i in others)
    wait_share, ratio = statistics.median(waits) / step, busy[slow] / median_busy
    assume(abs(wait_share - rc.STRAGGLER_EXCESS) > 1e-9 and abs(ratio - rc.STRAGGLER_RATIO) > 1e-9)
    found = rc.straggler(probed(ranks, {"all_reduce_s": all_reduce}))
    waited_for = wait_share >= rc.STRAGGLER_EXCESS and ratio >= rc.STRAGGLER_RATIO
    assert (found is not None) == waited_for, (wait_share, ratio)
    if found:
        assert found.check in ("straggler", "slow_rank") and named_rank(found.finding) == slow
        fastest = sum(min(r["phases_s"].get(p, 0.0) for r in ranks) for p in OWN)
        assert found.saving == pytest.approx(1 - (fastest + all_reduce) / step)
        assert 0 < found.saving < 1


@FEW
@given(world=waiting_ranks(distinct=True), data=st.data())
def test_the_straggler_found_follows_its_record_under_any_order_and_ids_of_the_ranks(world, data):
    """Reordering the ranks' records and renumbering them names the same record, with the same saving."""
    ranks, all_reduce = world
    n = len(ranks)
    order = data.draw(st.permutations(range(n)))
    assume(len({own_work(r) for r in ranks}) == n)  # no tie for the slowest (unequal factors can round equal)
    offset = data.draw(st.integers(0, 99))
    ids = [offset + i for i in data.draw(st.permutations(range(n)))]
    before = rc.straggler(probed([{**r, "rank": ids[i]} for i, r in enumerate(ranks)], {"all_reduce_s": all_reduce}))
    after = rc.straggler(probed([{**ranks[i], "rank": ids[i]} for i in order], {"all_reduce_s": all_reduce}))
    assert (before is None) == (after is None)
    if before:
        assert (after.check, named_rank(after.finding)) == (before.check, named_rank(before.finding))
        assert after.saving == pytest.approx(before.saving)


@FEW
@given(n=st.integers(2, 64), own=st.floats(0.01, 0.2), all_reduce=st.floats(0.0, 0.02))
def test_ranks_that_wait_for_no_one_have_no_straggler(n, own, all_reduce):
    ranks = [{"phases_s": {"forward": own, "comm": all_reduce}}] * n
    assert rc.straggler(probed(ranks, {"all_reduce_s": all_reduce})) is None


# -- the monitor's straggler and rank 0 alone (checks.py) ----------------------------------------------------


@st.composite
def monitor_straggler(draw):
    """T instants of n busy ranks, each at its own 90-110 % CPU (no rank leads the others' median by 1.3x), in
    `lead` of which rank k runs at `factor` x 110 % or more."""
    n = draw(st.integers(2, 64))
    instants = draw(st.integers(4, 30))
    k = draw(st.integers(0, n - 1))
    lead = draw(st.sets(st.integers(0, instants - 1), max_size=instants))
    factor = draw(st.floats(1.31, 3.0))
    cpu = draw(st.lists(st.floats(90, 110), min_size=n, max_size=n))
    base = [list(cpu) for _ in range(instants)]
    for t in lead:
        base[t][k] = factor * 110 * draw(st.floats(1.0, 1.2))
    return base, k, sorted(lead)


@settings(max_examples=40, deadline=None)
@given(world=monitor_straggler())
def test_the_monitors_straggler_leads_the_median_of_the_others_often_enough_on_any_rank(world):
    """Any rank k that burns 1.3x the others' median CPU in at least 3 instants and 15 % of them is named, with
    the saving share x (1 - the others' CPU against its own); a rank leading less often is not."""
    cpus, k, lead = world
    found = checks.straggler(monitored(cpus))
    share = len(lead) / len(cpus)
    if len(lead) >= checks.STRAGGLER_MIN_SAMPLES and share >= checks.STRAGGLER_SHARE:
        assert named_rank(found.finding) == k
        ratios = [statistics.median(v for r, v in enumerate(cpus[t]) if r != k) / cpus[t][k] for t in lead]
        assert found.saving == pytest.approx(share * (1 - statistics.mean(ratios)))
    else:
        assert found is None


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 64),
    alone=st.integers(0, 12),
    together=st.integers(0, 12),
    idle=st.integers(0, 12),
    lone=st.integers(0, 63),
    data=st.data(),
)
def test_rank0_alone_saves_its_share_split_over_every_rank_and_is_about_rank_0_only(
    n, alone, together, idle, lone, data
):
    """Rank 0 busy while every other rank idles, in a share of the instants: the saving is that share x (1 - 1/n)
    for any n, in any order of the instants. The rule is about rank 0 (work under `if rank == 0:`): another rank
    working alone is not it."""
    busy, quiet = 100.0, IDLE_CPU_PERCENT / 2
    lone %= n
    states = [[busy if r == lone else quiet for r in range(n)]] * alone + [[busy] * n] * together + [[quiet] * n] * idle
    assume(len(states) >= 4)
    states = data.draw(st.permutations(states))
    found = checks.rank0_alone(monitored(states))
    share, both = alone / len(states), together / len(states)
    if lone == 0 and share >= checks.ALONE_SHARE and both >= checks.ALONE_SHARE:
        assert found.saving == pytest.approx(share * (1 - 1 / n))
    else:
        assert found is None


# -- one rank evaluating, checkpointing, or running more steps (script_checks, rank_checks) -------------------


@FEW
@given(
    n=st.integers(2, 64),
    who=st.integers(0, 63),
    evaluation=st.floats(0.03, 0.2),
    forward=st.lists(st.floats(0.01, 0.1), min_size=64, max_size=64),
)
def test_the_rank_that_evaluates_alone_is_named_and_its_evaluation_split_over_every_rank(n, who, evaluation, forward):
    who %= n
    ranks = [
        {"phases_s": {"forward": forward[i], "eval" if i == who else "comm": evaluation}, "rank": 10 + i}
        for i in range(n)
    ]
    step = statistics.mean(forward[i] + evaluation for i in range(n))
    assume(evaluation / step >= sc.EVAL_SHARE)
    found = sc.evaluation(probed(ranks))
    assert found.check == "rank0_alone" and named_rank(found.finding) == 10 + who
    assert found.saving == pytest.approx(evaluation * (1 - 1 / n) / step)


@FEW
@given(
    n=st.integers(2, 64),
    who=st.integers(0, 63),
    save=st.floats(0.015, 0.1),
    every=st.integers(1, 40),
    forward=st.floats(0.02, 0.1),
)
def test_the_rank_that_checkpoints_is_the_one_the_others_wait_for(n, who, save, every, forward):
    """Whichever rank saves, its checkpoints set the pace: the saving is its checkpoint time per step less what
    saves every 10x (or 100) steps keep."""
    who %= n
    ranks = [
        {
            "phases_s": {"forward": forward, "checkpoint" if i == who else "comm": save},
            "checkpoint_steps": 90 // every if i == who else 0,
        }
        for i in range(n)
    ]
    found = sc.checkpoints(probed(ranks))
    assert named_rank(found.finding) == who
    spacing = 90 / (90 // every)
    assert found.saving == pytest.approx(
        save * (1 - spacing / max(sc.CHECKPOINT_EVERY, 10 * spacing)) / (forward + save)
    )


@FEW
@given(steps=st.lists(st.integers(10, 200), min_size=2, max_size=64), data=st.data())
def test_uneven_steps_save_the_steps_above_the_mean_whatever_the_ranks_order(steps, data):
    mean = statistics.mean(steps)
    assume(abs(max(steps) / mean - rc.UNEVEN_STEPS) > 1e-9)
    order = data.draw(st.permutations(steps))
    for arrangement in (steps, order):
        ranks = [{"phases_s": {"forward": 0.05, "other": 0.01}, "steps": s} for s in arrangement]
        found = rc.uneven_steps(probed(ranks))
        if max(steps) >= rc.UNEVEN_STEPS * mean:
            assert found.saving == pytest.approx(1 - mean / max(steps))
        else:
            assert found is None


# -- the same rules at 3 and 4 ranks, by hand --------------------------------------------------------------


@pytest.mark.parametrize(
    "busy, expected",
    [
        # 3 ranks: rank 2 works 90 ms, the others 50 and 70 (median 60 ms, 1.5x): they wait 40 and 20 ms, the median
        # 30 ms of a 95 ms step (5 ms all-reduce). Each phase as fast as the fastest rank: 50 + 5 of 95.
        ([0.05, 0.07, 0.09], (2, 1 - 0.055 / 0.095)),
        # against all three ranks' median (70 ms) it would be 1.29x and 20 ms: still named, so the case below
        # pins the others: rank 0 at 90 against 80 and 40 (median 60, 1.5x); all three's median 80 is 1.125x.
        ([0.09, 0.08, 0.04], (0, 1 - 0.045 / 0.095)),
        # 4 ranks: rank 1 at 100 ms against 40, 50, 90 (median 50, 2x; waits 60, 50, 10: median 50 ms of 105).
        ([0.04, 0.10, 0.05, 0.09], (1, 1 - 0.045 / 0.105)),
        # 4 ranks: rank 3 at 100 ms against 95, 96, 40 (median 95 ms: 1.05x, 5 ms): no one waits long for it,
        # though rank 2 waits 60 ms (a fixed comparison against rank 2 would name rank 3).
        ([0.095, 0.096, 0.04, 0.10], None),
    ],
)
def test_a_straggler_among_3_and_4_ranks_by_hand(busy, expected):
    ranks = [
        {"phases_s": {"forward": b, "comm": max(busy) - b + 0.005}, "samples_per_step": 32.0 + i}
        for i, b in enumerate(busy)
    ]
    found = rc.straggler(probed(ranks, {"all_reduce_s": 0.005}))
    if expected is None:
        assert found is None
    else:
        assert (named_rank(found.finding), found.saving) == (expected[0], pytest.approx(expected[1]))


@pytest.mark.parametrize(
    "cpus, expected",
    [
        # 3 ranks, 10 instants: rank 1 at 150 % against 100 and 80 (median 90: 1.67x) in 4: share 0.4, the others
        # at 90/150 of its CPU: saving 0.4 x 0.4 = 0.16. Against the median of all three (100) it is 1.5x.
        ([(100, 150, 80)] * 4 + [(100, 100, 100)] * 6, (1, 0.16)),
        # 4 ranks: rank 3 at 130 % against 100, 120, 60 (median 100: 1.3x) in 5 of 10: saving 0.5 x 0.3/1.3.
        # Against all four's median (110) it would be 1.18x: not named.
        ([(100, 120, 60, 130)] * 5 + [(100, 100, 100, 100)] * 5, (3, 0.5 * 0.3 / 1.3)),
        # 4 ranks: rank 0 leads rank 3 by 2x (200 against 100) but the others' median is 180: 1.11x, no straggler.
        ([(200, 180, 190, 100)] * 5 + [(100, 100, 100, 100)] * 5, None),
    ],
)
def test_the_monitors_straggler_among_3_and_4_ranks_by_hand(cpus, expected):
    found = checks.straggler(monitored([list(c) for c in cpus]))
    if expected is None:
        assert found is None
    else:
        assert (named_rank(found.finding), found.saving) == (expected[0], pytest.approx(expected[1]))


@pytest.mark.parametrize("n", [3, 4])
def test_a_lone_evaluator_and_uneven_steps_among_3_and_4_ranks_by_hand(n):
    # The last rank evaluates 40 ms a step alone, the others wait for it in comm: a 100 ms step. Sharded over n
    # ranks each evaluates 40/n ms: (n - 1)/n of 40 ms goes (3 ranks: 26.7 ms; 4: 30 ms).
    ranks = [{"phases_s": {"forward": 0.06, "comm": 0.04}}] * (n - 1) + [{"phases_s": {"forward": 0.06, "eval": 0.04}}]
    found = sc.evaluation(probed(ranks))
    assert found.finding.startswith(f"rank {n - 1} evaluates alone") and f"the other {n - 1} rank(s)" in found.finding
    assert found.saving == pytest.approx({3: 0.04 * 2 / 3, 4: 0.03}[n] / 0.1)
    # Steps 100, 100, 130 (mean 110: 1.18x): each taking the mean saves 20/130; with a fourth rank at 100 the mean
    # is 107.5 (1.21x): 22.5/130.
    steps = [100, 130, 100, 100][:n]
    found = rc.uneven_steps(probed([{"phases_s": {"forward": 0.05}, "steps": s} for s in steps]))
    assert found.saving == pytest.approx({3: 20 / 130, 4: 22.5 / 130}[n])
