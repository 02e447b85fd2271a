"""The rank-side probe: where the time of an unmodified training script goes, step by step.

`paratrain launch` (and `scale --script`, and sweep `--script` trials) start each rank of a Python
script as `python probe.py script.py ...` (`command()`) instead of `python script.py ...`: it installs the
probe, then runs the script as `__main__`, with its
own argv and sys.path[0], the way the interpreter would. Nothing is imported before the script
runs: the hooks go in when the script itself imports torch (a post-import hook), so a script that
sets OMP_NUM_THREADS (or anything else) before `import torch` behaves exactly as without the probe.
That is also why this file uses the standard library only at module level, and runs by its path,
never through the paratrain package, whose import would pull in torch first.

What it hooks, all at the torch level, so DDP, FSDP2, a bare model and frameworks on top
(Lightning, Accelerate) are seen alike:
    optimizer step   torch.optim's global step pre/post hooks: the step boundary, and its own time
    data             DataLoader iterators' __next__ (the wait for the next batch)
    forward          the outermost nn.Module call; a call without grad, or of a module in eval mode, is
                     evaluation. Global module hooks find the outermost modules in the first steps; then
                     only those keep hooks (a global hook costs every module call 5-9 us, 13 % of the step
                     of a model of 256 small layers), and a module switched to eval later is added
    backward         torch.autograd.backward (what loss.backward() calls)
    communication    collectives called from Python (torch.distributed.*, Work.wait: FSDP2's and the
                     script's own) and, for DDP, the tail of backward after its last gradient bucket
                     was handed to the all-reduce (a timed copy of DDP's default all-reduce hook):
                     the communication backward did not hide. No host synchronisation is added.
    checkpoint       torch.save
    host syncs       counted, not timed: Tensor.item/.tolist/.cpu/.numpy of a GPU tensor and
                     torch.cuda.synchronize (each drains the device's queue)
Time is charged exclusively to the innermost phase (a forward inside Lightning's optimizer closure
is forward, not optimizer); what no phase claims is `other` (Python, logging, host reads).

Each rank appends JSON lines to RUN_DIR/probe/rank<R>.jsonl: a `state` record when what it saw
changes (torch's threads, DataLoader workers, DDP's settings), a `step` record per optimizer step
(seconds per phase, samples, all-reduce rounds), and a `fallback` record if a hook ever failed:
the probe then steps aside for the rest of the run and the script goes on untouched.
launch/probe_summary.py turns the files into summary.json's `breakdown` and `probe` blocks.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import runpy
import signal
import statistics
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

RUN_DIR_ENV = "PARATRAIN_RUN_DIR"
# `collective`: a collective the script itself calls between the phases (a loss averaged for a log
# line, a barrier); `comm`: one inside forward or backward (FSDP2's, DDP's exposed tail).
PHASES = ("data", "forward", "backward", "comm", "collective", "optimizer", "eval", "checkpoint", "other")
# A per-device batch this small or smaller gets its forward and backward timed at a larger batch once
# (the small-batch check's measured slope), on copies of the model's own layers.
SMALL_BATCH = 16
CALIBRATION_STEP = 3  # after warm-up: the first steps allocate and fill caches
# After this many steps (and the calibration, if any) the global module hooks give way to hooks on the
# outermost modules seen so far.
NARROW_AFTER_STEP = CALIBRATION_STEP
# The larger batch, as a multiple of the script's; the doctor predicts no further than it measured
# (a layer bound by reading its weights at a small batch becomes bound by arithmetic at a large one).
CALIBRATION_FACTOR = 16
# Host reads of a device tensor wait for the device's queue to drain: a host-device synchronisation.
# They are counted on this device type (a CUDA build's GPU; tests name "cpu" as a stand-in, since a
# CPU tensor's read is no sync at all). HOST_READS are the Tensor methods that read values on the host.
SYNC_DEVICE_ENV = "PARATRAIN_PROBE_SYNC_DEVICE"
HOST_READS = ("item", "tolist", "cpu", "numpy")
# On GPU ranks the phases' host times are the time to launch their kernels; CUDA events recorded at the
# outermost phase boundaries give the device's own. Tests name "cpu" here for a host-clock stand-in.
DEVICE_EVENTS_ENV = "PARATRAIN_PROBE_DEVICE_EVENTS"
DEVICE_PHASES = ("forward", "backward", "optimizer", "eval")
# DataLoader workers that share the rank's cores with torch's threads: in a few steps the rank's workers are
# stopped from the batch's arrival to the next fetch (or the step's end), so forward and backward run as
# they would without them: the first after warm-up, then every PAUSE_EVERY steps, PAUSES times in all.
PAUSE_FIRST_STEP = 10
PAUSE_EVERY = 16
PAUSES = 12
FLUSH_EVERY_S = 1.0  # buffered lines reach the file at least this often (a killed rank loses less)
# Collectives a script (or FSDP2, or Lightning) calls from Python. A blocking call is exposed
# communication; an async one is counted when its Work is waited for.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "monitored_barrier",
)


def _first_len(value: Any, torch: Any, depth: int = 0) -> int | None:
    """The leading dimension of the first tensor in a batch (a tensor, or a tuple, list or dict of them)."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else None
    if depth > 3:
        return None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            n = _first_len(item, torch, depth + 1)
            if n is not None:
                return n
    return None


