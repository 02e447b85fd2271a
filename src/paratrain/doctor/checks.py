"""The doctor's checks: each reads a run's (or a study's) evidence and returns a Finding or None.

Every check states its threshold and the model behind its predicted gain here, in one place;
docs/doctor.md explains them for users. A time finding's `saving` is the predicted fraction of
the step (or run) time the remedy removes: the findings are ranked by it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from paratrain.doctor.evidence import IDLE_CPU_PERCENT, RunEvidence, idle_fractions, rerun_command
from paratrain.doctor.finding import Finding, accumulation
from paratrain.formatting import ms, pct, speedup
from paratrain.runs import steady_epoch_time

# Thresholds: a share of the optimizer step (breakdown) above which a phase is worth fixing.
COMM_SHARE = 0.20  # exposed all-reduce time that backward did not hide
DATA_SHARE = 0.15  # waiting for the next batch
OTHER_SHARE = 0.15  # neither data, compute, communication nor optimizer: host-side work, syncs
STALL_RATE = 0.5  # a logging interval below half the median samples/s is a stall...
STALL_SHARE = 0.10  # ...and stalls costing this share of the training time are a finding
EVAL_SHARE = 0.25  # evaluation (and checkpoints) against training time
FIRST_EPOCH_SHARE = 0.25  # start-up that the first epoch paid, against the whole training time
SMALL_BATCH = 8  # heuristic per-device batch below which kernels and collectives are mostly overhead
WARMUP_LR_FACTOR = 8  # LR scaled up this much or more without warmup (Goyal et al. warm up at 32x)
STRAGGLER_RATIO = 1.3  # a rank's CPU against the median of the others, while all ranks are busy...
STRAGGLER_SHARE = 0.15  # ...in this share of the monitor samples or more...
STRAGGLER_DOMINANCE = 2  # ...and this many times as often as any other rank leads that way
STRAGGLER_MIN_SAMPLES = (
    3  # ...and in at least this many samples: once in a short run is chance (a healthy run led once in 6)
)
EDGE_SHARE = 0.10  # a sampled range's best value this near either end (in log space for log scaling) is at its edge
IDLE_DEVICE_SHARE = 0.2  # a GPU idle in this share of the monitor's samples (start-up and evaluation included)
ALONE_SHARE = 0.15  # rank 0 busy while every other rank idles, for this share of the monitored time
# Other work on one rank's own cores above this share marks the run contended even when the run's average is
# under launch/load.py's 10 %: a rank slowed by a fifth makes every other rank wait that long.
CORE_CONTENDED_ABOVE = 0.20
# Oversubscription model: a rank on its own cores computes at this fraction of the machine's measured
# matmul peak (summary mfu_peak). cifar10-cnn reached 13 % of it here and the gpt models 49-74 %
# (docs/doctor.md, docs/workloads.md), so 10 % is the conservative end on a quiet machine; other work on
# the cores slows the fixed run too, and the prediction then overshoots (docs/doctor.md's example).
FIXED_MFU = 0.10


def _steps_text(ev: RunEvidence) -> str:
    b = ev.breakdown
    return (
        f"step {ms(ev.step_s)}: data {ms(b['data_s'])}, compute {ms(b['compute_s'])}, comm {ms(b['comm_s'])}, "
        f"optimizer {ms(b['optimizer_s'])}, other {ms(b['other_s'])}"
    )


# -- run checks ---------------------------------------------------------------------------------


def oversubscription(ev: RunEvidence) -> Finding | None:
    cores, threads, n = ev.cores, ev.threads, ev.workers
    if not (ev.on_cpu and cores and threads) or n * threads <= cores:
        return None
    fixed_threads = max(1, cores // n)
    fixed_workers = min(n, cores)
    changes: dict[str, Any] = {"threads_per_worker": fixed_threads, "allow_oversubscribe": None}
    if fixed_workers != n:
        changes["workers"] = fixed_workers
    seen = ""
    if ev.rank_samples:
        counts = [max(s["num_threads"] for s in samples) for samples in ev.rank_samples.values()]
        seen = f"; the monitor counted {', '.join(map(str, counts))} threads per rank"
    evidence = f"{n} ranks x {threads} threads = {n * threads} threads on {cores} cores{seen}; " + (
        _steps_text(ev) if ev.breakdown else f"wall time {(ev.summary and ev.summary.wall_time_s) or 0:.1f} s"
    )
    flops = ev.summary and ev.summary.flops_per_sample
    peak = ev.summary and ev.summary.mfu_peak and ev.summary.mfu_peak.per_device
    batch = (ev.batch_size or 0) * ev.grad_accum
    if flops and peak and batch and ev.breakdown.get("compute_s"):
        # Peak was measured for `threads` threads; a thread's share, times the threads the fix gives.
        predicted_compute = flops * batch / (peak / threads * fixed_threads * FIXED_MFU)
        factor = max(1.0, ev.breakdown["compute_s"] / predicted_compute)
        saving = 1 - 1 / factor
        gain = (
            f"{factor:.1f}x faster on a quiet machine: at {FIXED_MFU:.0%} of the measured matmul peak a rank's compute "
            f"takes {ms(predicted_compute)} per step, against {ms(ev.breakdown['compute_s'])} measured; every phase of "
            "the step is slowed alike, so the whole step shrinks by that factor"
        )
    else:
        saving = 0.5
        gain = (
            "not predicted (no FLOP count or peak in the summary); oversubscribed runs are often several times slower"
        )
    return Finding(
        "oversubscription",
        f"{n * threads} threads compete for {cores} cores",
        evidence,
        "threads of different ranks time-slice on the same cores; a thread waiting at an operator's barrier for a "
        "descheduled sibling spins away the time slice, so every phase of the step slows down, not only compute "
        "(the other timing findings were measured in this state: fix this first, then diagnose again)",
        rerun_command(ev, **changes),
        gain,
        saving,
        rerun=changes,
    )


def exposed_communication(ev: RunEvidence) -> Finding | None:
    if ev.workers < 2 or ev.is_script or ev.share("comm_s") < COMM_SHARE:
        return None
    if ev.grown_batch and ev.grown_batch["kind"] == "adaptive":
        # Its goodput weighed the all-reduce at every doubling; batch_growth_capped tells when a cap stopped it.
        return None
    b = ev.breakdown
    accum = ev.grad_accum
    g, new_step, saving = accumulation(b["data_s"] + b["compute_s"], b["optimizer_s"] + b["other_s"], b["comm_s"])
    batch = ev.batch_size
    # CPU ranks with cores of their own average faster through shared memory than through gloo's sockets.
    shm = (
        ev.on_cpu
        and ev.summary
        and ev.summary.allreduce not in (None, "shm")
        and ev.resolved.get("cpu_sets")
        and ev.config.get("allreduce") == "backend"
    )
    return Finding(
        "exposed_communication",
        f"{pct(ev.share('comm_s'))} of every step is spent in all-reduce that backward does not hide",
        f"{_steps_text(ev)}; {ev.workers} workers, {batch} samples per worker per step",
        "the gradients' all-reduce costs the same whatever the batch, and this batch's forward and backward are too "
        "short to hide it (a large model and a small per-worker batch)",
        f"{rerun_command(ev, grad_accum=accum * g)} (one all-reduce per {accum * g} micro-steps; or --batch-size "
        f"{batch * g} if it fits in memory; the global batch grows {g}x and the LR follows --lr-scaling)"
        + (f"; and average through shared memory: {rerun_command(ev, allreduce='auto')}" if shm else ""),
        f"{speedup(saving)} per sample: {g} micro-steps share one all-reduce ({ms(new_step)} per {g} micro-steps "
        f"against {ms(g * ev.step_s)})",
        saving,
        rerun={"grad_accum": accum * g},
        global_batch_factor=g,
    )


def data_wait(ev: RunEvidence) -> Finding | None:
    if ev.is_script or ev.share("data_s") < DATA_SHARE:
        return None
    b = ev.breakdown
    loaders = int(ev.config.get("loader_workers") or 0)
    saving = b["data_s"] / ev.step_s
    spare = ev.cores is not None and ev.threads is not None and ev.cores > ev.workers * ev.threads
    dataset = ev.dataset
    remedy = rerun_command(ev, loader_workers=max(2, 2 * loaders))
    remedy += (
        " (batches prepared in worker processes while the step runs)"
        if spare
        else " needs spare cores to overlap: here the ranks take every core, so also make the dataset's "
        f"__getitem__ cheaper ({dataset}: decode and transform once, keep tensors in memory)"
    )
    return Finding(
        "data_wait",
        f"ranks wait for data {pct(ev.share('data_s'))} of every step",
        f"{_steps_text(ev)}; --loader-workers {loaders}; dataset {dataset}",
        "preparing a batch (reading, decoding, transforming samples) takes longer than the GPU/CPU needs to train on "
        "it, and it happens in the rank's own process, between steps",
        remedy,
        f"{speedup(saving)} if the data time is hidden entirely (data_s -> 0)",
        saving,
        rerun={"loader_workers": max(2, 2 * loaders)},
    )


def _stalls(ev: RunEvidence) -> tuple[int, float]:
    """Logging intervals slower than STALL_RATE x the median, and the time they lost."""
    steps = [e for e in ev.step_events if e.get("samples_per_s")]
    steps = steps[1:]  # the first interval includes warm-up (allocations, first kernels)
    if len(steps) < 4:
        return 0, 0.0
    median = statistics.median(e["samples_per_s"] for e in steps)
    lost, count = 0.0, 0
    previous = {e["step"]: e for e in ev.step_events}
    for e in steps:  # each has a step event before it: the first was dropped
        if e["samples_per_s"] < STALL_RATE * median:
            before = max(p for p in previous if p < e["step"])
            samples = e["samples"] - previous[before]["samples"]
            lost += samples / e["samples_per_s"] - samples / median
            count += 1
    return count, lost


def host_sync_stalls(ev: RunEvidence) -> Finding | None:
    if ev.is_script or not ev.breakdown:
        return None
    count, lost = _stalls(ev)
    train_s = sum(ev.epoch_times)
    stall_share = lost / train_s if train_s else 0.0
    if ev.share("other_s") < OTHER_SHARE and stall_share < STALL_SHARE:
        return None
    other = ev.breakdown["other_s"]
    log_every = int(ev.config.get("log_every") or 50)
    saving = max(ev.share("other_s"), stall_share)
    remedy = (
        "code change: do not read tensors on the host every step (loss.item(), .cpu(), print(tensor), "
        "if tensor: ...); keep running sums on the device and read them every N steps"
    )
    if log_every < 10:
        remedy = f"{rerun_command(ev, log_every=50)} (each log point reads the loss on the host); also: " + remedy
    return Finding(
        "host_sync_stalls",
        f"{pct(saving)} of the training time goes to host-side waits between the phases",
        f"other {ms(other)} of a {ms(ev.step_s)} step ({pct(ev.share('other_s'))}); {count} logging interval(s) below "
        f"{STALL_RATE:.0%} of the median samples/s, losing {lost:.2f} s of {train_s:.1f} s",
        "the host waits for the device or for Python work outside the measured phases: a synchronising read of a "
        "tensor, logging, or a slow callback every step",
        remedy,
        f"{speedup(saving)} if that time goes to training",
        saving,
        rerun={"log_every": 50} if log_every < 10 else None,
    )


def _monitored_states(ev: RunEvidence) -> list[dict[int, float]]:
    """CPU % per rank at each monitor instant (samples of all ranks grouped by their time)."""
    by_time: dict[float, dict[int, float]] = {}
    for rank, samples in ev.rank_samples.items():
        for s in samples:
            by_time.setdefault(round(s["time"], 1), {})[rank] = float(s["cpu_percent"])
    ranks = set(ev.rank_samples)
    return [v for _, v in sorted(by_time.items()) if set(v) == ranks]


def rank0_alone(ev: RunEvidence) -> Finding | None:
    states = _monitored_states(ev)
    if len(ev.rank_samples) < 2 or len(states) < 4:
        return None
    alone = [s for s in states if s[0] >= IDLE_CPU_PERCENT and all(v < IDLE_CPU_PERCENT for r, v in s.items() if r)]
    together = [s for s in states if all(v >= IDLE_CPU_PERCENT for v in s.values())]
    share = len(alone) / len(states)
    if share < ALONE_SHARE or len(together) / len(states) < ALONE_SHARE:
        return None
    n = len(ev.rank_samples)
    saving = share * (1 - 1 / n)
    return Finding(
        "rank0_alone",
        f"rank 0 works alone {pct(share)} of the time while the other {n - 1} rank(s) idle",
        f"{len(alone)} of {len(states)} monitor samples: rank 0 at {statistics.median(s[0] for s in alone):.0f} % CPU, "
        f"the others below {IDLE_CPU_PERCENT:.0f} %; all ranks busy in {len(together)} samples",
        "work only rank 0 does, typically evaluation (or checkpointing, logging) under `if rank == 0:` while the other "
        "ranks wait at the next collective",
        "code change: evaluate on every rank (a DistributedSampler over the test set, then all_reduce the sums of loss "
        "and correct predictions), or evaluate less often"
        + (f"; rerun with {rerun_command(ev)}" if ev.is_script else ""),
        f"{speedup(saving)}: the lone work split over {n} ranks takes 1/{n} of the time",
        saving,
    )


def straggler(ev: RunEvidence) -> Finding | None:
    """A rank that, sample after sample, burns more CPU than the others while they all run: the others
    are waiting for it. Noise (start-up, imports) makes every rank the busiest now and then; a
    straggler is the busiest far more often than any other rank."""
    states = [s for s in _monitored_states(ev) if all(v >= IDLE_CPU_PERCENT for v in s.values())]
    if len(ev.rank_samples) < 2 or len(states) < 4:
        return None
    ahead: dict[int, list[float]] = {r: [] for r in ev.rank_samples}  # per rank: others / it, when it leads
    for s in states:
        lead = max(s, key=s.get)
        others = statistics.median(v for r, v in s.items() if r != lead)
        if s[lead] >= STRAGGLER_RATIO * others:
            ahead[lead].append(others / s[lead])
    slow = max(ahead, key=lambda r: len(ahead[r]))
    share = len(ahead[slow]) / len(states)
    rest = max(len(v) for r, v in ahead.items() if r != slow)
    if share < STRAGGLER_SHARE or len(ahead[slow]) < max(STRAGGLER_MIN_SAMPLES, STRAGGLER_DOMINANCE * rest):
        return None
    ratio = statistics.mean(ahead[slow])
    saving = share * (1 - ratio)
    return Finding(
        "straggler",
        f"rank {slow} is a straggler: the others wait for it {pct(share)} of the time",
        f"in {len(ahead[slow])} of {len(states)} monitor samples with every rank running, rank {slow} used "
        f"{1 / ratio:.1f}x the CPU of the others (median); another rank led that way in at most {rest}",
        f"rank {slow} has more work or a slower core (uneven data shards, extra work under `if rank == {slow}`, "
        "another process on its core); synchronous training goes at the pace of the slowest rank",
        "code change: give every rank the same work (equal shards from a DistributedSampler, no rank-specific work in "
        f"the step); the per-rank CPU % is in {ev.path}/system.jsonl and on the report's timelines",
        f"{speedup(saving)} if rank {slow} did the others' amount of work in that time",
        saving,
    )


def evaluation_share(ev: RunEvidence) -> Finding | None:
    phases = ev.phases()
    train = sum(p.end - p.start for p in phases if p.kind == "train")
    evaluation = sum(p.end - p.start for p in phases if p.kind == "eval")
    if not train or evaluation / (train + evaluation) < EVAL_SHARE:
        return None
    saving = evaluation / (train + evaluation)
    idle = ""
    if ev.rank_samples or ev.gpu_samples:
        during = idle_fractions(ev, [p for p in phases if p.kind == "eval"])
        idle = "; idle during evaluation: " + ", ".join(f"{d} {pct(f)}" for d, f in during.items())
    return Finding(
        "evaluation_share",
        f"evaluation and checkpoints take {pct(saving)} of the run",
        f"{evaluation:.1f} s between epochs against {train:.1f} s of training over {len(ev.epochs)} epoch(s){idle}",
        "the held-out set is evaluated after every epoch, and its size is large next to the training set's",
        "evaluate a smaller held-out subset or every few epochs (code change; text workloads: --eval-samples)",
        f"{speedup(saving * 0.5)} if evaluation took half as long",
        saving * 0.5,
    )


def first_epoch_overhead(ev: RunEvidence) -> Finding | None:
    times = ev.epoch_times
    if len(times) == 1 and not ev.is_script:
        return Finding(
            "first_epoch_overhead",
            "the run's throughput includes start-up: it has a single epoch",
            f"one epoch of {times[0]:.2f} s; epoch_time_s and samples_per_s are that epoch's",
            "the first epoch pays for start-up (allocation, first kernels, caches, process-group set-up); a one-epoch "
            "timing mistakes that for the steady state",
            rerun_command(ev, epochs=2) + " (the summary then times the epochs after the first)",
            "none in training speed; a truthful steady-state figure",
            None,
            "advice",
            rerun={"epochs": 2},
        )
    if len(times) < 2:
        return None
    steady = steady_epoch_time(times)
    share = (times[0] - steady) / sum(times)
    if share < FIRST_EPOCH_SHARE:
        return None
    return Finding(
        "first_epoch_overhead",
        f"start-up costs {pct(share)} of the training time",
        f"first epoch {times[0]:.2f} s against {steady:.2f} s for the others ({times[0] / steady:.1f}x)",
        "start-up (compilation, allocator warm-up, caches filling) is paid once; short runs and timings that include "
        "the first epoch overstate the cost of training",
        "compare epoch_time_s (which excludes the first epoch), not wall time; longer runs amortise it",
        "none in steady-state speed; start-up shrinks relative to longer runs",
        None,
        "advice",
    )


def small_device_batch(ev: RunEvidence) -> Finding | None:
    grown = ev.grown_batch
    batch = (grown or {}).get("final_per_rank_batch") or ev.batch_size  # where a growing batch ended
    if ev.is_script or not batch or batch >= SMALL_BATCH:
        return None
    if grown and grown["kind"] == "adaptive" and grown.get("largest_per_rank_batch", batch) > batch:
        return None  # the run timed the larger per-rank batch itself and found it did not pay
    if grown:  # the per-rank limit kept it small: raise the limit, keep the schedule's start
        limit = max(SMALL_BATCH, 2 * (ev.batch_size or 1))
        change, flag = {"max_batch_size": limit}, f"--max-batch-size {grown.get('largest_per_rank_batch', batch)}"
    else:
        change, flag = {"batch_size": SMALL_BATCH}, f"--batch-size {batch}"
    larger = max(change.values()) / batch  # the per-rank batch it allows, against where it stayed
    return Finding(
        "small_device_batch",
        f"per-device batch {batch} is small (heuristic: below {SMALL_BATCH})",
        f"{flag} on {ev.workers} worker(s); no batch-size measurement in this run (heuristic, not measured)",
        "each step pays fixed costs (kernel launches, Python, the all-reduce) that a small batch does not amortise",
        f"{rerun_command(ev, **change)}; or measure the throughput knee with a sweep over batch_size",
        "not predicted (heuristic); measure it with a batch-size sweep",
        None,
        "advice",
        rerun=change,
        global_batch_factor=larger,
    )


def global_batch_sqrt_n(ev: RunEvidence) -> Finding | None:
    n_train = ev.resolved.get("train_samples")
    start = ev.global_batch_size
    grown = ev.grown_batch
    g = grown["final_global_batch"] if grown else start  # where a growing batch ended
    if not n_train or not g or g <= math.sqrt(n_train):
        return None
    made = f"{ev.replicas} replica(s) x {ev.batch_size}{f' x {ev.grad_accum} micro-steps' if ev.grad_accum > 1 else ''}"
    bound = int(math.sqrt(n_train))
    # Micro-steps beyond the bound's share of a replica go too: at a batch of 1 they alone would exceed it.
    accum = max(1, min(ev.grad_accum, bound // ev.replicas))
    per_worker = max(1, bound // (ev.replicas * accum))
    change: dict[str, Any] = {"batch_size": per_worker}
    if accum != ev.grad_accum:
        change["grad_accum"] = accum
    smaller = per_worker * ev.replicas * accum / g
    if grown and start and 2 * start <= math.sqrt(n_train):  # the schedule grew past it: cap the growth
        change = {"max_global_batch": int(math.sqrt(n_train))}
        smaller = int(math.sqrt(n_train)) / g
        made = f"--batch-schedule {grown['kind']} grew it from {start}, {made}"
    return Finding(
        "global_batch_sqrt_n",
        f"global batch {g} exceeds the sqrt(N) = {math.sqrt(n_train):.0f} guidance",
        f"global batch {g} ({made}) for N = {n_train:,} training samples; {math.ceil(n_train / g)} steps per epoch",
        "few, large steps per epoch: large batches generalise worse (Keskar et al. 2016) unless the LR is scaled and "
        "warmed up; HPC centres' rule of thumb keeps the global batch under sqrt(N)",
        rerun_command(ev, **change),
        "accuracy, not time (a rule of thumb, no number predicted); compare the held-out accuracy of both runs",
        None,
        "advice",
        rerun=change,
        global_batch_factor=smaller,
    )


def batch_growth_capped(ev: RunEvidence) -> Finding | None:
    """--batch-schedule adaptive stopped at --max-global-batch while the noise scale said a larger batch would
    still make use of its samples."""
    grown = ev.grown_batch
    if not grown or grown["kind"] != "adaptive":
        return None
    final, largest, noise = grown["final_global_batch"], grown["largest_global_batch"], grown.get("noise_scale")
    if final < largest or not noise or noise < 2 * final:
        return None
    # The cap's doublings, as far as the noise reaches: at least twice the cap (a power of two under the noise
    # fell short of that for caps off the powers of two, as 8 x a 3-rank batch is). Doubled in integers: a
    # logarithm of 31.999... rounds up to 5.
    raised = 2 * final
    while 2 * raised <= noise:
        raised *= 2
    return Finding(
        "batch_growth_capped",
        f"the adaptive batch stopped at the cap {largest} with the noise scale at {noise:.0f}",
        f"--batch-schedule adaptive grew the global batch from {grown['start_global_batch']} to {final}, "
        f"--max-global-batch; the gradient noise scale read {noise:.0f} at the end",
        "the cap stopped the growth, not the noise: a batch B needs 1 + B / B_noise times the fewest samples "
        "(McCandlish et al. 2018), so a batch below the noise scale wastes few of them",
        f"{rerun_command(ev, max_global_batch=raised)} (the schedule still grows only while the throughput it "
        "measures pays for the samples)",
        "not predicted: the throughput beyond the cap was not measured in this run; the schedule measures it as it "
        "grows",
        None,
        "advice",
        rerun={"max_global_batch": raised},
        global_batch_factor=raised / final,
    )


def no_warmup(ev: RunEvidence) -> Finding | None:
    if ev.is_script:
        return None
    g, ref = ev.resolved.get("global_batch_size"), ev.resolved.get("reference_batch_size")
    rule = ev.config.get("lr_scaling")
    if not g or not ref or rule == "none" or ev.config.get("warmup_epochs"):
        return None
    factor = g / ref if rule == "linear" else math.sqrt(g / ref)
    if factor < WARMUP_LR_FACTOR:
        return None
    epochs = int(ev.config.get("epochs") or 1)
    warmup = min(5.0, epochs / 4)
    return Finding(
        "no_warmup",
        f"the LR starts at {factor:.0f}x the base LR without warmup",
        f"global batch {g} against the base batch {ref}: --lr-scaling {rule} multiplied --lr {ev.config.get('lr')} by "
        f"{factor:.1f} from the first step; --warmup-epochs 0",
        "a large scaled LR applied to the untrained network diverges or lands in a worse region early (Goyal et al. "
        "2017 ramp it up over 5 epochs)",
        rerun_command(ev, warmup_epochs=warmup),
        "accuracy and stability, not time (Goyal et al.: with warmup, batch 8192 matched batch 256's accuracy)",
        None,
        "advice",
        rerun={"warmup_epochs": warmup},
    )


def contended(ev: RunEvidence) -> Finding | None:
    """Other work on the run's cores: over all of them (the launcher's reading), or on one rank's own cores (the
    monitor's), which slows that rank alone and makes every other rank wait for it. The caveat's share is the
    larger: the most of a step's waiting that the contention could explain (doctor.tempered)."""
    load, per_rank = ev.machine_load, ev.core_contention
    busiest = max(per_rank, key=per_rank.__getitem__, default=None)
    on_one = per_rank[busiest] if busiest is not None else 0.0
    if not load.contended and on_one <= CORE_CONTENDED_ABOVE:
        return None
    cores = ", ".join(f"rank {r}'s {pct(share)}" for r, share in per_rank.items())
    return Finding(
        "contended",
        f"other work took {pct(load.other_fraction or 0)} of the run's cores"
        + (f" and {pct(on_one)} of rank {busiest}'s" if on_one > (load.other_fraction or 0) else "")
        + ": its timings are unreliable",
        f"machine_load: {load.other_cpu_s or 0:.1f} CPU s of other work and {load.steal_s or 0:.1f} s stolen on "
        f"{load.cores} core(s) over {load.wall_s or 0:.1f} s"
        + (f"; per rank's own cores (the monitor's samples, less the rank's own processes): {cores}" if cores else ""),
        "another process (or the hypervisor) ran on the run's cores while it trained",
        "rerun when the machine is quiet, or measure with repeats: paratrain scale --repeats 3 ...",
        "unknown: the run's own speed could not be measured",
        None,
        "advice",
        share=max(load.other_fraction or 0.0, on_one),
    )


