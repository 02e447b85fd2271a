"""The doctor's checks across a probed script's ranks (doctor/rank_checks.py), by hand: ranks that never
synchronised, a straggler or slow rank and where it spends its extra time, and uneven step counts with the
wait they leave. Probe blocks written here (test_formulas_doctor.py's `probed_run`; no run is launched), each
expected text and number worked out from the check's stated model (issue #58's mutation run: each case pins
behaviour a surviving mutant changed unseen). Fast: scripts/mutate.py runs it for every mutant of the module."""

from __future__ import annotations

import pytest
from test_formulas_doctor import probed, probed_run

from paratrain.doctor import rank_checks as rc
from paratrain.doctor.evidence import read_run
from paratrain.launch.probe_summary import synchronised

# -- ranks that never synchronised --------------------------------------------------------------------------------

COPY = {"phases_s": {"forward": 0.05, "backward": 0.1}, "ddp": False, "collectives_after_first_step": 0}


def unsynced(tmp_path, name, ranks):
    """unsynchronised() of a probe whose `synchronised` is what launch/probe_summary.py derives from these ranks
    (ddp, the collectives after the first step; 100 steps each unless given)."""
    verdict = synchronised([{"steps": 100, **r} for r in ranks])
    return rc.unsynchronised(read_run(probed_run(tmp_path / name, ranks, probe={"synchronised": verdict})))


def test_unsynchronised_ranks_with_no_process_group_and_every_rank_reading_the_whole_dataset(tmp_path):
    # Two plain copies of a script: no DDP, no collective after the first step, no process group. Rank 0 recorded
    # no DataLoader, rank 1 its training loader first (then a validation one): the first loader found is named,
    # with no DistributedSampler (sampler_replicas unknown: one replica).
    train = {"dataset": "TensorDataset", "length": 512, "sampler": "RandomSampler", "sampler_replicas": None}
    val = {"dataset": "ValidationSet", "length": 64, "sampler": "SequentialSampler", "sampler_replicas": None}
    found = unsynced(
        tmp_path,
        "a",
        [
            {**COPY, "process_group": 0, "frameworks": [], "loaders": []},
            {**COPY, "steps": 98, "process_group": None, "loaders": [train, val]},
        ],
    )
    assert found.check == "unsynchronised" and found.severity == "high" and found.saving is None
    assert found.finding == "the 2 ranks never synchronised: they trained 2 independent copies of the model"
    assert found.evidence == (
        "2 ranks, 100, 98 optimizer steps; no DDP or FSDP model and no collective in any step after the first "
        "(the probe counts every torch.distributed call); no rank joined a process group "
        "(torch.distributed.init_process_group was never called); every rank read the whole TensorDataset "
        "(512 samples, sampler RandomSampler)"
    )
    assert found.remedy == (
        "code change in train.py: torch.distributed.init_process_group() and DistributedDataParallel(model) (or "
        "FSDP), with a DistributedSampler for the data; Lightning: Trainer(strategy='ddp', "
        "devices=int(os.environ['WORLD_SIZE']))"
    )
    assert found.where == "the model, never wrapped in DDP or FSDP"
    assert found.predicted_gain.startswith("none in speed: until the ranks synchronise, 2 ranks are no speedup")
    # ranks fed by no DataLoader (tensors built in the loop): nothing said of the data
    found = unsynced(tmp_path, "b", [COPY, COPY])
    assert found.evidence.endswith(
        "no rank joined a process group (torch.distributed.init_process_group was never called)"
    )