def fair_threads() -> int:
    """The threads a rank can run without oversubscribing: its cores, and its share of the machine's
    when the ranks are not pinned (every rank may use every core)."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(len(os.sched_getaffinity(0)), (os.cpu_count() or 1) // local_ranks))


def thread_penalty(torch: Any, threads: int, fair: int, size: int = 192, repeats: int = 5) -> float:
    """How much slower a matrix product runs on `threads` threads than on `fair` ones, here and now:
    the oversubscription check's measured slow-down (the median of `repeats` rounds of 8 products each,
    about 10 ms in all on a free core)."""
    a = torch.randn(size, size)

    def best(n: int) -> float:
        torch.set_num_threads(n)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(8):
                torch.mm(a, a)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    try:
        best(fair)  # warm-up: first-call allocations
        return best(threads) / best(fair)
    finally:
        torch.set_num_threads(threads)


class LayerTwins:
    """Copies of the model's own leaf layers, with the inputs they got in one training step, timed
    (forward and backward) under a changed condition: a larger batch (the small-batch check's slope),
    other thread counts (the oversubscription check's slow-down). Layers that cannot run alone
    (keyword inputs, sharded parameters) are left out. Randomness is restored after each timing, so
    the script's random stream is unchanged."""

    def __init__(self, torch: Any, layers: list[tuple[Any, tuple[Any, ...]]], batch: int):
        import copy

        self.torch, self.batch, self.twins = torch, batch, []
        for layer, args in layers:
            try:
                self.twins.append((copy.deepcopy(layer), args))
            except Exception:
                continue
        self.cuda = torch.cuda.is_available() and any(
            isinstance(a, torch.Tensor) and a.is_cuda for _, args in self.twins for a in args
        )

    def _grown(self, args: tuple[Any, ...], k: int) -> tuple[Any, ...]:
        torch = self.torch
        return tuple(
            torch.cat([a] * k) if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == self.batch else a
            for a in args
        )

    def _once(self, layer: Any, args: tuple[Any, ...]) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        started = time.perf_counter()
        out = layer(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(out, self.torch.Tensor) and out.requires_grad:
            out.float().sum().backward()
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - started

    def seconds(self, grow: int = 1, threads: int | None = None, repeats: int = 3) -> float:
        """Forward and backward of every layer that runs, the batch `grow` times larger, on `threads`
        threads: each layer warmed up once (a new shape allocates and picks kernels), then the median."""
        torch, total = self.torch, 0.0
        before, rng = torch.get_num_threads(), torch.get_rng_state()
        try:
            if threads is not None:
                torch.set_num_threads(threads)
            for layer, args in self.twins:
                try:
                    grown = self._grown(args, grow)
                    self._once(layer, grown)
                    total += statistics.median(self._once(layer, grown) for _ in range(repeats))
                except Exception:
                    continue
        finally:
            torch.set_num_threads(before)
            torch.set_rng_state(rng)
        return total

    def batch_slope(self, factor: int = CALIBRATION_FACTOR) -> float | None:
        """Seconds of forward and backward per extra sample, between the script's batch and `factor`
        times it. A step's fixed costs (per-call dispatch, the optimizer, the all-reduce) stay; this is
        what grows. None when no layer could be timed."""
        small, large = self.seconds(), self.seconds(grow=factor)
        return None if large <= 0 else max(0.0, (large - small) / ((factor - 1) * self.batch))

    def thread_penalty(self, threads: int, fair: int) -> float | None:
        """How much slower the layers run on `threads` threads than on `fair`."""
        slow, fast = self.seconds(threads=threads), self.seconds(threads=fair)
        return None if fast <= 0 else slow / fast


class WorkerPause:
    """What a rank's DataLoader workers cost it when they share its cores, measured in the run itself.

    The counterfactual "no workers on these cores" is run for real: in a few steps the workers of the
    iterator that delivered the step's first batch are stopped (SIGSTOP) from that batch's arrival until
    the next fetch or the step's end, and the forward and backward time of the micro-steps begun in
    between is kept apart. Stopping them is safe: the batches they prefetched (2 per worker by default)
    stay in the queue, a later fetch resumes them first (the rank never waits on a stopped worker), and
    the step's end, a hook failure and the interpreter's exit all resume them. The workers' own CPU time
    (/proc/<pid>/stat) per batch is what their loading would cost inside the rank without them.
    Only where torch's threads and the workers outnumber the rank's cores: elsewhere nothing is stopped."""

    def __init__(self) -> None:
        self.stopped: list[int] = []
        self.batches: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.due = False
        self.taken = 0

    def count(self, iterator: Any) -> None:
        try:
            self.batches[iterator] = self.batches.get(iterator, 0) + 1
        except TypeError:  # an iterator that cannot be weakly referenced is not measured
            pass

    @staticmethod
    def cpu_s(pids: list[int]) -> float | None:
        """User and system CPU seconds of these processes so far; None where /proc cannot tell."""
        total = 0
        try:
            for pid in pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            return None
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self, iterator: Any, threads: int, cores: int) -> dict[str, Any] | None:
        """At a due step's first batch: stop the iterator's workers when they crowd the rank's cores, and
        return the reading that goes into the step record (workers' CPU so far, batches delivered)."""
        self.due = False
        workers = getattr(iterator, "_workers", None) or []
        pids = [w.pid for w in workers if getattr(w, "pid", None)]
        if not pids or threads + len(pids) <= cores or iterator not in self.batches:
            return None
        cpu = self.cpu_s(pids)
        if cpu is None:
            return None
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                self.stopped.append(pid)
            except OSError:
                pass
        self.taken += 1
        return {"loader_id": id(iterator), "loader_cpu_s": round(cpu, 3), "loader_batches": self.batches[iterator]}

    def inline_load_s(self, iterator: Any, batch: int, torch: Any) -> float | None:
        """Seconds to prepare one batch of `batch` samples in the rank's own process, as the remedy
        (num_workers=0) would: the iterator's own dataset and collate function on fixed indices, timed
        while the workers are stopped. Every random stream is restored, so the script's data and
        augmentation are unchanged. None for an iterable dataset (no index to fetch) or any error."""
        dataset, collate = getattr(iterator, "_dataset", None), getattr(iterator, "_collate_fn", None)
        if (
            dataset is None
            or collate is None
            or batch <= 0
            or not getattr(iterator, "_auto_collation", False)
            or isinstance(dataset, torch.utils.data.IterableDataset)
        ):
            return None
        import random

        numpy = sys.modules.get("numpy")
        states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state() if numpy else None)
        started = time.perf_counter()
        try:
            size = len(dataset)
            indices = [(self.taken * batch + j) % size for j in range(batch)]
            fetch_many = getattr(dataset, "__getitems__", None)
            collate(fetch_many(indices) if fetch_many else [dataset[i] for i in indices])
            return time.perf_counter() - started
        except Exception:
            return None
        finally:
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            if numpy:
                numpy.random.set_state(states[2])

    def resume(self) -> None:
        pids, self.stopped = self.stopped, []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:  # the worker has gone (its iterator shut down)
                pass


class HostEvent:
    """A stand-in for torch.cuda.Event(enable_timing=True) on the host clock (tests without a GPU)."""

    def record(self) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.at - self.at) * 1e3


