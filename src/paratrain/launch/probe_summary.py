"""The probe's files (RUN_DIR/probe/rank<R>.jsonl, written by launch/probe/) as summary.json blocks.

`breakdown` has the same five keys, in seconds per optimizer step, as a built-in run's, so one set
of doctor checks reads both: compute is forward + backward (and checkpointing's recompute), and
evaluation and checkpoints, which a built-in run does between epochs, count as `other`. The `probe`
block keeps what only the probe sees, per rank: every phase, the threads torch used, DataLoader
workers, DDP's settings, samples and all-reduce rounds per step, the facts of launch/probe/facts.py, and
what the profiled steps' trace says (launch/trace_summary.py).

Per-step figures are means over the steady steps, not medians: an evaluation or checkpoint every
k steps is time the run spends, and the doctor's predicted gains are shares of that time.
"""

from __future__ import annotations

import gzip
import shutil
import statistics
from pathlib import Path
from typing import Any

from paratrain.launch.probe import DEVICE_PHASES, PHASES, RAW_TRACE_FILE, TRACE_FILE
from paratrain.launch.step_trend import trends
from paratrain.launch.trace_summary import summarise_file
from paratrain.runs import json_records

PROBE_DIR = "probe"
# Per-step counts a rank's record gives as means over its steady steps (launch/probe/clock.py end_step).
COUNTS = (
    "samples",
    "micro",
    "rounds",
    "buckets",
    "bucket_bytes",
    "inner_calls",
    "inner_bytes",
    "model_calls",
    "model_comm_s",
    "recomputes",
    "backwards",
    "syncs",
    "gc_s",
    "gc_n",
    "compiles",
    "compile_s",
)
BUCKET_LOGS = 8  # steps whose buckets were timed one by one, kept per rank
GC_SITES = 3
# Steps that pay for start-up (allocations, first kernels, DDP's bucket rebuild after the first
# step) are left out, like a built-in run's first epoch: the first WARMUP_SHARE of the steps, and
# at least WARMUP_MIN of them while as many remain.
WARMUP_SHARE = 0.1
WARMUP_MIN = 2


def steady(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps after warm-up."""
    skip = max(int(len(steps) * WARMUP_SHARE), WARMUP_MIN)
    return steps[skip:] if len(steps) > 2 * skip else steps[len(steps) // 2 :]


def rank_record(rank: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's steps summarised: means per steady step, and the last state it ran with."""
    state: dict[str, Any] = {}
    for r in records:
        if r.get("kind") == "state":
            state.update({k: v for k, v in r.items() if k not in ("kind", "step")})
    steps = [r for r in records if r.get("kind") == "step"]
    fallback = next((r for r in records if r.get("kind") == "fallback"), None)
    used = used_steps(records)
    out: dict[str, Any] = {"rank": rank, "steps": len(steps), "steady_steps": len(used), **state}
    if fallback:
        out["fallback"] = f"{fallback['where']}: {fallback['error']}"
    if steps and all("collectives" in s for s in steps):  # a probe that counted them
        # The first step holds the set-up's collectives (a barrier, the initial weights broadcast): not training's.
        out["collectives_after_first_step"] = sum(s["collectives"] for s in steps[1:])
    if used:
        n = len(used)
        wall = sum(s["wall_s"] for s in used)
        out.update(
            step_s=wall / n,
            wall_s=wall,
            phases_s={p: sum(s.get(p, 0.0) for s in used) / n for p in PHASES},
            **{f"{c}_per_step": sum(s.get(c, 0) for s in used) / n for c in COUNTS},
            sync_wait_s=sum(s.get("sync_wait", 0.0) for s in used) / n,
            data_cpu_s=sum(s["data_cpu"] for s in used) / n,
            eval_steps=sum(s["eval"] > 0 for s in used),
            checkpoint_steps=sum(s["checkpoint"] > 0 for s in used),
            ddp_overhead_s=sum(s["ddp_overhead"] for s in used) / n,
            **excess_s(used),
            # per-step wall times, for the spread (a rank whose steps vary waits unevenly)
            step_s_median=statistics.median(s["wall_s"] for s in used),
        )
        out.update(device_record(records, {s["step"] for s in used}))
        out.update(worker_pause_record(steps, used))
        out.update(gc_sites(used))
        issuers: dict[str, int] = {}
        for s in used:
            for who, calls in s.get("model_issuers", {}).items():
                issuers[who] = issuers.get(who, 0) + calls
        if issuers:
            out["model_issuers"] = [
                [who, calls / n] for who, calls in sorted(issuers.items(), key=lambda kv: -kv[1])[:3]
            ]
        logs = [{"buckets": s["bucket_log"], "backward_s": s["backward_span"]} for s in used if s.get("bucket_log")]
        if logs:
            out["bucket_logs"] = logs[:BUCKET_LOGS]
        out.update(trends(used))
    return out


def gc_sites(used: list[dict[str, Any]]) -> dict[str, Any]:
    """The code that triggered the steady steps' long collections, by seconds per step, the most first."""
    total: dict[str, float] = {}
    for s in used:
        for where, seconds in s.get("gc_sites", {}).items():
            total[where] = total.get(where, 0.0) + seconds
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:GC_SITES]
    return {"gc_sites": [[where, seconds / len(used)] for where, seconds in ranked]} if ranked else {}