def test_unsynchronised_accelerate_ranks_in_a_process_group_they_never_used(tmp_path):
    # Three ranks under Accelerate without cpu=True: they joined the launcher's group of 3 and called nothing on
    # it. The frameworks are every rank's, once each and sorted; a dataset of unknown length is '?'.
    loader = {"dataset": "TokenSet", "length": None, "sampler": "SequentialSampler", "sampler_replicas": 1}
    ranks = [
        {**COPY, "process_group": 3, "frameworks": ["transformers", "accelerate"], "loaders": [loader]},
        {**COPY, "process_group": 3, "frameworks": ["accelerate"]},
        {**COPY, "process_group": 3},
    ]
    found = unsynced(tmp_path, "a", ranks)
    assert found.finding == "the 3 ranks never synchronised: they trained 3 independent copies of the model"
    assert found.evidence.endswith(
        "; the ranks joined a process group of 3 but used it for nothing in their steps; every rank read the whole "
        "TokenSet (? samples, sampler SequentialSampler); frameworks imported: accelerate, transformers"
    )
    assert found.remedy.startswith("code change in train.py: Accelerator(cpu=True) on CPU ranks: a plain Accelerator()")
    assert found.where == "Accelerator() (without cpu=True)"
    # a DistributedSampler (2 replicas) shards the data: the ranks did not each read all of it; no framework named
    sharded = {**loader, "sampler": "DistributedSampler", "sampler_replicas": 2}
    found = unsynced(tmp_path, "b", [{**COPY, "process_group": 2, "loaders": [sharded]}, {**COPY, "process_group": 2}])
    assert found.evidence.endswith("; the ranks joined a process group of 2 but used it for nothing in their steps")
    assert found.where == "the model, never wrapped in DDP or FSDP"


def test_ranks_that_synchronised_or_a_probe_that_could_not_tell_are_not_unsynchronised(tmp_path):
    # DDP on one rank, or one collective after the first step (a hand-written all_reduce): they train one model
    assert unsynced(tmp_path, "a", [COPY, {**COPY, "ddp": True}]) is None
    assert unsynced(tmp_path, "b", [COPY, {**COPY, "collectives_after_first_step": 1}]) is None
    # a probe that did not count collectives, and a single rank: synchronised is None, nothing said
    uncounted = {"phases_s": {"forward": 0.05}, "ddp": False}
    assert unsynced(tmp_path, "c", [uncounted, uncounted]) is None
    assert unsynced(tmp_path, "d", [COPY]) is None


# -- the straggler: where its extra time goes ----------------------------------------------------------------------

# Rank 1 spends 300 ms a step in data where ranks 0 and 2 spend 100: busy 400 ms against 200 (2x), its extra work
# all outside forward and backward, so a straggler (not a slower core).
EVEN = {"phases_s": {"data": 0.1, "forward": 0.1, "comm": 0.2}}
DATA_HEAVY = {"phases_s": {"data": 0.3, "forward": 0.1}}


def test_the_straggler_explains_its_extra_work_per_phase_as_a_share_of_the_ranks_mean(tmp_path):
    found = rc.straggler(probed(tmp_path, "a", [EVEN, DATA_HEAVY, EVEN]))
    assert found.check == "straggler" and found.finding.startswith("rank 1 is a straggler: the others wait 200 ms")
    # its extra data time over the others' median, 300 - 100 ms, is a third of the 3 ranks' mean data phase;
    # forward is no slower, and nothing else is extra
    assert found.explains == pytest.approx(
        {"data": 0.2 / 3, "forward": 0.0, "backward": 0.0, "optimizer": 0.0, "other": 0.0}
    )
    # equal work: each phase as the fastest rank ran it (100 + 100 ms), no all-reduce of its own (rank 1's 0)
    assert found.saving == pytest.approx(1 - 0.2 / 0.4)
    # without a profiled trace, where names the rank and the phase alone
    assert found.where == "rank 1's data"


def test_the_straggler_is_placed_at_the_user_code_its_trace_spent_the_extra_phase_in(tmp_path):
    def where(name, trace):
        return rc.straggler(probed(tmp_path, name, [EVEN, {**DATA_HEAVY, "trace": trace}, EVEN])).where

    # the line of the script that spent most of the data phase, before what it called
    data = {"where": [["train.py:31 (augment)", 0.18], ["train.py:40 (collate)", 0.02]], "what": [["torch.flip", 0.2]]}
    assert where("a", {"phases": {"data": data}}) == "rank 1's data, in train.py:31 (augment)"
    # no line of the user's code recorded: what ran
    assert where("b", {"phases": {"data": {"what": [["torch.flip", 0.2]]}}}) == "rank 1's data, in torch.flip"
    # a trace of other phases only says nothing of data
    assert where("c", {"phases": {"forward": data}}) == "rank 1's data"


def test_a_slow_rank_is_placed_on_its_core_and_explains_its_slower_compute(tmp_path):
    # forward 50 ms against 40 and backward 100 against 80: the same work 1.25x slower on rank 1
    fast = {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}}
    slow = {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}}
    found = rc.straggler(probed(tmp_path, "a", [fast, slow]))
    assert found.check == "slow_rank" and found.where == "rank 1's core or device"
    # its extra 10 and 20 ms, halved over the 2 ranks' mean phases
    assert found.explains == pytest.approx(
        {"data": 0.0, "forward": 0.005, "backward": 0.01, "optimizer": 0.0, "other": 0.0}
    )