class DeviceTimeline:
    """The device's own time per step and phase, from events recorded on the current stream at the
    outermost phase boundaries (torch.cuda.Event(enable_timing=True).record(), PyTorch's idiom for
    timing device work). An event is read only once the device has passed it (Event.query() is True),
    a step or more later, so the timeline adds no host-device synchronisation."""

    def __init__(self, make_event: Callable[[], Any]):
        self.make_event = make_event
        self.start: Any = None
        self.spans: list[tuple[str, Any, Any]] = []
        self.open: tuple[str, Any] | None = None
        self.pending: list[tuple[int, Any, Any, list[tuple[str, Any, Any]]]] = []

    def _event(self) -> Any:
        event = self.make_event()
        event.record()
        return event

    def enter(self, phase: str) -> None:
        if self.start is None:
            self.start = self._event()
        if phase in DEVICE_PHASES:
            self.open = (phase, self._event())

    def leave(self, phase: str) -> None:
        if self.open is not None and self.open[0] == phase:
            self.spans.append((phase, self.open[1], self._event()))
            self.open = None

    def end_step(self, step: int) -> list[dict[str, Any]]:
        """Close this step; return the records of the steps the device has finished."""
        if self.start is not None:
            self.pending.append((step, self.start, self._event(), self.spans))
        self.start, self.spans, self.open = None, [], None
        done = []
        while self.pending and self.pending[0][2].query():
            step, start, end, spans = self.pending.pop(0)
            record: dict[str, Any] = {
                "kind": "device",
                "step": step,
                "span_s": round(start.elapsed_time(end) / 1e3, 6),
                **dict.fromkeys(DEVICE_PHASES, 0.0),
            }
            for phase, began, ended in spans:
                record[phase] = round(record[phase] + began.elapsed_time(ended) / 1e3, 6)
            done.append(record)
        return done


