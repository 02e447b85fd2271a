"""The doctor's checks that compare a probed script's ranks (summary.json `probe`, per rank): ranks that never
synchronised, a straggler, whose extra work the others wait for, a slow rank running the same work slower, and
ranks taking different numbers of steps. Split from script_checks.py, whose helpers they share."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import SEVERITY_MEDIUM, Finding
from paratrain.doctor.script_checks import _code_change, _mean, _step, _steps_text
from paratrain.formatting import ms, speedup
from paratrain.launch.trace_summary import PROBE_LABEL

STRAGGLER_EXCESS = 0.10  # one rank's extra busy time, of the step, that the others wait for...
STRAGGLER_RATIO = 1.2  # ...and this much busier than the median of the others
UNEVEN_STEPS = 1.10  # the rank with the most steps against the mean
# A straggler whose excess is this share in forward and backward, both slower by factors within this
# spread of each other, runs the same work on a slower core or device (slow_rank), not more work.
SLOW_CORE_COMPUTE_SHARE = 2 / 3
SLOW_CORE_SPREAD = 1.25
# ...or its excess in the phases holding this share of the others' own work or more, all slower by factors within that
# spread: a core that runs everything slower slows the loop's Python and the data too, while work added
# on one rank lands in some phases and leaves the others as they are. (A CI run of the small-batch fault met it: rank
# 1 ran data, forward, backward and its Python 1.25-1.42x slower, and was named a straggler with "give every rank the
# same work" above the script's own cause.)
SLOW_CORE_PHASE_SHARE = 0.10
# A slow rank whose own cores other work took a share s of runs up to 1 / (1 - s) times slower from that alone: when
# its factor f has 1 - 1/f at most s plus this, the contention caveat, which names that rank's share, explains it.
CONTENTION_EXPLAINS_SLACK = 0.10
# The phases whose work grows with what each sample costs: a straggler's excess there, in the code the others run,
# is costlier samples (an uneven split), priced at the ranks' mean.
PER_SAMPLE_PHASES = ("data", "forward", "backward")


def unsynchronised(ev: RunEvidence) -> Finding | None:
    """Ranks that never synchronised (launch/probe_summary.py synchronised): no DDP, and no collective in any step
    after the first. Each rank trained its own copy of the model, so the run's samples/s is N trainings' added up,
    not one training N times as fast. Named before anything else: every other finding about the ranks assumes
    they train one model."""
    ranks = ev.probe.get("ranks", [])
    if ev.probe.get("synchronised") is not False:
        return None
    n = len(ranks)
    frameworks = sorted({name for r in ranks for name in r.get("frameworks") or []})
    group = max(r.get("process_group") or 0 for r in ranks)
    joined = (
        f"the ranks joined a process group of {group} but used it for nothing in their steps"
        if group > 1
        else "no rank joined a process group (torch.distributed.init_process_group was never called)"
    )
    loader = next((loaders[0] for loaders in (r.get("loaders") for r in ranks) if loaders), None)
    whole = (
        f"; every rank read the whole {loader['dataset']} ({loader.get('length') or '?'} samples, sampler "
        f"{loader.get('sampler')})"
        if loader and (loader.get("sampler_replicas") or 1) == 1
        else ""
    )
    if "accelerate" in frameworks:
        remedy = (
            "Accelerator(cpu=True) on CPU ranks: a plain Accelerator() there joins the launcher's process group but "
            "runs each rank as a single process (no DDP, no sharded DataLoader); on GPUs Accelerate distributes by "
            "itself"
        )
        where = "Accelerator() (without cpu=True)"
    else:
        remedy = (
            "torch.distributed.init_process_group() and DistributedDataParallel(model) (or FSDP), with a "
            "DistributedSampler for the data; Lightning: Trainer(strategy='ddp', devices=int(os.environ['WORLD_SIZE']))"
        )
        where = "the model, never wrapped in DDP or FSDP"
    return Finding(
        "unsynchronised",
        f"the {n} ranks never synchronised: they trained {n} independent copies of the model",
        f"{n} ranks, {', '.join(str(r.get('steps', 0)) for r in ranks)} optimizer steps; no DDP or FSDP model and no "
        f"collective in any step after the first (the probe counts every torch.distributed call); {joined}{whole}"
        + (f"; frameworks imported: {', '.join(frameworks)}" if frameworks else ""),
        "nothing averages the ranks' gradients, so each rank trains a model of its own on its own batches: the run's "
        f"samples/s is {n} separate trainings added up, and no one model trains faster",
        _code_change(remedy, ev),
        f"none in speed: until the ranks synchronise, {n} ranks are no speedup whatever their samples/s (paratrain "
        "scale refuses to call their ratio one); the findings below time each copy's steps",
        None,
        "high",
        where=where,
    )


def straggler(ev: RunEvidence) -> Finding | None:
    """The rank whose own work (data, forward, backward, optimizer, Python) is longest: the others wait for it.
    With equal work, each phase would take what the fastest rank took for it (a rank that waits runs its
    own phases slower afterwards, its caches cold and its core idled) plus the all-reduce's own time (the
    least-waiting rank's): that is the predicted step. Where the straggler's excess is costlier samples run
    through the others' code (_heavier_samples), even shards give those phases the ranks' mean instead."""
    ranks = ev.probe_ranks
    # Ranks with different step counts are not comparable per step (under join() a rank that ran out
    # shadows the others' all-reduces, which reads as busy time): uneven_steps names that cause.
    if len(ranks) < 2 or _uneven(ranks):
        return None
    own = ("data", "forward", "backward", "optimizer", "other")
    busy = [sum(r["phases_s"][p] for p in own) for r in ranks]
    slow = max(range(len(ranks)), key=lambda i: busy[i])
    others = statistics.median(b for i, b in enumerate(busy) if i != slow)
    excess, step = busy[slow] - others, _step(ev)
    if excess / step < STRAGGLER_EXCESS or busy[slow] < STRAGGLER_RATIO * others:
        return None
    # A rank that waited for another's evaluation or checkpoint runs its own phases slower afterwards
    # (cold): when that exclusive work is as large as the excess, it explains it, and the evaluation or
    # checkpoint check names the cause.
    exclusive = max(r["phases_s"]["eval"] + r["phases_s"]["checkpoint"] for i, r in enumerate(ranks) if i != slow)
    if exclusive >= excess:
        return None
    factor = _same_work_slower(ranks, slow)
    saving, predicted = _equal_work(ev, slow, own, _heavier_samples(ranks, slow) if factor is None else [])
    evidence = f"{_steps_text(ev)}; each rank's own work per step: " + ", ".join(
        f"rank {r['rank']} {ms(b)}" for r, b in zip(ranks, busy)
    )
    # In the ranks' mean phases, the slow rank's extra work per phase: its share of the mean.
    extra = {
        p: max(
            0.0,
            ranks[slow]["phases_s"][p] - statistics.median(r["phases_s"][p] for i, r in enumerate(ranks) if i != slow),
        )
        / len(ranks)
        for p in own
    }
    if factor is not None:
        who = ranks[slow]["rank"]
        # Other work on this rank's own cores (a busy machine, doctor/checks.py contended) slows it by as much: the
        # caveat says so, and this finding of the same fact ranks after it, not above the run's own causes. It is
        # kept for the time it accounts for, which would otherwise read as the model's own work.
        taken = ev.core_contention.get(who, 0.0)
        return Finding(
            "slow_rank",
            f"rank {who} runs the same work {factor:.2f}x slower: the others wait {ms(excess)} for it every step",
            evidence + f"; the same samples per step, and its forward and backward each "
            f"about {factor:.2f}x the others'",
            "the ranks do the same work, but one core (or device) runs it slower: shared with other work, throttled, "
            "or a fail-slow part; synchronous training goes at the pace of the slowest rank",
            f"not in the script: see what else runs on rank {who}'s core or device (top, nvidia-smi) and whether it "
            "is slower again in the next run; if it is, leave that node or device out",
            predicted,
            saving,
            # A cause in the machine, which no change to the script removes and the next run may not meet: medium
            # at most, so that a healthy script is not given a high finding for the core it ran on (a CI run of the
            # healthy Lightning script met a core running the same work 1.47x slower, nothing else on it).
            "low" if saving < SEVERITY_MEDIUM else "medium",
            where=f"rank {who}'s core or device",
            explains=extra,
            contention_explains=taken > 0 and 1 - 1 / factor <= taken + CONTENTION_EXPLAINS_SLACK,
        )
    return Finding(
        "straggler",
        f"rank {ranks[slow]['rank']} is a straggler: the others wait {ms(excess)} for it every step",
        evidence,
        f"rank {ranks[slow]['rank']} has more work per step (an uneven shard, work under `if rank == ...`, a slower "
        "or shared core); synchronous training goes at the pace of the slowest rank",
        _code_change(
            "give every rank the same work per step (equal shards from a DistributedSampler, no "
            "rank-specific work in the loop)",
            ev,
        ),
        predicted,
        saving,
        where=_slow_rank_where(ranks[slow], max(extra, key=lambda p: extra[p])),
        explains=extra,
    )


def _equal_work(ev: RunEvidence, slow: int, own: tuple[str, ...], heavier: list[str]) -> tuple[float, str]:
    """The saving and its text with every rank doing the same work. A slower core's remedy (leave it out) and a
    straggler's own work removed give each phase the fastest rank's time; a straggler's costlier samples, dealt
    out evenly, give the phases they cost (`heavier`) the ranks' mean."""
    ranks = ev.probe_ranks
    shared = sum(
        _mean([r["phases_s"][p] for r in ranks]) if p in heavier else min(r["phases_s"][p] for r in ranks) for p in own
    )
    new_step = shared + ev.all_reduce_s
    saving = 1 - new_step / _step(ev)
    dealt = (
        f", but {' and '.join(heavier)} at the ranks' mean: rank {ranks[slow]['rank']} ran the others' code there "
        f"longer ({_top_place(ranks[slow], heavier[0])}), on costlier samples that even shards share out"
        if heavier
        else ""
    )
    return saving, (
        f"{speedup(saving)}: a step of {ms(new_step)}, each phase as fast as the fastest rank ran it{dealt} "
        f"({ms(shared)} of own work) plus the all-reduce's own time"
    )