def idle_devices(ev: RunEvidence) -> Finding | None:
    """GPUs whose utilisation (NVML, sampled by the monitor) stayed low in a share of the run: a symptom,
    whose causes the other findings name with their gains."""
    idle = {
        label: share
        for label, share in idle_fractions(ev).items()
        if label.startswith("GPU") and share >= IDLE_DEVICE_SHARE
    }
    if not idle:
        return None
    samples = {i: len(s) for i, s in ev.gpu_samples.items()}
    return Finding(
        "idle_devices",
        f"{', '.join(idle)} idle {pct(max(idle.values()))} of the run",
        f"share of the monitor's samples with utilisation under {IDLE_CPU_PERCENT:.0f} %: "
        + ", ".join(f"{label} {pct(share)} of {samples[int(label.split()[1])]}" for label, share in idle.items()),
        "a GPU idles while its rank waits: for data, for another rank (evaluation or checkpoints on one rank, a "
        "straggler), for the host (syncs, Python between kernels), or at start-up and between epochs",
        "fix the findings with a predicted gain first, in their order; when none names a cause, launch the script "
        "under the probe (without --no-probe), or trace a few steps with torch.profiler and read them with Holistic "
        "Trace Analysis' idle-time breakdown",
        "not predicted: idle time is a symptom; the findings of its causes carry the gains",
        None,
        "advice",
    )


RUN_CHECKS: tuple[Callable[[RunEvidence], Finding | None], ...] = (
    contended,
    oversubscription,
    exposed_communication,
    data_wait,
    host_sync_stalls,
    straggler,
    rank0_alone,
    evaluation_share,
    first_epoch_overhead,
    small_device_batch,
    global_batch_sqrt_n,
    batch_growth_capped,
    no_warmup,
    idle_devices,
)
