"""Causes the doctor reads from what the probe saw besides phase times (launch/probe/facts.py, the profiled
steps' trace): each names where its time goes, the measured share of the step, a remedy and the step with
that time removed or repriced, as script_checks.py does for the phases.

    duplicate_data         every rank reads the whole dataset (no DistributedSampler), or the same samples
    garbage_collection     Python's collections: gc.collect() in the loop, or a heap it walks every step
    float64                the model in double precision: its layers timed in float32 give the price
    needless_gradients     gradients of parameters no optimizer holds (a backbone meant to be frozen)
    needless_recompute     activation checkpointing's recompute in a run far from its memory limit
    model_collectives      a layer's own collectives inside forward and backward (a synchronised batch norm)
    ddp_buckets            DDP buckets far smaller than its default: many all-reduces a step, each at the
                           link's latency
    data_preparation       the rank prepares its batches itself (decoding, augmenting) with no core to spare
    epoch_start            the time between epochs: a loader's workers started again, a loader or dataset built again
    recompilation          torch.compile compiling again in the steady steps
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, size, speedup

GC_SHARE = 0.05  # collections, of the step
FLOAT64_SAVING = 0.05  # what float32 would save, of the step
NEEDLESS_GRAD_SAVING = 0.05  # what freezing the parameters no optimizer holds could save, of the step
RECOMPUTE_SHARE = 0.05  # checkpointing's recompute, of the step...
MEMORY_HEADROOM = 0.5  # ...in a run whose peak memory is under this share of what the rank may hold
MODEL_COMM_SHARE = 0.10  # a layer's own collectives, of the step
BUCKET_EXCESS = 4  # DDP buckets per step this many times the default's count (and more than 2 above it)...
BUCKET_SAVING = 0.05  # ...saving this share of the step
DATA_CPU_SHARE = 0.15  # preparing batches in the rank's own thread, of the step
COMPILE_SHARE = 0.05  # compiling in the steady steps, of the step
EPOCH_START_SHARE = 0.05  # the steps that began an epoch, beyond a plain step, of the run's step time
# DDP's default buckets (torch.nn.parallel.DistributedDataParallel): the first holds 1 MiB, the rest 25 MiB.
DDP_FIRST_BUCKET = 2**20
DDP_BUCKET = 25 * 2**20
BATCHNORM_BATCH = 16  # per-rank samples at or above which a batch norm's own statistics are good enough


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else 0.0


def _step(ev: RunEvidence) -> float:
    return _mean([r["step_s"] for r in ev.probe_ranks])


def _per_step(ev: RunEvidence, key: str) -> float:
    return _mean([r.get(f"{key}_per_step", 0.0) for r in ev.probe_ranks])


def _phase(ev: RunEvidence, phase: str) -> float:
    return _mean([r["phases_s"].get(phase, 0.0) for r in ev.probe_ranks])


def _script(ev: RunEvidence) -> str:
    return str(ev.config.get("script", "the script"))


def _steps_text(ev: RunEvidence) -> str:
    p = ev.probe["phases_s"]
    shown = [
        f"{name} {ms(p[name])}"
        for name in ("data", "forward", "backward", "comm", "collective", "optimizer", "eval", "checkpoint", "other")
        if p[name] >= 0.0005 * _step(ev)
    ]
    return f"step {ms(_step(ev))} (mean of {len(ev.probe_ranks)} ranks): " + ", ".join(shown)


def _code_change(text: str, ev: RunEvidence) -> str:
    return f"code change in {ev.config.get('script', 'the script')}: {text}"


def trace_top(ev: RunEvidence, phase: str, table: str = "where") -> list[tuple[str, float]]:
    """The profiled steps' largest entries of a phase's table (what ran, where in the user's code, in which
    module), from the first rank with a trace."""
    for r in ev.probe_ranks:
        entry = (r.get("trace") or {}).get("phases", {}).get(phase)
        if entry and entry.get(table):
            return [(name, seconds) for name, seconds in entry[table]]
    return []


def _training_loader(rank: dict[str, Any]) -> dict[str, Any] | None:
    """The DataLoader that fed the most batches: the training one."""
    loaders = rank.get("loaders") or []
    return max(loaders, key=lambda loader: loader.get("batches", 0)) if loaders else None


def duplicate_data(ev: RunEvidence) -> Finding | None:
    """Every rank reads the whole dataset: its loader's sampler is not sharded and one rank's epoch covers the
    dataset's length, or the ranks' first batches are the same samples (an iterable dataset not split by rank).
    Each step trains as it should, but an epoch takes N times the steps it needs."""
    ranks = ev.probe_ranks
    loaders = [_training_loader(r) for r in ranks]
    if len(ranks) < 2 or any(loader is None for loader in loaders):
        return None
    first = loaders[0]
    world = int(first.get("world") or len(ranks))
    if world < 2 or (first.get("sampler_replicas") or 1) > 1:
        return None
    length, per_epoch = first.get("length"), (first.get("batches_per_epoch") or 0) * (first.get("batch_size") or 0)
    # The same dataset on every rank (not each rank its own shard, as a Subset of its indices), read whole.
    held = [(loader.get("length"), loader.get("dataset_sum")) for loader in loaders]
    whole = bool(length) and per_epoch >= 0.9 * length and len(set(held)) == 1
    sums = [loader.get("first_batch_sum") for loader in loaders]
    same = None not in sums and len(set(sums)) == 1
    if not (whole or same):
        return None
    saving = 1 - 1 / world
    evidence = (
        f"the training DataLoader ({first['dataset']}, {length or 'unknown'} samples, sampler "
        f"{first.get('sampler')}) gives each of the {world} ranks "
        + (f"{per_epoch:,} samples an epoch: the whole dataset" if whole else "an epoch of its own")
        + ("; every rank's first batch holds the same samples (equal sums)" if same else "")
    )
    iterable = first.get("iterable")
    remedy = (
        "split the stream by rank in the dataset's __iter__ (e.g. itertools.islice(stream, rank, None, world), "
        "with torch.utils.data.get_worker_info() for loader workers)"
        if iterable
        else "DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=True), ...) and sampler.set_epoch(epoch) "
        "at each epoch's start (no shuffle=True on the DataLoader)"
    )
    return Finding(
        "duplicate_data",
        f"every rank trains on the whole dataset: the {world} ranks do each epoch's work {world} times",
        evidence,
        "without a DistributedSampler (or a stream split by rank) each rank reads every sample: the steps are right, "
        "but there are N times as many of them in an epoch, and the ranks average gradients of the same data",
        f"code change in {_script(ev)}: {remedy}",
        f"{speedup(saving)} per epoch: each rank reads 1/{world} of the data, so an epoch takes 1/{world} of the steps "
        "(the step itself is unchanged)",
        saving,
        where=first.get("dataset_code") or f"the DataLoader of {first['dataset']}",
        share=saving,
    )


def garbage_collection(ev: RunEvidence) -> Finding | None:
    """Python's collections, timed by gc.callbacks, and the waits they make: in each step the ranks that collected
    less wait in the next collective for the one that collected most (the probe summary's `gc_wait_s`), no more
    than the all-reduce's waiting (its time beyond its own). Both go with the collections."""
    step, gc = _step(ev), _per_step(ev, "gc_s")
    if not ev.probe_ranks or gc / step < GC_SHARE:
        return None
    waiting = max(0.0, _phase(ev, "comm") - ev.all_reduce_s)
    wait = min(float(ev.probe.get("gc_wait_s") or 0.0), waiting)
    sites = ev.probe_ranks[0].get("gc_sites") or []
    where = sites[0][0] if sites else None
    explicit = bool(where) and "gc.collect" in where
    remedy = (
        f"remove the gc.collect() at {where.split(': ', 1)[0]} from the training loop: Python collects on its own "
        "(gc.freeze() once after building long-lived structures keeps them out of every collection)"
        if explicit
        else "call gc.freeze() once after building the long-lived structures (datasets' indexes, caches), or raise "
        "the thresholds (gc.set_threshold), or create fewer temporary Python objects per step"
        + (f" near {where.split(': ', 1)[0]}" if where else "")
    )
    return Finding(
        "garbage_collection",
        f"Python's garbage collection takes {pct(gc / step)} of every step",
        f"step {ms(step)}; {ms(gc)} a step in {_per_step(ev, 'gc_n'):.0f} collections (gc.callbacks)"
        + (f"; triggered at {where} ({ms(sites[0][1])} a step)" if where else "")
        + (f"; the ranks wait {ms(wait)} a step for each other's longer collections" if wait >= 0.0005 else ""),
        "a full collection walks every Python object the process holds: with a large heap (an index of the "
        "dataset, caches) each costs tens or hundreds of milliseconds",
        f"code change in {_script(ev)}: {remedy}",
        f"{speedup((gc + wait) / step)}: the collections' {ms(gc)} a step go"
        + (f", and the {ms(wait)} of waiting for them" if wait >= 0.0005 else "")
        + ("" if explicit else " (a bound: some collections remain)"),
        (gc + wait) / step,
        where=where,
        share=(gc + wait) / step,
        bound=not explicit,
        explains={"other": min(gc, _phase(ev, "other")), **({"comm": wait} if wait else {})},
    )


def float64(ev: RunEvidence) -> Finding | None:
    """A model in float64: its own layers were timed at both dtypes in each rank (the probe's twins), so the
    price of double precision is measured, not assumed; the optimizer moves twice the bytes."""
    ranks = [r for r in ev.probe_ranks if r.get("float64_penalty")]
    if not ranks:
        return None
    penalty = statistics.median(r["float64_penalty"] for r in ranks)
    step = _step(ev)
    compute = _phase(ev, "forward") + _phase(ev, "backward") + _phase(ev, "recompute")
    optimizer = _phase(ev, "optimizer")
    saved = compute * (1 - 1 / penalty) if penalty > 1 else 0.0
    saved += optimizer / 2
    if saved / step < FLOAT64_SAVING:
        return None
    params = ranks[0].get("param_dtypes") or {}
    inputs = ", ".join(ranks[0].get("input_dtypes") or []) or "unknown"
    return Finding(
        "float64",
        f"the model trains in float64: {pct(saved / step)} of every step is the price of double precision",
        f"step {ms(step)}: forward and backward {ms(compute)}, optimizer {ms(optimizer)}; parameters "
        + ", ".join(f"{n:,} {dtype}" for dtype, n in params.items())
        + f"; inputs {inputs}; the model's own layers ran {penalty:.1f}x slower in float64 than in float32 "
        "(timed in each rank)",
        "float64 runs at a fraction of float32's arithmetic rate (and some layers fall back to slow kernels); "
        "NumPy arrays are float64 by default, and model.double() (or a float64 tensor met by the model) "
        "carries every layer along",
        f"code change in {_script(ev)}: keep the model in float32 (no .double()) and convert the data once "
        "where it is made (torch.from_numpy(x).float(), or dtype=torch.float32)",
        f"{speedup(saved / step)}: forward and backward {penalty:.1f}x faster (the layers' measured ratio), the "
        "optimizer moving half the bytes",
        saved / step,
        where="the model's parameters and inputs (float64)",
        # a ratio at or under 1 (noise on tiny layers) accounts for none of their time, as in the saving
        explains={
            "forward": _phase(ev, "forward") * max(0.0, 1 - 1 / penalty),
            "backward": _phase(ev, "backward") * max(0.0, 1 - 1 / penalty),
        },
    )


def needless_gradients(ev: RunEvidence) -> Finding | None:
    """Parameters that backward gives a gradient every step but that no optimizer holds: their layers' backward
    (timed alone in each rank, forward and backward less forward) and their gradients' communication are spent
    for nothing. A bound on the backward: a frozen layer between trainable ones still passes gradients through."""
    ranks = [r for r in ev.probe_ranks if r.get("needless_grad_bytes") and r.get("needless_backward_s") is not None]
    if not ranks:
        return None
    step = _step(ev)
    backward = _mean([r["needless_backward_s"] for r in ranks])
    share = _mean([r["needless_grad_bytes"] / max(r.get("graded_bytes", 0), r["needless_grad_bytes"]) for r in ranks])
    # Their bytes at the link's measured bandwidth, no more than their share of the exposed communication: what
    # is exposed is often a wait for the other ranks, which fewer bytes do not shorten (unmeasured: none).
    _, bandwidth = link_fit(ev)
    needless_bytes = _mean([r["needless_grad_bytes"] for r in ranks])
    comm = min(_phase(ev, "comm") * share, needless_bytes / bandwidth) if bandwidth else 0.0
    saved = min(backward, _phase(ev, "backward")) + comm
    if saved / step < NEEDLESS_GRAD_SAVING:
        return None
    first = ranks[0]
    return Finding(
        "needless_gradients",
        f"backward computes gradients no optimizer uses: {pct(saved / step)} of every step",
        f"step {ms(step)}: backward {ms(_phase(ev, 'backward'))}, exposed gradient communication "
        f"{ms(_phase(ev, 'comm'))}; {first['needless_grad_params']:,} parameters "
        f"({size(first['needless_grad_bytes'])}, {pct(share)} of the gradients) get a gradient every "
        f"step and are in no optimizer; the layers holding only them take {ms(backward)} in backward (timed "
        "alone in each rank)",
        "parameters left with requires_grad=True that the optimizer was not given (a backbone meant to be "
        "frozen): backward computes their gradients and the data-parallel wrapper synchronises them, and "
        "nothing reads them",
        f"code change in {_script(ev)}: freeze them before wrapping the model, "
        "`for p in backbone.parameters(): p.requires_grad_(False)` (or give them to the optimizer if they were "
        "meant to train)",
        f"up to {speedup(saved / step)} if their backward and their share of the communication were gone (a "
        "bound: a frozen layer between trainable ones still passes gradients through)",
        saved / step,
        where="parameters with requires_grad=True in no optimizer",
        bound=True,
        explains={"backward": min(backward, _phase(ev, "backward")), "comm": comm},
    )


def needless_recompute(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    step, recompute = _step(ev), _phase(ev, "recompute")
    if not ranks or recompute / step < RECOMPUTE_SHARE:
        return None
    peaks = [(r.get("peak_memory_bytes"), r.get("memory_limit_bytes")) for r in ranks]
    if any(not p or not limit for p, limit in peaks):
        return None
    used = max(p / limit for p, limit in peaks)
    if used >= MEMORY_HEADROOM:
        return None
    where = trace_top(ev, "recompute", "module") or trace_top(ev, "recompute")  # the blocks run again
    return Finding(
        "needless_recompute",
        f"activation checkpointing recomputes {pct(recompute / step)} of every step, with memory to spare",
        f"step {ms(step)}: recompute {ms(recompute)} ({_per_step(ev, 'recomputes'):.0f} checkpointed calls run again "
        f"in backward); peak memory {max(p for p, _ in peaks) / 2**30:.2f} GiB, {pct(used)} of the "
        f"{min(limit for _, limit in peaks) / 2**30:.1f} GiB a rank may hold"
        + (f"; recomputed in {where[0][0]}" if where else ""),
        "torch.utils.checkpoint frees a block's activations after forward and runs the block again in backward: "
        "it buys memory with time, and this run is far from its memory limit",
        f"code change in {_script(ev)}: call the blocks directly, without torch.utils.checkpoint (or checkpoint "
        "fewer of them, e.g. every other block, if memory then runs short)",
        f"{speedup(recompute / step)}: the recompute's {ms(recompute)} a step goes; the activations it freed are "
        "kept instead",
        recompute / step,
        where=where[0][0] if where else "torch.utils.checkpoint",
        share=recompute / step,
        explains={"recompute": recompute},
    )


GRADIENT_MATCH = 0.1  # a collective's bytes a step within this share of the gradients' are the gradients


def model_collectives(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    step, comm = _step(ev), _per_step(ev, "model_comm_s")
    if len(ranks) < 2 or comm / step < MODEL_COMM_SHARE:
        return None
    issuers = ranks[0].get("model_issuers") or []
    who = issuers[0][0] if issuers else "a layer of the model"
    batch = _mean([r["samples_per_step"] / max(r["micro_per_step"], 1) for r in ranks])
    norm = any("norm" in name.lower() or "bn" in name.lower() for name, _ in issuers)
    remedy = (
        f"plain batch norm (nn.BatchNorm2d, or no convert_sync_batchnorm): with {batch:.0f} samples a rank, each "
        "rank's own statistics are good enough"
        if norm and batch >= BATCHNORM_BATCH
        else "synchronise less often (every k steps) or outside forward and backward, or keep the statistic per rank"
    )
    cause = (
        "a collective inside a layer waits for every rank and for the link at each call, on the critical path: "
        "backward cannot hide it as DDP hides its gradient buckets"
    )
    twice = _gradients_again(ev)
    if twice:
        who = twice
        cause = (
            "the gradients are all-reduced a second time: DDP already averages them during backward, and the "
            f"script's own dist.all_reduce of every gradient (at {twice}) moves the same bytes again, after "
            "backward, unhidden"
        )
        remedy = "remove the manual gradient averaging: DDP's backward has already averaged every gradient"
    return Finding(
        "model_collectives",
        f"the model's own collectives take {pct(comm / step)} of every step: "
        f"{_per_step(ev, 'model_calls'):.0f} a step inside forward and backward",
        f"step {ms(step)}; {ms(comm)} a step in collectives called by the model's layers, by "
        + ", ".join(f"{name} ({calls:.0f} a step)" for name, calls in issuers)
        + (f"; they move {size(_per_step(ev, 'inner_bytes'))} a step, the model's gradients' size" if twice else ""),
        cause,
        f"code change in {_script(ev)}: {remedy}",
        f"{speedup(comm / step)}: those collectives' {ms(comm)} a step go",
        comm / step,
        where=who,
        share=comm / step,
        explains={"comm": comm},
    )


def _gradients_again(ev: RunEvidence) -> str | None:
    """Under DDP, all-reduces of the script's own moving the gradients' bytes each step (within GRADIENT_MATCH):
    the code that issues them, from the profiled steps."""
    ranks = ev.probe_ranks
    gradients = float(ranks[0].get("gradient_bytes", 0))
    if not gradients or not all(r.get("ddp") for r in ranks):
        return None
    if abs(_per_step(ev, "inner_bytes") - gradients) > GRADIENT_MATCH * gradients:
        return None
    calls = [
        c
        for c in (ranks[0].get("trace") or {}).get("collectives", [])
        if c["name"] == "allreduce" and abs(c["bytes"] - gradients) <= GRADIENT_MATCH * gradients
    ]
    if not calls:
        return None
    # DDP's own buckets move the same bytes: the script's are the calls as many as the probe counted beside DDP's
    inner = _per_step(ev, "model_calls")
    return min(calls, key=lambda c: abs(c["calls"] - inner))["issuer"]


def default_buckets(gradient_bytes: float) -> int:
    """How many buckets DDP's default cap makes of this many bytes of gradients."""
    return 1 + max(0, math.ceil((gradient_bytes - DDP_FIRST_BUCKET) / DDP_BUCKET))


def ddp_buckets(ev: RunEvidence) -> Finding | None:
    """DDP buckets far below the default (bucket_cap_mb set tiny): each all-reduce pays the link's latency and
    DDP's per-bucket work. With the default buckets the exposed all-reduce is the default count of those per-
    bucket costs plus the bytes' transfer: the bandwidth fitted to the run's own large collectives (the trace),
    the cost per bucket what this run's exposed time less that transfer gives per bucket (at least the link's
    latency). A run with no large message has no bandwidth to price the transfer at: the gain is then a bound
    (the transfer taken as free)."""
    ranks = [r for r in ev.probe_ranks if r.get("ddp")]
    if len(ranks) < 2 or len(ranks) != len(ev.probe_ranks):
        return None
    buckets = _per_step(ev, "buckets")
    gradients = float(ranks[0].get("gradient_bytes", 0))
    default = default_buckets(gradients)
    if buckets < BUCKET_EXCESS * default or buckets <= default + 2:
        return None
    latency, bandwidth = link_fit(ev)
    exposed, step = ev.all_reduce_s, _step(ev)
    transfer = gradients / bandwidth if bandwidth else 0.0
    # What a bucket costs this run: the link's own latency, or more (DDP's and gloo's work per bucket on a
    # busy core): the exposed time less the bytes' transfer, per bucket.
    per_bucket = max(latency, (exposed - transfer) / buckets)
    then = min(exposed, default * per_bucket + transfer)
    saved = exposed - then
    if saved / step < BUCKET_SAVING:
        return None
    cap = ranks[0].get("bucket_cap_bytes", 0)
    link = (
        f"{bandwidth / 1e9:.2f} GB/s (fitted to this run's collectives of 1 MiB or more)"
        if bandwidth
        else "its bandwidth unmeasured (no collective of 1 MiB or more)"
    )
    gain = (
        f"{speedup(saved / step)}: the exposed all-reduce shrinks from {ms(exposed)} to {ms(exposed - saved)}"
        if bandwidth
        else f"up to {speedup(saved / step)} (a bound: the bytes' transfer taken as free): the exposed all-reduce "
        f"shrinks from {ms(exposed)} to at least {ms(exposed - saved)}"
    )
    return Finding(
        "ddp_buckets",
        f"DDP all-reduces its gradients in {buckets:.0f} buckets a step, where its default makes {default}",
        f"step {ms(step)}: exposed all-reduce {ms(exposed)}; {gradients / 2**20:.1f} MiB of gradients in buckets of "
        f"at most {cap / 2**20:.2f} MiB (bucket_cap_mb): {ms(per_bucket)} a bucket; the link: {latency * 1e3:.2f} ms a "
        f"call at least, {link}",
        "each bucket is one all-reduce, paying the link's latency and DDP's own work per bucket; tiny buckets turn "
        "one transfer into many latency-bound calls that backward cannot hide",
        f"code change in {_script(ev)}: DistributedDataParallel(model) with the default bucket_cap_mb (25), or "
        "larger; drop bucket_cap_mb={:g}".format(cap / 2**20),
        f"{gain} ({default} calls instead of {buckets:.0f}, the same bytes)",
        saved / step,
        where=f"DistributedDataParallel(bucket_cap_mb={cap / 2**20:g})",
        bound=not bandwidth,
        explains={"comm": saved},
    )


def epoch_start(ev: RunEvidence) -> Finding | None:
    """The steps in which a DataLoader began an epoch cost more than a plain step in the rank's own data and `other`
    (the probe summary's epoch_start_phases_s, per step of the run): what runs between epochs, which the profiled
    steps rarely see.
    A loader whose workers are not persistent starts them again every epoch; otherwise the script builds its
    loader or dataset again (a new DataLoader per epoch, Lightning's reload_dataloaders_every_n_epochs)."""
    ranks = [r for r in ev.probe_ranks if r.get("epoch_starts")]
    if not ranks:
        return None
    # The rank's own work between epochs: its data and `other` beyond a plain step (not its wait in a collective),
    # and the least any rank spent so: a rank that waits at the epoch's start for another (rank 0 evaluating alone,
    # a rank with a longer shard) shows a wait there, which the rank it waits for does not.
    own = {r["rank"]: sum(r.get("epoch_start_phases_s", {}).values()) for r in ranks}
    excess = min(own.get(r["rank"], 0.0) for r in ev.probe_ranks)
    step = _step(ev)
    if excess / step < EPOCH_START_SHARE:
        return None
    first = min(ranks, key=lambda r: own[r["rank"]])
    per_epoch = excess * first["steady_steps"] / first["epoch_starts"]
    loader = _training_loader(first) or {}
    workers = int(loader.get("workers") or 0)
    restarts = workers > 0 and not loader.get("persistent_workers")
    phases = {p: first.get("epoch_start_phases_s", {}).get(p, 0.0) for p in ("data", "other")}
    return Finding(
        "epoch_start",
        f"each epoch's start costs {ms(per_epoch)} beyond a plain step: {pct(excess / step)} of the run's step time",
        f"step {ms(step)}; {first['epoch_starts']} epochs began in the steady steps of rank {first['rank']} (the "
        f"rank that spent least there), each step that began one {ms(per_epoch)} longer in its own work than a "
        f"plain step (data {ms(phases['data'])}, the script's own code {ms(phases['other'])} a step of the run); "
        "the training loader: "
        f"{loader.get('dataset', 'unknown')}, {workers} workers" + (", not persistent" if restarts else ""),
        f"its {workers} worker processes are started again at every epoch (persistent_workers=False), each "
        "importing and copying the dataset before the first batch"
        if restarts
        else "the script builds its DataLoader or dataset again each epoch (a new DataLoader per epoch; Lightning: "
        "reload_dataloaders_every_n_epochs), or does other work between epochs",
        f"code change in {_script(ev)}: "
        + (
            "DataLoader(..., persistent_workers=True)"
            if restarts
            else "build the dataset and DataLoader once, outside the epoch loop (Lightning: "
            "reload_dataloaders_every_n_epochs=0)"
        ),
        f"{speedup(excess / step)}: every step as long as a plain one",
        excess / step,
        where="the DataLoader's workers (persistent_workers=False)" if restarts else "between epochs",
        explains=phases,
    )


# Below a MiB a collective's time is the link's latency and the backend's work per call; its bandwidth only
# shows in larger messages (tiny buckets' 10 kB messages fitted 0.4 GB/s where 3 MiB moved at several GB/s).
LINK_FIT_BYTES = 2**20


def link_fit(ev: RunEvidence) -> tuple[float, float | None]:
    """Latency (s) and bandwidth (bytes/s, None when unmeasured) of the collectives the trace recorded on the
    backend's threads. The least time seen per message size is the link's own (longer ones waited for a rank):
    the latency is the smallest message's least time; the bandwidth the slope of a least-squares line through
    the minima of messages of 1 MiB or more, when they span at least a factor 2 in size."""
    points: dict[float, float] = {}
    for r in ev.probe_ranks:
        for nbytes, seconds in (r.get("trace") or {}).get("link", []):
            points[nbytes] = min(points.get(nbytes, math.inf), seconds)
    sizes = sorted(points)
    if not sizes:
        return 1e-4, None
    large = [size for size in sizes if size >= LINK_FIT_BYTES]
    bandwidth = None
    if len(large) >= 2 and large[-1] >= 2 * large[0]:
        ys = [points[x] for x in large]
        mx, my = _mean(large), _mean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(large, ys)) / sum((x - mx) ** 2 for x in large)
        bandwidth = 1 / max(slope, 1e-12)
    smallest = sizes[0]
    return max(points[smallest] - (smallest / bandwidth if bandwidth else 0.0), 1e-6), bandwidth


def data_preparation(ev: RunEvidence) -> Finding | None:
    """The rank prepares batches in its own thread (CPU time inside the DataLoader's __next__: decoding,
    augmenting, collating) while every core trains: DataLoader workers cannot hide it (they would take those
    cores' time), so the remedy is doing less of it, and its size is unknown: the gain is a bound."""
    ranks = ev.probe_ranks
    step, cpu = _step(ev), _mean([r["data_cpu_s"] for r in ranks])
    if not ranks or cpu / step < DATA_CPU_SHARE:
        return None
    if all(r.get("cpu_affinity", 1) > r.get("threads", 1) for r in ranks):
        return None  # cores to spare: DataLoader workers hide it (data_wait's remedy)
    loader = _training_loader(ranks[0]) or {}
    where = trace_top(ev, "data")
    what = trace_top(ev, "data", "what")
    code = loader.get("dataset_code")
    return Finding(
        "data_preparation",
        f"preparing batches takes {pct(cpu / step)} of every step, in the rank itself, with no core to spare",
        f"step {ms(step)}: {ms(cpu)} of CPU a step inside the DataLoader ({loader.get('dataset', 'dataset')}, "
        f"{loader.get('workers', 0)} workers); every core runs a rank"
        + (f"; in the profiled steps it went to {', '.join(name for name, _ in where[:2])}" if where else "")
        + (f" ({', '.join(name for name, _ in what[:2])})" if what else ""),
        "__getitem__ (or the collate function) decodes or transforms every sample at every epoch, in the process "
        "that trains; loader workers would only move that work onto cores the ranks already use",
        f"code change in {_script(ev)}: do the expensive part once: decode before training and keep tensors "
        "(or cache the decoded samples on disk), keep only cheap random augmentation per step; "
        + (f"the dataset's code: {code}" if code else "the dataset's __getitem__"),
        f"up to {speedup(cpu / step)} if preparing batches were free (a bound: what remains of it is unknown)",
        cpu / step,
        where=(where[0][0] if where else code) or "the DataLoader",
        share=cpu / step,
        bound=True,
        explains={"data": cpu},
    )


def recompilation(ev: RunEvidence) -> Finding | None:
    step, seconds = _step(ev), _per_step(ev, "compile_s")
    compiles = _per_step(ev, "compiles")
    if not ev.probe_ranks or compiles <= 0 or seconds / step < COMPILE_SHARE:
        return None
    breaks = max(r.get("graph_breaks", 0) for r in ev.probe_ranks)
    return Finding(
        "recompilation",
        f"torch.compile compiles again in the steady steps: {pct(seconds / step)} of the step",
        f"step {ms(step)}: {compiles:.2f} compilations a step after warm-up, {ms(seconds)} a step compiling "
        f"({max(r.get('compiled_frames', 0) for r in ev.probe_ranks)} frames compiled in all, {breaks} graph breaks)",
        "a guard failed (a shape, a Python value or a global the graph depends on changed), so dynamo traces and "
        "compiles the frame again; past torch._dynamo.config.cache_size_limit it falls back to eager",
        f"code change in {_script(ev)}: keep shapes fixed (drop_last=True, pad to buckets) or mark them dynamic "
        "(torch._dynamo.mark_dynamic, or torch.compile(dynamic=True)); do not branch on Python values that change; "
        "TORCH_LOGS=recompiles names the failing guard",
        f"{speedup(seconds / step)}: the steady steps stop compiling",
        seconds / step,
        where="torch.compile (TORCH_LOGS=recompiles)",
        share=seconds / step,
        explains={"forward": min(seconds, _phase(ev, "forward"))},
    )


CAUSES = (
    duplicate_data,
    garbage_collection,
    float64,
    needless_gradients,
    needless_recompute,
    model_collectives,
    ddp_buckets,
    data_preparation,
    recompilation,
    epoch_start,
)