def _heavier_samples(ranks: list[dict[str, Any]], slow: int) -> list[str]:
    """The phases of the samples' own work (data, forward, backward) in which the slow rank, at the others'
    samples per step, spent longer in the same code: its profiled steps' top place there is every other rank's.
    That is costlier samples, not extra work: evening the shards gives each rank the ranks' mean there, where
    removing work that only one rank does gives the fastest rank's (a straggler's code of its own is a place
    the others do not have)."""
    mine = ranks[slow]
    others = [r for i, r in enumerate(ranks) if i != slow]
    if not _same_samples(ranks, slow):
        return []
    return [
        p
        for p in PER_SAMPLE_PHASES
        if mine["phases_s"][p] > max(r["phases_s"][p] for r in others)
        and (top := _top_place(mine, p)) is not None
        and all(_top_place(r, p) == top for r in others)
    ]


def _top_place(rank: dict[str, Any], phase: str) -> str | None:
    """The user code a rank's profiled steps spent the most of this phase in, the probe's own hooks left out."""
    places = ((rank.get("trace") or {}).get("phases", {}).get(phase, {})).get("where") or []
    return next((place for place, _ in places if place != PROBE_LABEL), None)


def _slow_rank_where(rank: dict[str, Any], phase: str) -> str:
    """Where the straggler's extra work is: the user code its profiled steps spent that phase in."""
    entry = (rank.get("trace") or {}).get("phases", {}).get(phase, {})
    places = entry.get("where") or entry.get("what") or []
    return f"rank {rank['rank']}'s {phase}" + (f", in {places[0][0]}" if places else "")