def test_a_straggler_on_costlier_samples_in_the_others_code_is_priced_at_the_ranks_mean(tmp_path):
    """Rank 1's 300 ms of data against the others' 100, all three ranks' profiled data phase spent in the same
    `__getitem__`: costlier samples, which even shards deal out, so its data is priced at the 3 ranks' mean (167 ms),
    not the fastest rank's. Its own code there (a place the others lack) is work to remove: the fastest rank's."""
    from paratrain.launch.trace_summary import PROBE_LABEL

    def traced(phases, *places):
        where = {"where": [[p, 0.1] for p in places]}
        return {**phases, "trace": {"phases": {phase: where for phase in ("data", "forward", "backward")}}}

    def found(name, *slow_places, slow=DATA_HEAVY, even=EVEN):
        even = traced(even, "train.py:31 (__getitem__)")
        return rc.straggler(probed(tmp_path, name, [even, traced(slow, *slow_places), even]))

    same = found("a", "train.py:31 (__getitem__)", "train.py:40 (collate)")
    assert same.check == "straggler" and same.saving == pytest.approx(1 - (0.5 / 3 + 0.1) / 0.4)
    assert "data at the ranks' mean: rank 1 ran the others' code there longer (train.py:31 (__getitem__))" in (
        same.predicted_gain
    )
    # the probe's own hooks are no place of the user's code: the first place after them is compared
    assert found("b", PROBE_LABEL, "train.py:31 (__getitem__)").saving == same.saving
    # rank 1's own code on top: work only it does, removed -> each phase at the fastest rank's
    own = found("c", "train.py:55 (log_sample)", "train.py:31 (__getitem__)")
    assert own.saving == pytest.approx(1 - 0.2 / 0.4) and "mean" not in own.predicted_gain
    # more samples a step on rank 1: not the others' samples, however alike the code
    more = found("d", "train.py:31 (__getitem__)", slow={**DATA_HEAVY, "samples_per_step": 64.0})
    assert more.saving == pytest.approx(0.5)
    # a slower core (forward and backward 1.25x, the same code on top) is left out, not evened: the fastest rank's
    fast = {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}}
    slower = {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}}
    core = rc.straggler(
        probed(tmp_path, "e", [traced(fast, "train.py:31 (__getitem__)"), traced(slower, "train.py:31 (__getitem__)")])
    )
    assert core.check == "slow_rank" and core.saving == pytest.approx(1 - 0.125 / 0.155)


# -- uneven step counts ----------------------------------------------------------------------------------------------


def test_uneven_steps_charge_the_early_ranks_loop_time_above_the_busiest_ranks_to_waiting(tmp_path):
    # 80, 120 and 100 steps: rank 1 has the most, with 50 ms a step of the loop's own time; ranks 0 and 2 spend
    # 250 and 150 ms there, 200 and 100 ms of waiting: their mean over the 3 ranks is 100 ms
    ranks = [
        {"phases_s": {"forward": 0.1, "other": 0.25}, "steps": 80},
        {"phases_s": {"forward": 0.1, "other": 0.05}, "steps": 120},
        {"phases_s": {"forward": 0.1, "other": 0.15}, "steps": 100},
    ]
    found = rc.uneven_steps(probed(tmp_path, "a", ranks))
    assert found.finding == "the ranks took different numbers of steps (80, 120, 100)"
    assert found.evidence == "optimizer steps per rank: rank 0 80, rank 1 120, rank 2 100"
    assert found.explains == pytest.approx({"other": 0.1})
    assert found.where == "the data's split across ranks (the training loader's sampler)"
    # the run lasts the 120 steps of the longest rank; an even split gives each the mean, 100
    assert found.saving == pytest.approx(1 - 100 / 120)
    assert found.predicted_gain.endswith(": every rank takes the mean number of steps, 100")
    # the rank with the most steps waiting longest in its loop leaves the others no wait to explain
    for r in ranks:
        r["phases_s"]["other"] = 0.3 if r["steps"] == 120 else 0.05
    assert rc.uneven_steps(probed(tmp_path, "b", ranks)).explains == {"other": 0.0}
