"""The probe's hooks into torch, each installed by one function of (probe, torch) and undone by the probe's
`restore` list. They drive the phase clocks of clock.py and count what a step did.

A wrapper that stands in for a torch function and calls it through is named `through_*`: in a profiled step's
trace the time below it is the user's work, not the probe's (launch/trace_summary.py)."""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paratrain.launch.probe import SYNC_DEVICE_ENV
from paratrain.launch.probe.device import tensor_device
from paratrain.launch.probe.facts import first_len, site, user_frame
from paratrain.launch.probe.twins import input_spec

if TYPE_CHECKING:
    from paratrain.launch.probe.clock import Probe

HOST_READS = ("item", "tolist", "cpu", "numpy")  # Tensor methods that read values on the host
# Collectives a script (or FSDP2, or Lightning, or a model's own layer) calls from Python. A blocking call
# is exposed communication; an async one is counted when its Work is waited for.
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


def optimizer_hooks(probe: Probe, torch: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def before_step(optimizer: Any, *args: Any) -> None:
        with contextlib.suppress(TypeError):  # an optimizer class without weak references is not looked at
            probe.facts.optimizers.add(optimizer)
        probe.enter("optimizer")

    def after_step(*args: Any) -> None:
        probe.leave("optimizer")
        probe.end_step()

    handles = [
        register_optimizer_step_pre_hook(probe.guarded("optimizer", before_step)),
        register_optimizer_step_post_hook(probe.guarded("optimizer", after_step)),
    ]
    probe.restore += [h.remove for h in handles]


def module_hooks(probe: Probe, torch: Any) -> None:
    """Global module hooks find the outermost modules in the first steps (clock.py narrows them then). A call
    inside backward (checkpointing's recompute runs the forward again there) is no forward and no micro-step:
    the checkpoint hook times it as recompute."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    in_backward = torch._C._current_graph_task_id
    skipped: list[bool] = []  # per nesting level: was the pre-hook skipped (so the post-hook is too)

    def pre(module: Any, args: Any) -> None:
        if in_backward() != -1:
            skipped.append(True)
            return
        skipped.append(False)
        probe.depth += 1
        if probe.depth == 2 and module is probe.wrapped:
            probe.inner_started = probe.clock()
            probe.inner_seen = True
        if probe.depth != 1:
            if (
                probe.layers is not None
                and probe.outer_kind == "forward"
                and next(module.children(), None) is None
                and not type(module).__module__.startswith("torch.fx")  # a compiled graph, no layer of the model
            ):
                probe.layers.append((module, tuple(input_spec(torch, a) for a in args)))
            return
        probe.tops.add(module)
        training = module.training and torch.is_grad_enabled()
        probe.outer_kind = "forward" if training else "eval"
        # A module without parameters called on its own (a loss module) is forward time, not a micro-step.
        if training and next(module.parameters(), None) is not None:
            probe.micro += 1
            probe.samples += first_len(args, torch) or 0
            probe.facts.first_forward(module, args)
            if probe.device is None and probe.steps == 0:
                probe.device = tensor_device(torch, module, args)
        # Under DDP, its forward's own work (find_unused_parameters' graph search) is the outer
        # call's time less the wrapped module's.
        probe.wrapped = getattr(module, "module", None) if type(module).__name__ == "DistributedDataParallel" else None
        if probe.wrapped is not None:
            probe.tops.add(probe.wrapped)
        probe.inner_s, probe.inner_seen = 0.0, False
        probe.enter(probe.outer_kind)
        probe.outer_started = probe.mark

    def post(module: Any, args: Any, output: Any) -> None:
        if skipped and skipped.pop():
            return
        probe.depth -= 1
        if probe.depth == 1 and module is probe.wrapped:
            probe.inner_s += probe.clock() - probe.inner_started
        elif probe.depth == 0:
            now = probe.leave(probe.outer_kind)
            # A wrapped module compiled in place (model.compile()) runs no hooks of its own: its forward cannot be
            # told from DDP's, and counts as the model's.
            if probe.wrapped is not None and probe.outer_kind == "forward" and probe.inner_seen:
                probe.ddp_overhead += now - probe.outer_started - probe.inner_s
        elif probe.depth < 0:  # hooks installed mid-call: re-synchronise
            probe.depth = 0

    probe.hook_pair = (probe.guarded("forward", pre), probe.guarded("forward", post))
    probe.global_hooks = [
        register_module_forward_pre_hook(probe.hook_pair[0]),
        register_module_forward_hook(probe.hook_pair[1], always_call=True),
    ]
    probe.restore.append(lambda: [h.remove() for h in probe.global_hooks])
    probe.patch(torch.nn.Module, "train", functools.partial(_on_mode_switch, probe))


def _on_mode_switch(probe: Probe, original: Callable[..., Any]) -> Callable[..., Any]:
    """nn.Module.train (and .eval, which calls it): a model not seen in the first steps that is switched
    to eval later (a separate evaluation or EMA model) gets hooks, so its calls count as evaluation."""
    inside = [False]

    def through_train(module: Any, *args: Any, **kwargs: Any) -> Any:
        if inside[0] or probe.broken or probe.global_hooks:
            return original(module, *args, **kwargs)
        inside[0] = True  # train() recurses into the children: only the outermost call counts
        try:
            if module not in probe.tops:
                try:
                    probe.tops.add(module)
                    probe.hook_module(module)
                except Exception as exc:
                    probe.fail("forward", exc)
            return original(module, *args, **kwargs)
        finally:
            inside[0] = False

    return through_train


def backward(probe: Probe, torch: Any) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def through_backward(*args: Any, **kwargs: Any) -> Any:
            if probe.broken or probe.paused:
                return original(*args, **kwargs)
            if "backward" in probe.stack:  # a reentrant checkpoint's backward inside the step's own
                probe.enter("backward")
                try:
                    return original(*args, **kwargs)
                finally:
                    probe.leave("backward")
            probe.enter("backward")
            probe.backwards += 1
            probe.backward_launch = None
            probe.backward_started = probe.mark
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

        return through_backward

    probe.patch(torch.autograd, "backward", make)


def recompute(probe: Probe, torch: Any) -> None:
    """torch.utils.checkpoint.checkpoint runs its function again inside backward: that run is timed as
    recompute. The function is wrapped (the same wrapper in forward and in backward, as checkpoint requires);
    a run outside backward is the forward's own."""
    import torch.utils.checkpoint as checkpointing

    in_backward = torch._C._current_graph_task_id

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def through_checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if probe.broken or torch.compiler.is_compiling():
                return original(function, *args, **kwargs)

            @functools.wraps(function)
            def through_recompute(*inner: Any, **inner_kwargs: Any) -> Any:
                if probe.broken or probe.paused or in_backward() == -1:
                    return function(*inner, **inner_kwargs)
                probe.recomputes += 1
                probe.enter("recompute")
                try:
                    return function(*inner, **inner_kwargs)
                finally:
                    probe.leave("recompute")

            # checkpoint(debug=True) records every operator's stack, in forward and in the recompute
            probe.note(activation_checkpointing=True, checkpoint_debug=bool(kwargs.get("debug")))
            return original(through_recompute, *args, **kwargs)

        return through_checkpoint

    probe.patch(checkpointing, "checkpoint", make)


def loader(probe: Probe, torch: Any) -> None:
    from torch.utils.data import dataloader

    def make_next(original: Callable[..., Any]) -> Callable[..., Any]:
        timed = probe.phase_call("data", original)

        def through_next(iterator: Any) -> Any:
            if probe.broken:
                return original(iterator)
            try:
                workers = max(int(iterator._num_workers), probe.state.get("loader_workers", 0))
                probe.note(loader_workers=workers)
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
                probe.facts.batch(iterator, batch)
                if probe.workers.due:
                    probe.stop_workers(iterator, batch)
            except Exception as exc:
                probe.fail("data", exc)
            return batch

        return through_next

    def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(iterator: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            original(iterator, loader, *args, **kwargs)
            if not probe.broken:
                try:
                    probe.facts.new_epoch(iterator, loader)
                except Exception as exc:
                    probe.fail("data", exc)

        return init

    probe.patch(dataloader._BaseDataLoaderIter, "__next__", make_next)
    probe.patch(dataloader._BaseDataLoaderIter, "__init__", make_init)


def collectives(probe: Probe, torch: Any) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    for name in COLLECTIVES:
        if callable(getattr(dist, name, None)):
            probe.patch(dist, name, lambda original: probe.phase_call("comm", original))
    probe.patch(dist.Work, "wait", lambda original: probe.phase_call("comm", original))


def ddp(probe: Probe, torch: Any) -> None:
    """Time DDP's all-reduce without changing it: a user's comm hook is wrapped; without one, DDP's
    default (average by all-reduce, what the reducer does built in) is registered, timed, at the
    first forward, when the script can no longer register its own. Every bucket is counted; in a few
    steps each is timed from its hand-over to its all-reduce's end (the future's callback)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    hooked: weakref.WeakSet[Any] = weakref.WeakSet()

    # The wrappers take DDP's own arguments as they come: scripts and frameworks pass them by keyword
    # (Lightning builds DistributedDataParallel(module=model, ...), registers hooks with state=, hook=).
    def make_register(original: Callable[..., Any]) -> Callable[..., Any]:
        def register_comm_hook(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if probe.broken:
                return original(ddp, *args, **kwargs)
            hooked.add(ddp)
            if "hook" in kwargs:
                kwargs["hook"] = timed_hook(probe, kwargs["hook"])
            else:
                args = (*args[:1], timed_hook(probe, args[1]), *args[2:])
            return original(ddp, *args, **kwargs)

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
                grads = [p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad]
                probe.note(
                    ddp=True,
                    find_unused_parameters=bool(ddp.find_unused_parameters),
                    gradient_bytes=int(sum(grads)),
                    gradient_tensors=len(grads),
                    bucket_cap_bytes=int(ddp.bucket_bytes_cap),
                    broadcast_buffers=bool(ddp.broadcast_buffers),
                    static_graph=bool(getattr(ddp, "static_graph", False)),
                )
                ddp.register_forward_pre_hook(probe.guarded("ddp", first_forward), prepend=True)
                if ddp.find_unused_parameters:
                    probe.searching.add(ddp)
            except Exception as exc:
                probe.fail("ddp", exc)

        return init

    def first_forward(ddp: Any, args: Any) -> None:
        if ddp not in hooked and ddp.process_group is not None:
            hooked.add(ddp)
            DDP.register_comm_hook(ddp, ddp.process_group, allreduce_hook)

    probe.patch(DDP, "register_comm_hook", make_register)
    probe.patch(DDP, "_register_builtin_comm_hook", make_builtin)
    probe.patch(DDP, "__init__", make_init)


def timed_hook(probe: Probe, hook: Callable[..., Any]) -> Callable[..., Any]:
    """A DDP comm hook counted and timed: every bucket's bytes, the last bucket's hand-over (the exposed
    all-reduce is backward's tail after it), and in BUCKET_STEPS each bucket's all-reduce's end."""

    # wraps: DDP checks the hook's signature (and logs its name); inspect follows __wrapped__.
    @functools.wraps(hook)
    def through_hook(state: Any, bucket: Any) -> Any:
        if probe.broken:
            return hook(state, bucket)
        now = probe.clock()
        buffer = bucket.buffer()
        size = buffer.numel() * buffer.element_size()
        probe.buckets += 1
        probe.bucket_bytes += size
        if bucket.is_last():
            probe.rounds += 1
            probe.backward_launch = now
        probe.in_ddp_hook = True
        try:
            future = hook(state, bucket)
        finally:
            probe.in_ddp_hook = False
        log = probe.bucket_log
        if log is not None:
            entry = [now - probe.backward_started, float(size), -1.0]
            log.append(entry)
            started = probe.backward_started

            def done(fut: Any) -> Any:
                entry[2] = probe.clock() - started
                return fut.value()

            # DDP waits on what the hook returns: chained, the time is read before the bucket counts as done
            return future.then(done)
        return future

    return through_hook


def save(probe: Probe, torch: Any) -> None:
    probe.patch(torch, "save", lambda original: probe.phase_call("checkpoint", original))


def host_syncs(probe: Probe, torch: Any) -> None:
    """Host reads of tensors on the sync device. Whether CUDA is there is not asked at install: that would
    initialise CUDA at `import torch` (which breaks a fork after it, and ignores a CUDA_VISIBLE_DEVICES the
    script sets after importing torch); a read of a CPU tensor simply does not count."""
    device = os.environ.get(SYNC_DEVICE_ENV, "cuda")

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def through_read(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if probe.broken or probe.paused or tensor.device.type != device:
                return original(tensor, *args, **kwargs)
            probe.syncs += 1
            started = probe.clock()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                probe.sync_wait += probe.clock() - started

        return through_read

    for name in HOST_READS:
        probe.patch(torch.Tensor, name, counted)
    if device == "cuda":

        def synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
            def through_synchronize(*args: Any, **kwargs: Any) -> Any:
                if probe.broken or probe.paused:
                    return original(*args, **kwargs)
                probe.syncs += 1
                started = probe.clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    probe.sync_wait += probe.clock() - started

            return through_synchronize

        probe.patch(torch.cuda, "synchronize", synchronize)


def garbage(probe: Probe, torch: Any) -> None:
    """Python's garbage collections, timed by gc.callbacks (facts.py keeps where they were triggered)."""
    import gc

    callback = probe.facts.gc_callback
    gc.callbacks.append(callback)
    probe.restore.append(lambda: gc.callbacks.remove(callback) if callback in gc.callbacks else None)


def compile_calls(probe: Probe, torch: Any) -> None:
    """torch.compile's callers (facts.py): a call whose result the steps never call compiles nothing."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def through_compile(*args: Any, **kwargs: Any) -> Any:
            if not probe.broken:
                try:
                    probe.facts.compile_called(site(user_frame(sys._getframe(1))))
                except Exception as exc:
                    probe.fail("compile", exc)
            return original(*args, **kwargs)

        return through_compile

    probe.patch(torch, "compile", make)


def script_warnings(probe: Probe, torch: Any) -> None:
    """The warnings the run shows, noted as they are shown (facts.py); each is still shown as it would be."""
    import warnings

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def showwarning(message: Any, category: Any, filename: str, lineno: int, *args: Any, **kwargs: Any) -> Any:
            if not probe.broken:
                try:
                    where = f"{os.path.relpath(filename) if not filename.startswith('<') else filename}:{lineno}"
                    probe.facts.warned(message, category, where)
                except Exception as exc:
                    probe.fail("warnings", exc)
            return original(message, category, filename, lineno, *args, **kwargs)

        return showwarning

    probe.patch(warnings, "showwarning", make)


def install(probe: Probe, torch: Any) -> None:
    """Every hook, once `import torch` has finished."""
    probe.torch = torch
    probe.note(
        threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        pid=os.getpid(),
        cpu_affinity=len(os.sched_getaffinity(0)),
    )
    probe.restore.append(probe.window.abandon)
    for installer in INSTALLERS:
        installer(probe, torch)


INSTALLERS = (
    optimizer_hooks,
    module_hooks,
    backward,
    recompute,
    loader,
    collectives,
    ddp,
    save,
    host_syncs,
    garbage,
    compile_calls,
    script_warnings,
)


class AfterTorchImport(importlib.abc.MetaPathFinder):
    """Calls `then(torch)` once `import torch` has finished, whoever imports it first."""

    def __init__(self, then: Callable[[Any], None]):
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        # Asked for torch's spec without importing it (importlib.util.find_spec("torch"): Hugging Face datasets
        # and transformers check whether torch is installed so), the finder stays for the import that follows.
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load, then, finder = spec.loader.exec_module, self.then, self

        def exec_module(module: Any) -> None:
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            load(module)
            then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