def _same_work_slower(ranks: list[dict[str, Any]], slow: int) -> float | None:
    """The factor by which the slow rank ran the others' work, when its excess looks like a slower core
    rather than more work: the same samples per step, and either the excess in forward and backward (not in data
    or the loop's own Python, where rank-specific work lands) and both slower by about one factor (their mean), or
    the excess in the phases holding a tenth of the others' own work or more, every one of them slower by about
    one factor (the ratio of its own work to theirs). Extra work inside the model's forward slows forward alone; a
    bigger batch shows in the samples. None otherwise."""
    others = [r for i, r in enumerate(ranks) if i != slow]
    mine = ranks[slow]
    if not _same_samples(ranks, slow):
        return None

    def phase(p: str) -> float:
        return statistics.median(r["phases_s"][p] for r in others)

    own = ("data", "forward", "backward", "optimizer", "other")
    compute = ("forward", "backward")
    theirs = sum(phase(p) for p in own)
    excess = sum(mine["phases_s"][p] for p in own) - theirs
    if excess <= 0:
        return None
    if _alike(mine, phase, compute, excess):
        return statistics.mean(mine["phases_s"][p] / phase(p) for p in compute)
    held = tuple(p for p in own if phase(p) >= SLOW_CORE_PHASE_SHARE * theirs)
    if len(held) >= 2 and _alike(mine, phase, held, excess):
        return (theirs + excess) / theirs
    return None


