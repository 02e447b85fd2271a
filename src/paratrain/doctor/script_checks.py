"""The doctor's checks on what the probe measured inside a launched script (summary.json `probe`).

A launched script has no paratrain training loop, so these read the probe's per-rank seconds per
optimizer step by phase (launch/probe.py) and the settings it saw (torch's threads, DataLoader
workers, DDP's). Each predicted gain is the step with the named phase changed as the remedy changes
it, every other phase as measured: a stated model on the measured breakdown, not a floor.
benchmarks/doctor_catalogue.py applies each remedy to a planted fault and measures the gain.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from paratrain.doctor.causes import _code_change, _steps_text
from paratrain.doctor.evidence import RunEvidence, rerun_command
from paratrain.doctor.expected import beyond_layers_s
from paratrain.doctor.finding import Finding, accumulation
from paratrain.doctor.script_collectives import COLLECTIVE_EVERY, script_collectives
from paratrain.formatting import ms, pct, speedup

DATA_SHARE = 0.15  # waiting for the next batch, of the step
COMM_SHARE = 0.20  # gradient all-reduce that backward did not hide, of the step
EXTRA_ROUNDS = 1.5  # all-reduce rounds per optimizer step above which accumulation is not skipping them
SYNCS_PER_STEP = 1.0  # host reads of device tensors per step (a loss printed every step is one)
SYNC_SHARE = 0.05  # what removing them would save, of the step, before it is named
EVAL_SHARE = 0.20  # evaluation, of the run's step time
CHECKPOINT_SHARE = 0.10  # torch.save, of the step
FIXED_STEP_SHARE = 0.5  # step time that does not grow with the batch, of the step
BATCH_TARGET_FIXED = 0.25  # the remedy's batch: the fewest doublings that bring a step's fixed costs under this
MAX_BATCH_FACTOR = 32
# Loader workers on the rank's own cores: below this predicted saving the model's error (the spread of the
# few steps run with the workers stopped) decides the sign, so nothing is said.
LOADER_MIN_SAVING = 0.02
DDP_OVERHEAD_SHARE = 0.05  # DDP's own forward work with find_unused_parameters=True, of the step...
# ...or this, when DDP found no unused parameter: a free remedy, named once the probe can tell its timed part (the
# graph search, a floor of the flag's cost) from its timing's noise. 1 % before: on an Intel Xeon VM the catalogue's
# 256-layer script searched for 0.56 ms of a 76 ms step (0.7 %), where an AMD EPYC had taken 0.6 of 37 ms.
DDP_OVERHEAD_SHARE_NONE_UNUSED = 0.001
# The remedies' settings, which the predictions assume.
EVAL_FRACTION = 8  # evaluate 1/8 of the held-out set (or every 8th time)
CHECKPOINT_EVERY = 100  # save every 100 steps


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else 0.0


def _step(ev: RunEvidence) -> float:
    return _mean([r["step_s"] for r in ev.probe_ranks])


def threads(ev: RunEvidence) -> Finding | None:
    """Torch's intra-op threads beyond the cores a rank has. Each rank measured the slow-down: of the
    model's own layers (copies timed at both thread counts) for forward and backward, and of a matrix
    product for the optimizer and evaluation (and for all four when no layer could be timed)."""
    ranks = [r for r in ev.probe_ranks if r.get("thread_penalty")]
    if not ranks:
        return None
    penalty = statistics.median(r["thread_penalty"] for r in ranks)
    layered = [r["layer_thread_penalty"] for r in ranks if r.get("layer_thread_penalty")]
    layer_penalty = statistics.median(layered) if layered else penalty
    used, fair = ranks[0]["threads"], ranks[0]["fair_threads"]
    compute = _mean([r["phases_s"]["forward"] + r["phases_s"]["backward"] for r in ranks])
    rest = _mean([r["phases_s"]["optimizer"] + r["phases_s"]["eval"] for r in ranks])
    saved = compute * (1 - 1 / layer_penalty) if layer_penalty > 1 else 0.0
    saved += rest * (1 - 1 / penalty) if penalty > 1 else 0.0
    saving = saved / _step(ev)
    slower = (
        f"the model's layers {layer_penalty:.1f}x slower, a matrix product {penalty:.1f}x"
        if layered
        else f"a matrix product {penalty:.1f}x slower (the model's layers could not be timed alone)"
    )
    launched_threads = ev.resolved.get("threads_per_worker")
    if used == launched_threads:  # launch gave these threads: its own flag is the remedy
        remedy = rerun_command(ev, threads_per_worker=fair, allow_oversubscribe=None)
    else:
        remedy = _code_change(
            f"the script sets {used} threads: drop its torch.set_num_threads({used}) (launch sets "
            f"OMP_NUM_THREADS to the rank's cores) or use torch.set_num_threads(len(os.sched_getaffinity(0)))",
            ev,
        )
    return Finding(
        "oversubscription",
        f"torch runs {used} threads on a rank that has {fair} core(s)",
        f"{_steps_text(ev)}; on {used} threads against {fair}, measured in each rank: {slower}",
        "threads beyond the cores time-slice: each parallel operator waits at its barrier for "
        "threads that are not running, so every multi-threaded phase slows down",
        remedy,
        f"{speedup(saving)}: forward and backward ({ms(compute)} a step) run {layer_penalty:.1f}x faster, "
        f"optimizer and evaluation ({ms(rest)}) {penalty:.1f}x, the rest as measured",
        saving,
        rerun={"threads_per_worker": fair, "allow_oversubscribe": None} if used == launched_threads else None,
        where=f"torch.set_num_threads({used})" if used != launched_threads else f"--threads-per-worker {used}",
        explains={
            **{
                p: _mean(ev.rank_phase(p)) * (1 - 1 / layer_penalty)
                for p in ("forward", "backward")
                if layer_penalty > 1
            },
            **{p: _mean(ev.rank_phase(p)) * (1 - 1 / penalty) for p in ("optimizer", "eval") if penalty > 1},
        },
    )


def data_wait(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    data, cpu = _mean(ev.rank_phase("data")), _mean([r["data_cpu_s"] for r in ranks])
    if not ranks or data / _step(ev) < DATA_SHARE:
        return None
    workers = max(int(r.get("loader_workers", 0)) for r in ranks)
    spare = all(r.get("cpu_affinity", 1) > r.get("threads", 1) for r in ranks)
    if workers and not spare and any(r.get("paused_steps") for r in ranks):
        return None  # the workers crowd the rank's cores: more would wait longer (loader_workers measured it)
    # Loader workers prepare batches while the step runs. The rank's waiting (reads) is hidden either
    # way; the CPU part (decoding) only where there are cores to spare: launch pins each rank and
    # its workers to the rank's cores.
    hidden = data if spare else max(0.0, data - cpu)
    saving = hidden / _step(ev)
    more = max(2, 2 * workers)
    return Finding(
        "data_wait",
        f"ranks wait for data {pct(data / _step(ev))} of every step",
        f"{_steps_text(ev)}; of the data time {ms(cpu)} is CPU in the rank's own thread, {ms(data - cpu)} waiting; "
        f"DataLoader workers: {workers}",
        "the next batch is read and prepared in the rank's own process between steps",
        _code_change(f"DataLoader(..., num_workers={more}, persistent_workers=True)", ev)
        + (
            ""
            if spare
            else "; the ranks' cores are all in use, so the CPU part stays: make __getitem__ cheaper "
            "(decode once, keep tensors in memory) to hide that too"
        ),
        f"{speedup(saving)}: the {'whole data time' if spare else 'waiting part of the data time'} ({ms(hidden)}) "
        "overlaps with the step",
        saving,
        where="the DataLoader (num_workers=0)" if not workers else f"the DataLoader (num_workers={workers})",
        explains={"data": hidden},
    )


def loader_workers(ev: RunEvidence) -> Finding | None:
    """DataLoader workers beyond what the rank's cores leave free after torch's threads. The probe runs the
    remedy's two halves in the run itself (launch/probe.py WorkerPause): a few steps' forward and backward
    with the workers stopped, and one batch prepared in the rank's own process. The remedy's step: forward
    and backward without that stall; the data phase (waiting for the workers' batches and receiving them)
    replaced by preparing the batches in the rank (num_workers=0), or, where the rank has cores its threads
    leave free, by workers on those cores only, hidden while they keep up."""
    ranks = [
        r
        for r in ev.probe_ranks
        if r.get("paused_steps") and (r.get("inline_load_s") is not None or r.get("loader_cpu_per_batch_s") is not None)
    ]
    if not ranks:
        return None
    step, data = _step(ev), _mean(ev.rank_phase("data"))
    micro = _mean([r["micro_per_step"] for r in ranks])
    running, stopped = _mean([r["fb_per_micro_s"] for r in ranks]), _mean([r["paused_fb_per_micro_s"] for r in ranks])
    stall = micro * _mean([max(0.0, r["fb_per_micro_s"] - r["paused_fb_per_micro_s"]) for r in ranks])
    inline = [r["inline_load_s"] for r in ranks if r.get("inline_load_s") is not None]
    worker_cpu = [r["loader_cpu_per_batch_s"] for r in ranks if r.get("loader_cpu_per_batch_s") is not None]
    # Preparing a batch in the rank costs what it costs the workers where it could not be timed in the rank.
    load = micro * _mean(inline or worker_cpu)
    threads, cores = ranks[0].get("threads", 1), ranks[0].get("cpu_affinity", 1)
    workers = max(int(r.get("loader_workers", 0)) for r in ranks)
    spare = max(0, cores - threads)
    busy = step - data - stall
    if spare:
        per_batch = micro * _mean(worker_cpu or inline)
        fixed = max(busy + _mean([r["data_cpu_s"] for r in ranks]), per_batch / spare)
        change, how = f"num_workers={spare}", f"{spare} worker(s) on the core(s) torch's threads leave free"
    else:
        fixed = busy + load
        change, how = "num_workers=0", f"preparing the batch in the rank ({ms(load)} a step, timed in the run)"
    saving = 1 - fixed / step
    if saving < LOADER_MIN_SAVING:
        return None
    measured = (
        f"one batch prepared in the rank's own process took {ms(_mean(inline))}"
        if inline
        else "a batch could not be prepared in the rank (an iterable dataset), so the workers' CPU per batch stands "
        "for it"
    )
    return Finding(
        "loader_workers",
        f"{workers} DataLoader workers per rank share its {cores} core(s) with torch's {threads} thread(s)",
        f"{_steps_text(ev)}; with the workers stopped (in {min(r['paused_steps'] for r in ranks)} steps a rank) "
        f"forward and backward took {ms(stopped)} a micro-step against {ms(running)}; {measured}; the workers spent "
        f"{ms(_mean(worker_cpu)) if worker_cpu else 'an unknown CPU time'} of CPU on each batch",
        "the workers run on the cores the rank's threads compute on: each time slice they take stalls those threads, "
        "and receiving their batches costs the rank a wait and a copy, more than preparing the batch itself",
        _code_change(
            f"DataLoader(..., {change}): launch gives each rank its share of the cores, and the workers "
            "share them; more workers pay off only with cores to spare (fewer ranks per machine)",
            ev,
        ),
        f"{speedup(saving)}: forward and backward {ms(stall)} a step shorter, the data phase ({ms(data)}) replaced by "
        f"{how}, the rest as measured",
        saving,
        where=f"DataLoader(num_workers={workers})",
        explains={"data": data, "forward": stall},
    )


def exposed_communication(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    if len(ranks) < 2 or not all(r.get("ddp") for r in ranks):
        return None
    # The all-reduce's own time: the waits for a late rank are the straggler check's business.
    comm, step = ev.all_reduce_s, _step(ev)
    rounds = _mean([r["rounds_per_step"] for r in ranks])
    if comm / step < COMM_SHARE or rounds > EXTRA_ROUNDS:
        return None
    # k micro-steps under no_sync() share one all-reduce and one optimizer step (the built-in check's model).
    optimizer = _mean(ev.rank_phase("optimizer"))
    k, new_step, saving = accumulation(step - comm - optimizer, optimizer, comm)
    gbytes = ranks[0].get("gradient_bytes", 0)
    return Finding(
        "exposed_communication",
        f"{pct(comm / step)} of every step is the gradient all-reduce that backward did not hide",
        f"{_steps_text(ev)}; {gbytes / 2**20:.1f} MiB of gradients all-reduced per step",
        "the all-reduce costs the same whatever the batch, and this batch's backward is too short to hide it",
        _code_change(
            f"accumulate {k} micro-steps per optimizer step, the first {k - 1} under `with model.no_sync():` "
            f"(or a {k}x larger per-rank batch if it fits), the LR scaled with the global batch",
            ev,
        ),
        f"{speedup(saving)} per sample: {k} micro-steps share one all-reduce ({ms(new_step)} per {k} "
        f"micro-steps against {ms(k * step)})",
        saving,
        where="DistributedDataParallel's gradient all-reduce",
        explains={"comm": comm},
        global_batch_factor=k,
    )


def small_batch(ev: RunEvidence) -> Finding | None:
    """A step that hardly grows with the batch: per-call overheads, the all-reduce of the same gradients
    and the optimizer, paid once per step, outweigh the samples' work. The probe timed the model's own
    layers at the script's batch and at a larger one (launch/probe.py batch_slope): that slope, the data
    and evaluation per step are the part that grows."""
    ranks = [r for r in ev.probe_ranks if r.get("batch_slope_s") is not None and r.get("samples_per_step")]
    if not ranks:
        return None
    step = _step(ev)
    samples = _mean([r["samples_per_step"] for r in ranks])
    batch = _mean([r["samples_per_step"] / max(r.get("micro_per_step", 1), 1) for r in ranks])
    compute = _mean([r["phases_s"]["forward"] + r["phases_s"]["backward"] for r in ranks])
    growing_compute = min(compute, _mean([r["batch_slope_s"] for r in ranks]) * samples)
    # What a k times larger batch multiplies: the samples' compute, their loading, and evaluation per
    # step (an epoch has k times fewer steps). The rest (per-call overheads, the all-reduce of the same
    # gradients, the optimizer) is paid once per step whatever the batch.
    grows = growing_compute + _mean(ev.rank_phase("data")) + _mean(ev.rank_phase("eval"))
    # Forward and backward far beyond the layers alone are no fixed cost of a step: a mode or dtype that slows
    # every operator (doctor/expected.py), which a larger batch would not share out. Nor is a wait for another
    # rank (in the all-reduce, in the script's collectives, beyond their own time): it lasts as long as that
    # rank's work runs over, which grows with its batch, so the gain is that of the step without the waits (on a
    # contended machine a rank on a busy core made the others wait most of the step, and a 2-sample batch read as
    # 6.8x to gain where the fix gained 1.05x: benchmarks/doctor_heldout2, half busy).
    waits = _waiting(ev)
    step -= waits
    fixed = step - grows - beyond_layers_s(ev)
    if compute <= 0 or step <= 0 or fixed / step < FIXED_STEP_SHARE:
        return None
    # No further than the probe timed the layers: the slope holds between its two batches.
    largest = max(
        2, min(MAX_BATCH_FACTOR, *(r["batch_slope_between"][1] // r["batch_slope_between"][0] for r in ranks))
    )
    k = 2
    while fixed / (step + (k - 1) * grows) > BATCH_TARGET_FIXED and 2 * k <= largest:
        k *= 2
    new_step = step + (k - 1) * grows
    saving = 1 - new_step / (k * step)
    return Finding(
        "small_batch",
        f"{batch:.0f} samples per rank per step are too few to keep the rank busy: "
        f"{pct(fixed / step)} of the step does not grow with the batch",
        f"{_steps_text(ev)}; forward and backward of the model's layers grow by {ms(growing_compute / samples)} per "
        f"sample (timed at {' and '.join(map(str, ranks[0].get('batch_slope_between', [])))} samples), "
        f"{ms(growing_compute)} of their {ms(compute)} a step",
        "per-call overheads (operator dispatch, Python, DDP's hooks), the all-reduce of the same gradients and the "
        "optimizer step are paid once per step whatever the batch",
        _code_change(
            f"batch_size={k * batch:.0f} per rank ({k}x), the learning rate scaled {k}x with a warm-up "
            "(Goyal et al. 2017); or accumulate micro-batches if memory is short",
            ev,
        ),
        f"{speedup(saving)} per sample: a step of {k * batch:.0f} samples takes {ms(new_step)} against "
        f"{ms(k * step)} for {k} steps now"
        + (
            f" (both without the {ms(waits)} a step the ranks wait for each other, which grows alike)"
            if waits >= 0.0005
            else ""
        ),
        saving,
        where=f"batch_size={batch:.0f} per rank",
        # the step's fixed part: per-call overheads in forward and backward, the all-reduce, the optimizer
        explains={"optimizer": _mean(ev.rank_phase("optimizer")), "comm": _mean(ev.rank_phase("comm"))},
        global_batch_factor=k,
    )


def _waiting(ev: RunEvidence) -> float:
    """A step's waits for other ranks: the all-reduce's and the script's collectives' time beyond their own (in
    each step the least any rank spent in them, launch/probe_summary.py own_time_s), averaged over the ranks."""
    comm = _mean(ev.rank_phase("comm")) - ev.all_reduce_s
    collective = _mean(ev.rank_phase("collective")) - ev.collective_own_s
    return max(0.0, comm) + max(0.0, collective)


def all_reduce_every_micro_step(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    rounds = _mean([r["rounds_per_step"] for r in ranks])
    micro = _mean([r["micro_per_step"] for r in ranks])
    if len(ranks) < 2 or rounds <= EXTRA_ROUNDS:
        return None
    comm, step = ev.all_reduce_s, _step(ev)
    # Without the rounds before the last, their exposed all-reduce goes.
    saving = comm * (1 - 1 / rounds) / step
    return Finding(
        "no_sync_missing",
        f"gradients are all-reduced {rounds:.0f} times per optimizer step",
        f"{_steps_text(ev)}; {micro:.0f} forward/backward micro-steps and {rounds:.0f} all-reduce rounds per "
        "optimizer step",
        "gradient accumulation without `no_sync()`: DDP all-reduces after every backward, "
        "although only the last micro-step's averages are used",
        _code_change(
            "wrap every micro-step but the last in `with model.no_sync():` (torch's DDP idiom; "
            "Lightning and Accelerate do it for you)",
            ev,
        ),
        f"{speedup(saving)}: {rounds - 1:.0f} of {rounds:.0f} exposed all-reduces ({ms(comm)} a step) go",
        saving,
        where="the micro-steps before the last, outside model.no_sync()",
        explains={"comm": comm * (1 - 1 / rounds)},
    )


def host_syncs(ev: RunEvidence) -> Finding | None:
    """Host reads of device tensors every step (the probe counts them on GPUs, and times how long the host
    waited inside them). Each drains the device's queue, and the device then idles until the host has
    queued more. Where the probe recorded the device's own phase times (CUDA events), the model: without
    the reads the host queues ahead, so a step takes the longer of the host's own work (the step less its
    waits in the reads) and the device's phases; without device times, the count and the remedy only."""
    syncs = _mean([r.get("syncs_per_step", 0.0) for r in ev.probe_ranks])
    if syncs < SYNCS_PER_STEP:
        return None
    step, wait = _step(ev), _mean([r.get("sync_wait_s", 0.0) for r in ev.probe_ranks])
    timed = [r for r in ev.probe_ranks if r.get("device_phases_s")]
    evidence = (
        f"{_steps_text(ev)}; {syncs:.1f} reads of device tensors on the host per step (.item(), .tolist(), "
        f".cpu(), .numpy(), torch.cuda.synchronize), {ms(wait)} a step waiting in them"
    )
    cause = (
        "each read waits until the device has run everything queued before it; the device then idles until the "
        "host has queued the next work, so the host's Python time stops hiding"
    )
    remedy = _code_change(
        f"keep running values on the device (loss_sum += loss.detach()) and read them every "
        f"{COLLECTIVE_EVERY} steps; no .item() in the step's path",
        ev,
    )
    if not timed:
        return Finding(
            "host_syncs",
            f"{syncs:.0f} host-device synchronisations every step",
            evidence,
            cause,
            remedy,
            "not predicted: the device's own phase times (CUDA events) were not recorded",
            None,
            "advice",
            where=".item(), .tolist(), .cpu(), .numpy() or torch.cuda.synchronize() in the step",
            explains={"other": wait},
        )
    device = _mean([sum(r["device_phases_s"].values()) for r in timed])
    new_step = max(step - wait, device)
    saving = 1 - new_step / step
    if saving < SYNC_SHARE:
        return None
    return Finding(
        "host_syncs",
        f"{syncs:.0f} host-device synchronisations every step cost {pct(saving)} of it",
        evidence + f"; the device's phases took {ms(device)} a step (CUDA events)",
        cause,
        remedy,
        f"{speedup(saving)}: the host ({ms(step - wait)} of its own work a step) queues ahead of the device "
        f"({ms(device)}), so a step takes the longer of the two, {ms(new_step)}, against {ms(step)}",
        saving,
        where=".item(), .tolist(), .cpu(), .numpy() or torch.cuda.synchronize() in the step",
        explains={"other": wait},
    )