class Probe:
    """One rank's instrumentation: phase clocks, the step records and their file."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank
        self.broken = False
        self.clock = time.perf_counter
        self.origin = self.clock()
        self.mark = self.origin
        self.stack: list[str] = []
        self.step_started: float | None = None
        self.times = dict.fromkeys(PHASES, 0.0)
        self.data_cpu = 0.0  # CPU seconds of this thread inside the data phase
        self.ddp_overhead = 0.0  # DDP's own forward work around the wrapped module's (find_unused_parameters)
        self.wrapped: Any = None  # the module a DDP at the outermost call wraps
        self.outer_started = self.inner_started = self.inner_s = 0.0
        self.last_batch = 0  # samples per training forward in the last step
        self.samples = 0  # training samples (outermost forward's batch) in this step
        self.micro = 0  # training forwards in this step
        self.rounds = 0  # DDP all-reduce rounds (last buckets) in this step
        self.syncs = 0  # host-device synchronisations in this step
        self.sync_wait = 0.0  # seconds the host spent inside them (waiting for the device)
        self.timeline: DeviceTimeline | None = None  # device events, on GPU ranks once CUDA is in use
        self.depth = 0  # nesting of module calls
        self.outer_kind = ""  # the outermost module call's phase: forward or eval
        self.backward_launch: float | None = None  # when DDP's last bucket left, in this backward
        self.steps = 0
        self.paused = False  # the probe's own measurements run: hooks pass through
        self.layers: list[tuple[Any, tuple[Any, ...]]] | None = None  # leaf calls captured for batch_slope
        self.state: dict[str, Any] = {}
        self.lines: list[str] = []
        self.flushed = self.origin
        self.torch: Any = None
        self.fair = fair_threads()  # launch pinned the rank before it started: read once, not every step
        self.restore: list[Callable[[], None]] = []
        # The outermost modules called (and the modules DDP wraps), and the global hooks that find them.
        self.tops: weakref.WeakSet[Any] = weakref.WeakSet()
        self.global_hooks: list[Any] = []
        self.searching: weakref.WeakSet[Any] = weakref.WeakSet()  # DDPs with find_unused_parameters=True
        self.hook_pair: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self.workers = WorkerPause()
        self.pause: dict[str, Any] = {}  # this step's worker-pause reading and what ran while they were stopped
        self.fb_at, self.micro_at = 0.0, 0  # forward + backward seconds and micro-steps when they were stopped

    # -- phase clocks ---------------------------------------------------------------------
    def _charge(self, now: float) -> None:
        self.times[self.stack[-1] if self.stack else "other"] += now - self.mark
        self.mark = now

    def enter(self, phase: str) -> None:
        now = self.clock()
        if self.step_started is None:
            self.step_started, self.mark = now, now  # the first step starts at the first phase
        self._charge(now)
        if not self.stack and self.timeline is not None:
            self.timeline.enter(phase)
        self.stack.append(phase)

    def leave(self, phase: str) -> float:
        now = self.clock()
        self._charge(now)
        while self.stack:  # an exception may have skipped an inner leave
            if self.stack.pop() == phase:
                break
        if not self.stack and self.timeline is not None:
            self.timeline.leave(phase)
        return now

    def end_step(self) -> None:
        self._resume_workers()
        now = self.clock()
        self._charge(now)
        started = self.step_started if self.step_started is not None else self.origin
        self.steps += 1
        threads = self.torch.get_num_threads()
        if threads != self.state.get("threads"):
            self.note(threads=threads)
        record = {
            "kind": "step",
            "step": self.steps,
            "end_s": round(now - self.origin, 6),
            "wall_s": round(now - started, 6),
            **{k: round(v, 6) for k, v in self.times.items()},
            "data_cpu": round(self.data_cpu, 6),
            "ddp_overhead": round(self.ddp_overhead, 6),
            "samples": self.samples,
            "micro": self.micro,
            "rounds": self.rounds,
            "syncs": self.syncs,
            "sync_wait": round(self.sync_wait, 6),
            **self.pause,
        }
        self.lines.append(json.dumps(record))
        self.pause = {}
        if (
            self.steps >= PAUSE_FIRST_STEP
            and (self.steps - PAUSE_FIRST_STEP) % PAUSE_EVERY == 0
            and self.workers.taken < PAUSES
        ):
            self.workers.due = True
        self.times = dict.fromkeys(PHASES, 0.0)
        self.data_cpu = self.ddp_overhead = 0.0
        self.last_batch = self.samples // max(self.micro, 1)
        self.samples = self.micro = self.rounds = self.syncs = 0
        self.sync_wait = 0.0
        if self.timeline is not None:
            self.lines += [json.dumps(r) for r in self.timeline.end_step(self.steps)]
        elif self.steps == 1:
            self.timeline = self._device_timeline()
        self.stack.clear()
        fair = self.fair
        if threads > fair and "thread_penalty" not in self.state:
            self.note(thread_penalty=round(thread_penalty(self.torch, threads, fair), 3), fair_threads=fair)
            now = self.mark = self.clock()  # the measurement is no part of any step
        if self.layers is not None:
            now = self._calibrate()
        elif self.steps == CALIBRATION_STEP - 1 and (0 < self.last_batch <= SMALL_BATCH or threads > fair):
            self.layers = []  # the next step's training forward records its leaf calls
        if self.layers is None and self.steps >= NARROW_AFTER_STEP and self.global_hooks:
            self._narrow()
        self.step_started = now
        if now - self.flushed >= FLUSH_EVERY_S:
            self.flush()

    def _stop_workers(self, iterator: Any, batch: Any) -> None:
        reading = self.workers.stop(iterator, self.torch.get_num_threads(), self.state.get("cpu_affinity", 1))
        if reading is None:
            return
        self.paused = True
        try:
            inline = self.workers.inline_load_s(iterator, _first_len(batch, self.torch) or 0, self.torch)
        finally:
            self.paused = False
        self.mark = self.clock()  # the measurement is no part of any phase
        self.pause = {
            **reading,
            "inline_load_s": None if inline is None else round(inline, 6),
            "paused_fb": 0.0,
            "paused_micro": 0,
        }
        self.fb_at, self.micro_at = self.times["forward"] + self.times["backward"], self.micro

    def _resume_workers(self) -> None:
        """End a pause: what forward and backward took while the workers were stopped joins the record."""
        if not self.workers.stopped:
            return
        self.workers.resume()
        self._charge(self.clock())
        self.pause["paused_fb"] = round(
            self.pause["paused_fb"] + self.times["forward"] + self.times["backward"] - self.fb_at, 6
        )
        self.pause["paused_micro"] += self.micro - self.micro_at

    def _device_timeline(self) -> DeviceTimeline | None:
        """From the second step, on a rank whose script has put CUDA to use (never initialising it for a
        CPU script on a GPU machine)."""
        if os.environ.get(DEVICE_EVENTS_ENV) == "cpu":
            return DeviceTimeline(HostEvent)
        cuda = self.torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            return DeviceTimeline(lambda: cuda.Event(enable_timing=True))
        return None

    def _calibrate(self) -> float:
        layers, self.layers = self.layers or [], None
        self.paused = True
        try:
            twins = LayerTwins(self.torch, layers, self.last_batch)
            if 0 < self.last_batch <= SMALL_BATCH:
                slope = twins.batch_slope()
                self.note(
                    batch_slope_s=None if slope is None else round(slope, 9),
                    batch_slope_between=[self.last_batch, CALIBRATION_FACTOR * self.last_batch],
                )
            threads = self.torch.get_num_threads()
            if threads > self.fair:
                penalty = twins.thread_penalty(threads, self.fair)
                self.note(layer_thread_penalty=None if penalty is None else round(penalty, 3))
        finally:
            self.paused = False
        self.mark = self.clock()  # the measurement is no part of any step
        return self.mark

    # -- records --------------------------------------------------------------------------
    def note(self, **changes: Any) -> None:
        """A change of what the rank runs with (threads, loader workers, DDP settings)."""
        if all(self.state.get(k) == v for k, v in changes.items()):
            return
        self.state.update(changes)
        self.lines.append(json.dumps({"kind": "state", "step": self.steps, **self.state}))

    def flush(self) -> None:
        self.flushed = self.clock()
        self._unused_parameters()
        if not self.lines:
            return
        with open(self.path, "a") as out:
            out.write("\n".join(self.lines) + "\n")
        self.lines.clear()

    def _unused_parameters(self) -> None:
        """The most bytes of parameters that DDP (find_unused_parameters=True) found unused in a step, from its
        own logging data: 0 means the flag only cost time. A private API: where it is missing, nothing is noted."""
        try:
            seen = [int(ddp._get_ddp_logging_data().get("unused_parameter_size", 0)) for ddp in list(self.searching)]
        except Exception:
            return
        if seen:
            self.note(unused_parameter_bytes=max([*seen, self.state.get("unused_parameter_bytes", 0)]))

    def fail(self, where: str, exc: BaseException) -> None:
        """A hook failed: record why, remove every hook, and let the script run on untouched."""
        if self.broken:
            return
        self.broken = True
        self.workers.resume()
        self.lines.append(
            json.dumps(
                {"kind": "fallback", "step": self.steps, "where": where, "error": f"{type(exc).__name__}: {exc}"[:500]}
            )
        )
        for undo in reversed(self.restore):
            try:
                undo()
            except Exception:  # best effort: a hook left behind checks `broken` and passes through
                pass
        try:
            self.flush()
        except OSError:
            pass

    # -- installation ---------------------------------------------------------------------
    def install(self, torch: Any) -> None:
        self.torch = torch
        self.note(
            threads=torch.get_num_threads(),
            interop_threads=torch.get_num_interop_threads(),
            pid=os.getpid(),
            cpu_affinity=len(os.sched_getaffinity(0)),
        )
        for install in (
            self._optimizer_hooks,
            self._module_hooks,
            self._backward,
            self._loader,
            self._collectives,
            self._ddp,
            self._save,
            self._host_syncs,
        ):
            install(torch)

    def _patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name)
        wrapper = make(original)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self.restore.append(lambda: setattr(owner, name, original))

    def _guarded(self, where: str, body: Callable[..., Any]) -> Callable[..., Any]:
        """A hook body that can never break the script: on any error the probe falls back."""

        def hook(*args: Any, **kwargs: Any) -> Any:
            if self.broken or self.paused:
                return None
            try:
                return body(*args, **kwargs)
            except Exception as exc:
                self.fail(where, exc)
                return None

        return hook

    def _phase_call(self, phase: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """`original` timed as `phase`; its own exceptions pass through unchanged."""
        probe = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if probe.broken or probe.paused:
                return original(*args, **kwargs)
            # A collective outside forward and backward is the script's own; so is the Work.wait()
            # a blocking torch.distributed call makes inside it.
            now = "collective" if phase == "comm" and (not probe.stack or probe.stack[-1] == "collective") else phase
            probe.enter(now)
            try:
                return original(*args, **kwargs)
            finally:
                probe.leave(now)

        return timed

    def _optimizer_hooks(self, torch: Any) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles = [
            register_optimizer_step_pre_hook(self._guarded("optimizer", lambda *a: self.enter("optimizer"))),
            register_optimizer_step_post_hook(self._guarded("optimizer", self._after_step)),
        ]
        self.restore += [h.remove for h in handles]

    def _after_step(self, *args: Any) -> None:
        self.leave("optimizer")
        self.end_step()

    def _module_hooks(self, torch: Any) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def pre(module: Any, args: Any) -> None:
            self.depth += 1
            if self.depth == 2 and module is self.wrapped:
                self.inner_started = self.clock()
            if self.depth != 1:
                if self.layers is not None and self.outer_kind == "forward" and next(module.children(), None) is None:
                    # detached copies that still ask for their gradient, so the input's backward is timed too
                    self.layers.append(
                        (
                            module,
                            tuple(
                                a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                                for a in args
                            ),
                        )
                    )
                return
            self.tops.add(module)
            training = module.training and torch.is_grad_enabled()
            self.outer_kind = "forward" if training else "eval"
            # A module without parameters called on its own (a loss module) is forward time, not a micro-step.
            if training and next(module.parameters(), None) is not None:
                self.micro += 1
                self.samples += _first_len(args, torch) or 0
            # Under DDP, its forward's own work (find_unused_parameters' graph search) is the outer
            # call's time less the wrapped module's.
            self.wrapped = (
                getattr(module, "module", None) if type(module).__name__ == "DistributedDataParallel" else None
            )
            if self.wrapped is not None:
                self.tops.add(self.wrapped)
            self.inner_s = 0.0
            self.enter(self.outer_kind)
            self.outer_started = self.mark

        def post(module: Any, args: Any, output: Any) -> None:
            self.depth -= 1
            if self.depth == 1 and module is self.wrapped:
                self.inner_s += self.clock() - self.inner_started
            elif self.depth == 0:
                now = self.leave(self.outer_kind)
                if self.wrapped is not None and self.outer_kind == "forward":
                    self.ddp_overhead += now - self.outer_started - self.inner_s
            elif self.depth < 0:  # hooks installed mid-call: re-synchronise
                self.depth = 0

        self.hook_pair = (self._guarded("forward", pre), self._guarded("forward", post))
        self.global_hooks = [
            register_module_forward_pre_hook(self.hook_pair[0]),
            register_module_forward_hook(self.hook_pair[1], always_call=True),
        ]
        self.restore.append(lambda: [h.remove() for h in self.global_hooks])
        self._patch(torch.nn.Module, "train", self._on_mode_switch)

    def _hook_module(self, module: Any) -> None:
        pre, post = self.hook_pair or (None, None)
        # first in, last out: FSDP2's own hooks (gathering the parameters) are inside the timed call
        handles = [
            module.register_forward_pre_hook(pre, prepend=True),
            module.register_forward_hook(post, always_call=True),
        ]
        self.restore += [h.remove for h in handles]

    def _narrow(self) -> None:
        """Global hooks run on every module call; from here on only the outermost modules are hooked."""
        if not self.tops:
            return  # no module call seen: keep looking
        for handle in self.global_hooks:
            handle.remove()
        self.global_hooks = []
        for module in list(self.tops):
            self._hook_module(module)

    def _on_mode_switch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """nn.Module.train (and .eval, which calls it): a model not seen in the first steps that is switched
        to eval later (a separate evaluation or EMA model) gets hooks, so its calls count as evaluation."""
        probe, inside = self, [False]

        def train(module: Any, *args: Any, **kwargs: Any) -> Any:
            if inside[0] or probe.broken or probe.global_hooks:
                return original(module, *args, **kwargs)
            inside[0] = True  # train() recurses into the children: only the outermost call counts
            try:
                if module not in probe.tops:
                    try:
                        probe.tops.add(module)
                        probe._hook_module(module)
                    except Exception as exc:
                        probe.fail("forward", exc)
                return original(module, *args, **kwargs)
            finally:
                inside[0] = False

        return train

    def _backward(self, torch: Any) -> None:
        probe = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(*args: Any, **kwargs: Any) -> Any:
                if probe.broken or probe.paused:
                    return original(*args, **kwargs)
                probe.enter("backward")
                probe.backward_launch = None
                try:
                    return original(*args, **kwargs)
                finally:
                    now = probe.leave("backward")
                    if probe.backward_launch is not None:
                        # DDP: after its last bucket was handed over, backward only waited for the
                        # all-reduce (and copied the averages back): exposed communication.
                        tail = min(now - probe.backward_launch, probe.times["backward"])
                        probe.times["backward"] -= tail
                        probe.times["comm"] += tail

            return backward

        self._patch(torch.autograd, "backward", make)

    def _loader(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        probe = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            timed = probe._phase_call("data", original)

            def next_batch(iterator: Any) -> Any:
                if probe.broken:
                    return original(iterator)
                try:
                    probe.note(loader_workers=max(int(iterator._num_workers), probe.state.get("loader_workers", 0)))
                except Exception as exc:
                    probe.fail("data", exc)
                probe._resume_workers()  # never wait on a stopped worker
                # CPU time of this thread beside the wait: decoding in the rank's own process is
                # CPU, reading or a loader worker's batch not yet ready is waiting.
                cpu = time.thread_time()
                try:
                    batch = timed(iterator)
                finally:
                    probe.data_cpu += time.thread_time() - cpu
                try:
                    probe.workers.count(iterator)
                    if probe.workers.due:
                        probe._stop_workers(iterator, batch)
                except Exception as exc:
                    probe.fail("data", exc)
                return batch

            return next_batch

        self._patch(dataloader._BaseDataLoaderIter, "__next__", make)

    def _collectives(self, torch: Any) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        for name in COLLECTIVES:
            if callable(getattr(dist, name, None)):
                self._patch(dist, name, lambda original: self._phase_call("comm", original))
        self._patch(dist.Work, "wait", lambda original: self._phase_call("comm", original))

    def _ddp(self, torch: Any) -> None:
        """Time DDP's all-reduce without changing it: a user's comm hook is wrapped; without one, DDP's
        default (average by all-reduce, what the reducer does built in) is registered, timed, at the
        first forward, when the script can no longer register its own."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel as DDP

        probe = self
        hooked: weakref.WeakSet[Any] = weakref.WeakSet()

        def timed_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
            # wraps: DDP checks the hook's signature (and logs its name); inspect follows __wrapped__.
            @functools.wraps(hook)
            def hook_and_time(state: Any, bucket: Any) -> Any:
                if not probe.broken and bucket.is_last():
                    probe.rounds += 1
                    probe.backward_launch = probe.clock()
                return hook(state, bucket)

            return hook_and_time

        def make_register(original: Callable[..., Any]) -> Callable[..., Any]:
            def register_comm_hook(ddp: Any, state: Any, hook: Callable[..., Any]) -> Any:
                if probe.broken:
                    return original(ddp, state, hook)
                hooked.add(ddp)
                return original(ddp, state, timed_hook(hook))

            return register_comm_hook

        def make_builtin(original: Callable[..., Any]) -> Callable[..., Any]:
            def register_builtin(ddp: Any, *args: Any, **kwargs: Any) -> Any:
                hooked.add(ddp)  # a C++ hook: its rounds cannot be timed from here
                return original(ddp, *args, **kwargs)

            return register_builtin

        def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
            def init(ddp: Any, *args: Any, **kwargs: Any) -> None:
                original(ddp, *args, **kwargs)
                if probe.broken:
                    return
                try:
                    grads = sum(p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad)
                    probe.note(
                        ddp=True,
                        find_unused_parameters=bool(ddp.find_unused_parameters),
                        gradient_bytes=int(grads),
                        static_graph=bool(getattr(ddp, "static_graph", False)),
                    )
                    ddp.register_forward_pre_hook(probe._guarded("ddp", first_forward), prepend=True)
                    if ddp.find_unused_parameters:
                        probe.searching.add(ddp)
                except Exception as exc:
                    probe.fail("ddp", exc)

            return init

        def first_forward(ddp: Any, args: Any) -> None:
            if ddp not in hooked and ddp.process_group is not None:
                hooked.add(ddp)
                DDP.register_comm_hook(ddp, ddp.process_group, allreduce_hook)

        self._patch(DDP, "register_comm_hook", make_register)
        self._patch(DDP, "_register_builtin_comm_hook", make_builtin)
        self._patch(DDP, "__init__", make_init)

    def _save(self, torch: Any) -> None:
        self._patch(torch, "save", lambda original: self._phase_call("checkpoint", original))

    def _host_syncs(self, torch: Any) -> None:
        device = os.environ.get(SYNC_DEVICE_ENV, "cuda")
        if device == "cuda" and not torch.cuda.is_available():
            return
        probe = self

        def counted(original: Callable[..., Any]) -> Callable[..., Any]:
            def read(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if probe.broken or probe.paused or tensor.device.type != device:
                    return original(tensor, *args, **kwargs)
                probe.syncs += 1
                started = probe.clock()
                try:
                    return original(tensor, *args, **kwargs)
                finally:
                    probe.sync_wait += probe.clock() - started

            return read

        for name in HOST_READS:
            self._patch(torch.Tensor, name, counted)
        if device == "cuda":

            def synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
                def counted_synchronize(*args: Any, **kwargs: Any) -> Any:
                    if probe.broken or probe.paused:
                        return original(*args, **kwargs)
                    probe.syncs += 1
                    started = probe.clock()
                    try:
                        return original(*args, **kwargs)
                    finally:
                        probe.sync_wait += probe.clock() - started

                return counted_synchronize

            self._patch(torch.cuda, "synchronize", synchronize)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Calls `then(torch)` once `import torch` has finished, whoever imports it first."""

    def __init__(self, then: Callable[[Any], None]):
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load, then = spec.loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            load(module)
            then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def command(script: str) -> list[str]:
    """How a probed rank (or sweep trial) starts: `python PROBE_FILE SCRIPT ARGS...`. The probe runs as
    the program, loaded by its path, not through the paratrain package (whose import would import
    torch before the script does), and runs the script as __main__."""
    return [sys.executable, os.path.abspath(__file__), script]


def run(argv: list[str]) -> None:
    """Run the script `argv[0]` with arguments `argv[1:]` as `python script.py ...` would, probed."""
    import atexit

    rank = int(os.environ.get("RANK", "0"))
    folder = os.path.join(os.environ[RUN_DIR_ENV], "probe")
    os.makedirs(folder, exist_ok=True)
    probe = Probe(os.path.join(folder, f"rank{rank}.jsonl"), rank)

    def install(torch: Any) -> None:
        try:
            probe.install(torch)
        except Exception as exc:
            probe.fail("install", exc)

    def last_flush() -> None:
        probe.workers.resume()
        try:
            probe.flush()
        except OSError:
            pass

    if "torch" in sys.modules:
        install(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterTorchImport(install))
    atexit.register(last_flush)
    script = os.path.abspath(argv[0])
    sys.argv = [argv[0], *argv[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run(sys.argv[1:])
