"""One rank's instrumentation: the phase clocks, the step records and their file (the hooks that drive
them are in hooks.py)."""

from __future__ import annotations

import json
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from paratrain.launch.probe import (
    CALIBRATION_STEP,
    DEVICE_EVENTS_ENV,
    NARROW_AFTER_STEP,
    PHASES,
    RAW_TRACE_FILE,
    SMALL_BATCH,
    TRACE_ENV,
)
from paratrain.launch.probe.device import DeviceTimeline, device_timeline
from paratrain.launch.probe.facts import Facts, first_len
from paratrain.launch.probe.twins import CALIBRATION_FACTOR, LayerTwins, thread_penalty
from paratrain.launch.probe.window import TraceWindow
from paratrain.launch.probe.workers import PAUSE_EVERY, PAUSE_FIRST_STEP, PAUSES, WorkerPause

FLUSH_EVERY_S = 1.0  # buffered lines reach the file at least this often (a killed rank loses less)
# DDP's buckets are timed one by one (when each was handed to the all-reduce, how many bytes, when it was
# done) in these steps: after the calibration, the narrowing and the profiler window, before the first
# loader pause; the doctor prices other bucket sizes from them.
BUCKET_STEPS = range(12, 20)


def fair_threads() -> int:
    """The threads a rank can run without oversubscribing: its cores, and its share of the machine's
    when the ranks are not pinned (every rank may use every core)."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(len(os.sched_getaffinity(0)), (os.cpu_count() or 1) // local_ranks))


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
        self.inner_seen = False  # the wrapped module's own hooks ran in this forward
        self.last_batch = 0  # samples per training forward in the last step
        self.samples = 0  # training samples (outermost forward's batch) in this step
        self.micro = 0  # training forwards in this step
        self.rounds = 0  # DDP all-reduce rounds (last buckets) in this step
        self.buckets = 0  # DDP gradient buckets handed to the all-reduce in this step, and their bytes
        self.bucket_bytes = 0
        self.bucket_log: list[list[float]] | None = None  # [handed over, bytes, done] per bucket, in BUCKET_STEPS
        self.backward_started = 0.0
        self.in_ddp_hook = False  # DDP's comm hook is running: its all-reduce is DDP's, not an inner collective
        self.collectives = 0  # every collective called from Python in this step, whoever called it and wherever
        self.inner_calls = 0  # collectives called inside forward or backward (not DDP's buckets), and bytes
        self.inner_bytes = 0
        # Of those, the ones a layer of the model calls itself (a synchronised batch norm, say), not the
        # parallelism's own (FSDP2's gathers, tensor parallelism's): their count, seconds and issuers.
        self.model_calls = 0
        self.model_comm_s = 0.0
        self.model_issuers: dict[str, int] = {}
        self.recomputes = 0  # checkpointed calls run again inside backward
        self.backwards = 0  # backward passes the script started (torch.autograd.backward, not a reentrant one)
        self.syncs = 0  # host-device synchronisations in this step
        self.sync_wait = 0.0  # seconds the host spent inside them (waiting for the device)
        self.timeline: DeviceTimeline | None = None  # device events, on GPU ranks once CUDA is in use
        self.device: Any = None  # the CUDA device the model runs on (None on the CPU)
        self.depth = 0  # nesting of module calls
        self.outer_kind = ""  # the outermost module call's phase: forward or eval
        self.backward_launch: float | None = None  # when DDP's last bucket left, in this backward
        self.steps = 0
        self.paused = False  # the probe's own measurements run: hooks pass through
        self.layers: list[tuple[Any, tuple[Any, ...]]] | None = None  # leaf calls captured for the twins
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
        self.facts = Facts(self)
        self.window = TraceWindow(
            os.path.join(os.path.dirname(path), RAW_TRACE_FILE.format(rank=rank)), os.environ.get(TRACE_ENV) != "0"
        )

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
        self.window.enter(phase)

    def leave(self, phase: str) -> float:
        now = self.clock()
        self._charge(now)
        while self.stack:  # an exception may have skipped an inner leave
            self.window.leave()
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
        if self.steps == 1:
            self._note_world()
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
            "collectives": self.collectives,
            "buckets": self.buckets,
            "bucket_bytes": self.bucket_bytes,
            "inner_calls": self.inner_calls,
            "inner_bytes": self.inner_bytes,
            "model_calls": self.model_calls,
            "model_comm_s": round(self.model_comm_s, 6),
            **({"model_issuers": self.model_issuers} if self.model_issuers else {}),
            "recomputes": self.recomputes,
            "backwards": self.backwards,
            "syncs": self.syncs,
            "sync_wait": round(self.sync_wait, 6),
            **self.facts.step_record(),
            **self.pause,
        }
        if self.window.active:
            record["profiled"] = True
        if self.bucket_log is not None:
            record["bucket_log"] = [[round(v, 6) for v in b] for b in self.bucket_log]
            record["backward_span"] = round(self.times["backward"] + self.times["comm"], 6)
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
        self.samples = self.micro = self.rounds = self.syncs = self.buckets = self.bucket_bytes = self.collectives = 0
        self.inner_calls = self.inner_bytes = self.recomputes = self.model_calls = self.backwards = 0
        self.model_comm_s, self.model_issuers = 0.0, {}
        self.sync_wait = 0.0
        self.bucket_log = [] if self.steps + 1 in BUCKET_STEPS else None
        if self.timeline is not None:
            self.lines += [json.dumps(r) for r in self.timeline.end_step(self.steps)]
        elif self.steps == 1:
            self.timeline = device_timeline(self.torch, self.device, os.environ.get(DEVICE_EVENTS_ENV) == "cpu")
        self.stack.clear()
        fair = self.fair
        if threads > fair and "thread_penalty" not in self.state:
            self.note(thread_penalty=round(thread_penalty(self.torch, threads, fair), 3), fair_threads=fair)
            now = self.mark = self.clock()  # the measurement is no part of any step
        if self.layers is not None:
            now = self._calibrate()
        elif self.steps == CALIBRATION_STEP - 1 and self._prices_layers(threads > fair):
            self.layers = []  # the next step's training forward records its leaf calls
        if self.layers is None and self.steps >= NARROW_AFTER_STEP and self.global_hooks:
            self._narrow()
        if self.window.step(self.torch, self.steps, now - started):
            now = self.mark = self.clock()  # starting or stopping the profiler is no part of any step
        if self.window.missing:
            self.note(trace_missing=self.window.missing)
        self.step_started = now
        if now - self.flushed >= FLUSH_EVERY_S:
            self.flush()

    def _prices_layers(self, oversubscribed: bool) -> bool:
        """Whether the calibration times the model's layers alone. Every run's are priced (doctor/expected.py),
        but a compiled model's run inside its graphs: hooking them for one step would make torch.compile compile
        again, for layers it never calls. Its small batch, oversubscription, float64 or a disabled autocast still
        ask for them."""
        return (
            not self.state.get("compiled")
            or 0 < self.last_batch <= SMALL_BATCH
            or oversubscribed
            or self.facts.float64_parameters()
            or self.facts.autocast_disabled()
        )

    def _note_world(self) -> None:
        """At the first step: the process group the rank joined (0: none) and the frameworks the script imported.
        Ranks that never synchronise are named with them: Accelerate joins the launcher's process group on CPU
        ranks yet trains each alone unless told Accelerator(cpu=True)."""
        dist = self.torch.distributed
        group = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 0
        self.note(process_group=group, frameworks=[name for name in FRAMEWORKS if name in sys.modules])
        # Debugging switches left in the environment (a script's os.environ[...] = ... runs before its first step);
        # TORCH_DISTRIBUTED_DEBUG as torch read it when the process group was made.
        debug = {name: os.environ[name] for name in DEBUG_ENVIRONMENT if os.environ.get(name)}
        level = str(dist.get_debug_level()).rsplit(".", 1)[-1] if group else "OFF"
        if level != "OFF":
            debug["TORCH_DISTRIBUTED_DEBUG"] = level
        if debug:
            self.note(debug_environment=debug)

    def _narrow(self) -> None:
        """Global hooks run on every module call; from here on only the outermost modules are hooked."""
        if not self.tops:
            return  # no module call seen: keep looking
        for handle in self.global_hooks:
            handle.remove()
        self.global_hooks = []
        for module in list(self.tops):
            self.hook_module(module)

    def hook_module(self, module: Any) -> None:
        pre, post = self.hook_pair or (None, None)
        # first in, last out: FSDP2's own hooks (gathering the parameters) are inside the timed call
        handles = [
            module.register_forward_pre_hook(pre, prepend=True),
            module.register_forward_hook(post, always_call=True),
        ]
        self.restore += [h.remove for h in handles]

    def stop_workers(self, iterator: Any, batch: Any) -> None:
        reading = self.workers.stop(iterator, self.torch.get_num_threads(), self.state.get("cpu_affinity", 1))
        if reading is None:
            return
        self.paused = True
        try:
            inline = self.workers.inline_load_s(iterator, first_len(batch, self.torch) or 0, self.torch)
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

    def _calibrate(self) -> float:
        layers, self.layers = self.layers or [], None
        self.paused = True
        try:
            self._measure_layers(layers)
        finally:
            self.paused = False
            if self.device is not None:
                # the copies and their inputs, gone with _measure_layers' frame, go back to the device rather
                # than staying in the caching allocator beside the script's blocks
                self.torch.cuda.empty_cache()
        self.mark = self.clock()  # the measurement is no part of any step
        return self.mark

    def _measure_layers(self, layers: list[tuple[Any, tuple[Any, ...]]]) -> None:
        """The calibration's measurements on copies of the model's leaf layers (twins.py), noted for the doctor."""
        twins = LayerTwins(self.torch, layers, self.last_batch)
        # The model's own work, priced: its layers alone at the script's batch, forward and backward (the
        # doctor's expected cost of the step's forward and backward, doctor/expected.py).
        self.note(
            twins_timed=len(twins.twins),
            twins_seen=twins.layers,
            layers_alone_s=round(twins.seconds(), 6),
            layer_launch_s=round(twins.launch_s(), 9),
            anomaly_mode=bool(self.torch.is_anomaly_enabled()),
        )
        needless = self.facts.needless_gradients()
        if needless:
            spent = twins.needless_backward_s(needless)
            self.note(needless_backward_s=None if spent is None else round(spent, 6))
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
        if self.facts.float64_parameters():
            penalty = twins.dtype_penalty(self.torch.float32)
            self.note(float64_penalty=None if penalty is None else round(penalty, 3))
        if self.facts.autocast_disabled():
            penalty = twins.autocast_penalty(self.torch.bfloat16)
            self.note(autocast_penalty=None if penalty is None else round(penalty, 3))

    # -- records --------------------------------------------------------------------------
    def note(self, **changes: Any) -> None:
        """A change of what the rank runs with (threads, loader workers, DDP settings, ...)."""
        if all(self.state.get(k) == v for k, v in changes.items()):
            return
        self.state.update(changes)
        self.lines.append(json.dumps({"kind": "state", "step": self.steps, **changes}))

    def flush(self) -> None:
        self.flushed = self.clock()
        self._unused_parameters()
        self.facts.flush()
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
        self.window.abandon()
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
    def patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name)
        wrapper = make(original)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self.restore.append(lambda: setattr(owner, name, original))

    def guarded(self, where: str, body: Callable[..., Any]) -> Callable[..., Any]:
        """A hook body that can never break the script: on any error the probe falls back. Inside a graph
        torch.compile is tracing it does nothing (it would break the graph, and fail fullgraph=True)."""
        compiling = self.torch.compiler.is_compiling

        def hook(*args: Any, **kwargs: Any) -> Any:
            if compiling() or self.broken or self.paused:
                return None
            try:
                return body(*args, **kwargs)
            except Exception as exc:
                self.fail(where, exc)
                return None

        return hook

    def phase_call(self, phase: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """`original` timed as `phase`; its own exceptions pass through unchanged."""
        probe, compiling = self, self.torch.compiler.is_compiling

        def through_call(*args: Any, **kwargs: Any) -> Any:
            if compiling() or probe.broken or probe.paused:
                return original(*args, **kwargs)
            # A collective outside forward and backward is the script's own; so is the Work.wait()
            # a blocking torch.distributed call makes inside it.
            now = "collective" if phase == "comm" and (not probe.stack or probe.stack[-1] == "collective") else phase
            issuer = None
            if phase == "comm" and original.__name__ != "wait":
                probe.collectives += 1
            if now == "comm" and not probe.in_ddp_hook and original.__name__ != "wait":
                probe.inner_calls += 1
                probe.inner_bytes += _tensor_bytes(args[:1], probe.torch)
                issuer = model_issuer(sys._getframe(1))
            probe.enter(now)
            started = probe.mark
            try:
                return original(*args, **kwargs)
            finally:
                ended = probe.leave(now)
                if issuer is not None:
                    probe.model_calls += 1
                    probe.model_comm_s += ended - started
                    probe.model_issuers[issuer] = probe.model_issuers.get(issuer, 0) + 1

        return through_call


# Frameworks that set up the ranks' parallelism for the script, as sys.modules names them.
FRAMEWORKS = ("accelerate", "lightning", "pytorch_lightning", "deepspeed")
# Switches that slow every step while set: the doctor names them (doctor/wasted_compute.py).
DEBUG_ENVIRONMENT = ("TORCH_DISTRIBUTED_DEBUG", "CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "PYTORCH_NO_CUDA_MEMORY_CACHING")

# Collectives called from these parts of torch are a parallelism's own communication (FSDP2 gathering and
# reducing, tensor parallelism's, a pipeline's sends), not a layer of the model synchronising.
PARALLELISM_CODE = (
    os.sep + "fsdp" + os.sep,
    os.sep + "tensor" + os.sep,
    os.sep + "pipelining" + os.sep,
    os.sep + "_composable" + os.sep,
)


def model_issuer(frame: Any, depth: int = 30) -> str | None:
    """For a collective called inside forward or backward: what called it, the parallelism's own code (None)
    or the model's: the layer whose forward called it (`SyncBN (model.py:12)`), or the autograd function
    whose backward did. Frames are walked from the call outwards."""
    torch_autograd = os.sep + "autograd" + os.sep
    for _ in range(depth):
        if frame is None:
            break
        code = frame.f_code
        if any(part in code.co_filename for part in PARALLELISM_CODE):
            return None
        where = f"{os.path.relpath(code.co_filename)}:{code.co_firstlineno}"
        if code.co_name == "forward" and hasattr(frame.f_locals.get("self"), "_parameters"):
            return f"{type(frame.f_locals['self']).__name__} ({where})"
        if code.co_name == "backward" and torch_autograd not in code.co_filename:
            return f"{code.co_qualname} ({where})"
        frame = frame.f_back
    return "unknown"


def _tensor_bytes(values: Any, torch: Any) -> int:
    """Bytes of the tensors among `values` (a collective's first argument: a tensor or a list of them)."""
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, (list, tuple)):
            total += _tensor_bytes(value, torch)
    return total