def evaluation(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    evals = ev.rank_phase("eval")
    step, n = _step(ev), len(ranks)
    if not ranks or max(evals) / step < EVAL_SHARE:
        return None
    # What evaluation costs the run: the steps that hold one take longer than plain steps by more than the
    # evaluation itself (cold caches, ranks meeting unevenly after it); the remedy shrinks all of that.
    costs = [max(e, r.get("eval_excess_s", 0.0)) for e, r in zip(evals, ranks)]
    alone = n > 1 and sorted(evals)[-2] < 0.1 * max(evals)
    if alone:
        who = max(range(n), key=lambda i: evals[i])
        # Sharded, each rank evaluates 1/n of the set: the step loses (n-1)/n of the lone rank's evaluation.
        saving = costs[who] * (1 - 1 / n) / step
        return Finding(
            "rank0_alone",
            f"rank {ranks[who]['rank']} evaluates alone, {pct(max(evals) / step)} of the time, "
            f"while the other {n - 1} rank(s) wait",
            f"{_steps_text(ev)}; evaluation per step by rank: "
            + ", ".join(ms(e) for e in evals)
            + f"; the steps that hold it take {ms(costs[who])} a step more than plain steps",
            "evaluation under `if rank == 0:`: the other ranks wait at the next collective",
            _code_change(
                "evaluate on every rank: a DistributedSampler over the held-out set, then all_reduce the "
                "sums of loss and correct predictions",
                ev,
            ),
            f"{speedup(saving)}: the evaluation split over {n} ranks takes 1/{n} of the time",
            saving,
            where=f"evaluation on rank {ranks[who]['rank']} only",
            explains={"eval": _mean(evals)},
        )
    share = _mean(evals) / step
    saving = _mean(costs) / step * (1 - 1 / EVAL_FRACTION)
    return Finding(
        "evaluation_share",
        f"evaluation takes {pct(share)} of the run",
        f"{_steps_text(ev)}; evaluation {ms(_mean(evals))} per training step on every rank, and the steps that hold "
        f"one take {ms(_mean(costs))} a step more than plain steps",
        "the held-out set is large against the training done between two evaluations",
        _code_change(
            f"evaluate 1/{EVAL_FRACTION} of the held-out set (a fixed random subset), or every {EVAL_FRACTION}th time",
            ev,
        ),
        f"{speedup(saving)}: evaluation takes 1/{EVAL_FRACTION} of its time",
        saving,
        where="evaluation in the training loop",
        explains={"eval": _mean(evals)},
    )


def checkpoints(ev: RunEvidence) -> Finding | None:
    ranks = ev.probe_ranks
    saves = ev.rank_phase("checkpoint")
    step = _step(ev)
    if not ranks or max(saves) / step < CHECKPOINT_SHARE:
        return None
    saver = ranks[max(range(len(ranks)), key=lambda i: saves[i])]
    every = saver["steady_steps"] / max(1, saver["checkpoint_steps"])
    new_every = max(CHECKPOINT_EVERY, 10 * every)
    # The slowest rank sets the pace: the saver's checkpoint time per step shrinks by every / new_every.
    saving = max(saves) * (1 - every / new_every) / step
    return Finding(
        "checkpoint_share",
        f"checkpoints take {pct(max(saves) / step)} of every step on rank {saver['rank']}",
        f"{_steps_text(ev)}; torch.save on {saver['checkpoint_steps']} of {saver['steady_steps']} steps "
        f"(every {every:.0f})",
        "a full model and optimizer state written every few steps; the other ranks wait for "
        "the saving rank at the next collective",
        _code_change(f"save every {new_every:.0f} steps (or use torch.distributed.checkpoint.async_save)", ev),
        f"{speedup(saving)}: {new_every / every:.0f}x fewer saves",
        saving,
        where=f"torch.save every {every:.0f} steps",
        explains={"checkpoint": _mean(saves)},
    )


def find_unused_parameters(ev: RunEvidence) -> Finding | None:
    """find_unused_parameters=True: DDP searches the autograd graph after every forward (the probe times
    DDP's forward beyond the wrapped model's), marks each parameter used in backward and all-reduces that
    map. Only the search is timed: the prediction is that part alone. When DDP saw no unused parameter
    (its own logging data, read by the probe) the flag is pure cost and even a small share is named;
    when some were unused the flag is needed and nothing is said."""
    ranks = [r for r in ev.probe_ranks if r.get("find_unused_parameters")]
    if not ranks:
        return None
    unused = [r.get("unused_parameter_bytes") for r in ranks]
    if any(u for u in unused):
        return None
    none_unused = all(u == 0 for u in unused)
    overhead, step = _mean([r["ddp_overhead_s"] for r in ranks]), _step(ev)
    if overhead / step < (DDP_OVERHEAD_SHARE_NONE_UNUSED if none_unused else DDP_OVERHEAD_SHARE):
        return None
    saving = overhead / step
    return Finding(
        "find_unused_parameters",
        f"DDP searches the autograd graph every step: {pct(saving)} of the step",
        f"{_steps_text(ev)}; DDP's forward took {ms(overhead)} beyond the wrapped model's with "
        "find_unused_parameters=True" + ("; DDP found no unused parameter (its logging data)" if none_unused else ""),
        "with find_unused_parameters=True DDP walks the autograd graph after every forward to find parameters that "
        "get no gradient, marks the used ones in backward and all-reduces that map every step",
        _code_change(
            "DistributedDataParallel(model, find_unused_parameters=False) when every parameter is used "
            "in every step (torch then errors if one is not, naming it)",
            ev,
        ),
        f"{speedup(saving)}: DDP's graph search in forward ({ms(overhead)}) goes; the marking in backward and the "
        "map's all-reduce also go, but are not timed, so the gain may be larger",
        saving,
        where="DistributedDataParallel(find_unused_parameters=True)",
        explains={"ddp_forward": overhead},
    )


SCRIPT_CHECKS: tuple[Callable[[RunEvidence], Finding | None], ...] = (
    threads,
    data_wait,
    loader_workers,
    exposed_communication,
    small_batch,
    all_reduce_every_micro_step,
    script_collectives,
    host_syncs,
    evaluation,
    checkpoints,
    find_unused_parameters,
)


def probe_status(ev: RunEvidence) -> Finding | None:
    """A launched script whose probe fell back, was off, left no records, or wrote no trace of its profiled
    steps: say what the diagnosis rests on, and what is missing."""
    probe: dict[str, Any] = ev.probe
    if not ev.is_script:
        return None
    status = probe.get("status")
    if status == "on":
        return _trace_missing(ev)
    return Finding(
        "probe_off",
        f"no step breakdown: the probe is {status or 'missing'}",
        probe.get("reason", "")
        or ("summary.json holds no probe block: a run whose ranks ended before writing it" if status is None else ""),
        "the findings rest on the monitor's samples and wall time only",
        rerun_command(ev) + " (without --no-probe)"
        if status in ("off", None)
        else "report the fallback's error; the run itself is unaffected",
        "none: a measurement note",
        None,
        "advice",
    )


def _trace_missing(ev: RunEvidence) -> Finding | None:
    """The probe ran but wrote no trace of its profiled steps: the findings that name operators and lines of
    code have none to read. A script that profiles itself is told what its profiler costs it."""
    reasons = {r["rank"]: r["trace_missing"] for r in ev.probe_ranks if r.get("trace_missing") and not r.get("trace")}
    if not reasons:
        return None
    own = any("torch.profiler itself" in reason for reason in reasons.values())
    return Finding(
        "trace_missing",
        "no trace of the profiled steps: "
        + ("the script runs torch.profiler itself" if own else "torch.profiler failed")
        + ", so no finding can name the operators or lines of code its time went to",
        "; ".join(f"rank {rank}: {reason}" for rank, reason in sorted(reasons.items())),
        "a profiler left on records every operator (and with with_stack, every Python call) of the steps it covers, "
        "slowing them"
        if own
        else "torch.profiler raised while recording or writing the trace",
        f"code change in {ev.config.get('script', 'the script')}: remove the script's profiler (or its schedule) once "
        "done profiling, then run the doctor again"
        if own
        else "run the doctor again; if it recurs, report the error above",
        "none: a measurement note",
        None,
        "advice",
    )