def used_steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steady steps a rank's figures are means of. A step run with the loader workers stopped
    (launch/probe/workers.py) is the counterfactual, not the run, and a profiled step runs slower
    (launch/probe/window.py): both are kept apart."""
    return [
        s
        for s in steady([r for r in records if r.get("kind") == "step"])
        if "loader_id" not in s and not s.get("profiled")
    ]


def own_time_s(ranks_steps: list[list[dict[str, Any]]], phase: str) -> float | None:
    """A collective phase's own time per step (DDP's all-reduce: `comm`; the script's own: `collective`): in
    each step the least time any rank spent in it (the rank that arrived last waited for no one), averaged
    over the steps every rank ran. Each rank's mean alone includes the waits for the others: on a busy
    machine, where any rank can lose its core for a while in any step, every rank's mean has waits in it (a
    healthy run then looked as if its all-reduce took a third of the step), and a barrier after rank 0's
    evaluation is all wait for the other ranks."""
    # A layer's own collectives inside forward and backward are comm too, but not DDP's: they are taken out.
    by_step = [
        {s["step"]: s.get(phase, 0.0) - (s.get("model_comm_s", 0.0) if phase == "comm" else 0.0) for s in steps}
        for steps in ranks_steps
    ]
    common = set.intersection(*(set(steps) for steps in by_step)) if len(by_step) > 1 else set()
    if not common:
        return None
    return statistics.mean(min(steps[i] for steps in by_step) for i in common)


def unequal_wait_s(ranks_steps: list[list[dict[str, Any]]], key: str) -> float | None:
    """What the ranks wait, a step, for another rank's longer `key` (Python's collections: `gc_s`): in each step the
    mean over the ranks of the most any rank spent in it less its own, averaged over the steps every rank ran. A
    rank that finishes its share early waits for the longest in the next collective, so removing the work
    removes that wait too (the catalogue's gc.collect() fault: 14.4 ms a step of waiting, in a 375 ms step)."""
    by_step = [{s["step"]: s.get(key, 0.0) for s in steps} for steps in ranks_steps]
    common = set.intersection(*(set(steps) for steps in by_step)) if len(by_step) > 1 else set()
    if not common:
        return None
    return statistics.mean(
        statistics.mean(max(steps[i] for steps in by_step) - steps[i] for steps in by_step) for i in common
    )


def worker_pause_record(steps: list[dict[str, Any]], used: list[dict[str, Any]]) -> dict[str, Any]:
    """Forward and backward per micro-step with the rank's loader workers running (the median of the
    steady steps) and stopped (the median of the pauses); the workers' CPU seconds per batch they
    delivered (between the first and the last pause of each DataLoader iterator, summed over them);
    and one batch prepared in the rank's own process (the median of the pauses)."""
    paused = [s for s in steps if s.get("paused_micro", 0) > 0]
    running = [(s["forward"] + s["backward"]) / s["micro"] for s in used if s["micro"] > 0]
    if not paused or not running:
        return {}
    out: dict[str, Any] = {
        "paused_steps": len(paused),
        "fb_per_micro_s": statistics.median(running),
        "paused_fb_per_micro_s": statistics.median(s["paused_fb"] / s["paused_micro"] for s in paused),
    }
    cpu = batches = 0.0
    for loader in {s["loader_id"] for s in paused}:
        readings = [s for s in paused if s["loader_id"] == loader]
        cpu += readings[-1]["loader_cpu_s"] - readings[0]["loader_cpu_s"]
        batches += readings[-1]["loader_batches"] - readings[0]["loader_batches"]
    if batches > 0:
        out["loader_cpu_per_batch_s"] = cpu / batches
    inline = [s["inline_load_s"] for s in paused if s.get("inline_load_s") is not None]
    if inline:
        out["inline_load_s"] = statistics.median(inline)
    return out


def device_record(records: list[dict[str, Any]], steps: set[int]) -> dict[str, Any]:
    """The device's own time per steady step and phase (CUDA events: launch/probe/device.py)."""
    device = [r for r in records if r.get("kind") == "device" and r["step"] in steps]
    if not device:
        return {}
    n = len(device)
    return {
        "device_step_s": sum(r["span_s"] for r in device) / n,
        "device_steps": n,
        "device_phases_s": {p: sum(r[p] for r in device) / n for p in DEVICE_PHASES},
    }


def excess_s(used: list[dict[str, Any]]) -> dict[str, Any]:
    """What steps with an evaluation (or a checkpoint) cost beyond a plain step, per step of the run:
    more than the evaluation's own time, since after it the caches are cold and the ranks meet at the
    next all-reduce as unevenly as their evaluations ended. A plain step is the median of the others.
    So do the steps in which a DataLoader began an epoch (and nothing was evaluated or saved): the time
    between epochs (a loader's workers started again, a dataset built again), with the phases it went to."""
    quiet = [s for s in used if s["eval"] == 0 and s["checkpoint"] == 0]
    # A loader iterated afresh every step (iter(loader) inside the loop) begins an "epoch" every step: then no
    # plain step is left, the steps without evaluation or checkpoint are the base, and data_wait reads that cost.
    plain = [s for s in quiet if not s.get("epoch_began")]
    if not quiet:
        return {}
    base = statistics.median(s["wall_s"] for s in plain or quiet)
    out: dict[str, Any] = {
        f"{phase}_excess_s": sum(max(0.0, s["wall_s"] - base) for s in used if s[phase] > 0) / len(used)
        for phase in ("eval", "checkpoint")
    }
    starts = [s for s in quiet if s.get("epoch_began")]
    if starts and plain:
        out["epoch_starts"] = len(starts)
        out["epoch_start_excess_s"] = sum(max(0.0, s["wall_s"] - base) for s in starts) / len(used)
        out["epoch_start_phases_s"] = {
            phase: sum(max(0.0, s[phase] - statistics.median(p[phase] for p in plain)) for s in starts) / len(used)
            for phase in ("data", "other")
        }
    return out


def keep_trace(probe_dir: Path, rank: int) -> Path:
    """The rank's trace as kept: the plain JSON it wrote, compressed here into TRACE_FILE (after the run, so the
    training never waits for it); the plain file when it cannot be compressed."""
    raw, kept = probe_dir / RAW_TRACE_FILE.format(rank=rank), probe_dir / TRACE_FILE.format(rank=rank)
    if not raw.exists():
        return kept
    try:
        with open(raw, "rb") as source, gzip.open(kept, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)
    except OSError:
        kept.unlink(missing_ok=True)
        return raw
    raw.unlink()
    return kept


def summarise(run_dir: Path) -> dict[str, Any]:
    """`breakdown` and `probe` for summary.json; the probe block alone when no step was seen or it fell back."""
    files = sorted((run_dir / PROBE_DIR).glob("rank[0-9]*.jsonl"), key=lambda p: int(p.stem[4:]))
    if not files:
        return {"probe": {"status": "no data", "reason": "no rank wrote probe records (did the script import torch?)"}}
    records = [json_records(p) for p in files]
    ranks = [rank_record(int(p.stem[4:]), r) for p, r in zip(files, records, strict=True)]
    for rank in ranks:
        trace = summarise_file(keep_trace(run_dir / PROBE_DIR, rank["rank"]))
        if trace is not None:
            rank["trace"] = trace
    fell_back = [r for r in ranks if "fallback" in r]
    probe: dict[str, Any] = {"status": "on", "ranks": ranks}
    if fell_back:
        probe.update(
            status="fell back",
            reason="; ".join(f"rank {r['rank']}: {r['fallback']}" for r in fell_back)
            + " (the script ran on untouched; only the monitor's samples describe this run)",
        )
        return {"probe": probe}
    timed = [r for r in ranks if "phases_s" in r]
    if not timed:
        probe.update(
            status="no steps",
            reason="no optimizer step was seen: the script never called optimizer.step() of a torch.optim optimizer",
        )
        return {"probe": probe}
    probe["synchronised"] = synchronised(ranks)
    phases = {p: statistics.mean(r["phases_s"][p] for r in timed) for p in PHASES}
    probe["phases_s"] = phases
    probe["step_s"] = statistics.mean(r["step_s"] for r in timed)
    steady_steps = [used_steps(r) for r in records]
    for key, phase in (("all_reduce_s", "comm"), ("collective_own_s", "collective")):
        own = own_time_s(steady_steps, phase)
        if own is not None:
            probe[key] = own
    gc_wait = unequal_wait_s(steady_steps, "gc_s")
    if gc_wait is not None:
        probe["gc_wait_s"] = gc_wait
    breakdown = {
        "data_s": phases["data"],
        "compute_s": phases["forward"] + phases["backward"] + phases["recompute"],
        "comm_s": phases["comm"] + phases["collective"],
        "optimizer_s": phases["optimizer"],
        "other_s": phases["other"] + phases["eval"] + phases["checkpoint"],
    }
    out: dict[str, Any] = {"breakdown": breakdown, "probe": probe}
    samples = sum(r["samples_per_step"] * r["steady_steps"] for r in timed)
    wall = max(r["wall_s"] for r in timed)
    if samples and wall:
        probe["samples_per_s"] = samples / wall
    return out


def synchronised(ranks: list[dict[str, Any]]) -> bool | None:
    """Whether the ranks of a multi-rank run trained one model together: a rank wrapped it in DDP, or called a
    collective (its own, FSDP's, DDP's) in a step after the first. False: N independent copies, whose samples/s
    add up without training anything faster. None: one rank, a rank with fewer than two steps, or records of
    a probe that did not count collectives."""
    if len(ranks) < 2 or any(r.get("steps", 0) < 2 or "collectives_after_first_step" not in r for r in ranks):
        return None
    return any(r.get("ddp") or r["collectives_after_first_step"] > 0 for r in ranks)


def off(reason: str) -> dict[str, Any]:
    return {"probe": {"status": "off", "reason": reason}}