def _same_samples(ranks: list[dict[str, Any]], slow: int) -> bool:
    """Whether the slow rank trained on as many samples per step as every other, within 1 %."""
    mine = ranks[slow].get("samples_per_step", 0.0)
    samples = [r.get("samples_per_step", 0.0) for i, r in enumerate(ranks) if i != slow]
    return all(abs(s - mine) <= 0.01 * max(s, 1e-9) for s in samples)


def _alike(mine: dict[str, Any], theirs: Callable[[str], float], phases: tuple[str, ...], excess: float) -> bool:
    """Whether SLOW_CORE_COMPUTE_SHARE of the slow rank's excess or more lies in these phases, each slower than
    the others' by factors within SLOW_CORE_SPREAD of each other."""
    within = sum(mine["phases_s"][p] - theirs(p) for p in phases)
    if within < SLOW_CORE_COMPUTE_SHARE * excess or min(theirs(p) for p in phases) <= 0:
        return False
    ratios = [mine["phases_s"][p] / theirs(p) for p in phases]
    return max(ratios) <= SLOW_CORE_SPREAD * min(ratios)


def _uneven(ranks: list[dict[str, Any]]) -> bool:
    steps = [r["steps"] for r in ranks]
    return len(ranks) >= 2 and max(steps) >= UNEVEN_STEPS * _mean(steps)


def uneven_steps(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    steps = [r["steps"] for r in ranks]
    if not _uneven(ranks):
        return None
    # The run lasts as long as the rank with the most steps; equal shards give every rank the mean.
    saving = 1 - _mean(steps) / max(steps)
    # A rank that ran out of batches spends the rest of the epoch outside its steps' phases (shadowing the
    # others' all-reduces under join(), or waiting in its next collective): the probe charges that to the
    # loop's own time ('other'), above what the rank with the most steps spends there.
    most = max(ranks, key=lambda r: r["steps"])["phases_s"].get("other", 0.0)
    waiting = _mean([max(0.0, r["phases_s"].get("other", 0.0) - most) for r in ranks])
    return Finding(
        "uneven_shards",
        f"the ranks took different numbers of steps ({', '.join(map(str, steps))})",
        "optimizer steps per rank: " + ", ".join(f"rank {r['rank']} {r['steps']}" for r in ranks),
        "uneven data shards: ranks that finish early wait (or, under DDP's join(), shadow the others' all-reduces) "
        "while the rank with the most data trains on",
        _code_change(
            "split the data evenly: a DistributedSampler (drop_last=True if the ranks must match exactly)", ev
        ),
        f"{speedup(saving)}: every rank takes the mean number of steps, {_mean(steps):.0f}",
        saving,
        where="the data's split across ranks (the training loader's sampler)",
        explains={"other": waiting},
    )


RANK_CHECKS: tuple[Callable[[RunEvidence], Finding | None], ...] = (unsynchronised, straggler, uneven_steps)
