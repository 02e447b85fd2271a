"""Facts about a rank's run that the doctor reasons from, beside the phase times: what each DataLoader reads
(its dataset's length, its sampler, the samples an epoch gave this rank, a checksum of its first batch), the
dtypes of the model and its inputs, Python's garbage collections and where they were triggered,
torch.compile's calls and compilations, the padding in each batch, the script's warnings, and the memory the
rank held against what it may hold."""

from __future__ import annotations

import linecache
import os
import resource
import sys
import weakref
from typing import TYPE_CHECKING, Any

from paratrain.launch.probe.workers import random_streams_kept

if TYPE_CHECKING:
    from paratrain.launch.probe.clock import Probe

GC_SITE_S = 0.0005  # a collection this long is attributed to the code that triggered it
LOADERS = 8  # loaders described, at most (a script that builds one per step is not followed further)
WARNINGS = 16  # distinct warnings kept, at most
COMPILE_CALLS = 8  # distinct lines that called torch.compile, at most
# Padding is looked for in a batch's integer or boolean matrices (token ids, attention masks, labels padded with
# an ignore index) at least this wide, and no larger than this (a larger one is a feature map, not a sequence).
PAD_MIN_WIDTH = 16
PAD_MAX_NUMEL = 1 << 22
# Paths of code that is not the user's: where a collection or a call is attributed, these frames are skipped.
LIBRARY_PARTS = (os.sep + "torch" + os.sep, "site-packages", "dist-packages", os.sep + "paratrain" + os.sep)


def user_frame(frame: Any) -> Any:
    """The innermost frame of the user's own code (not torch, a library or the standard library), else the
    innermost frame."""
    stdlib = os.path.dirname(os.__file__)
    first = frame
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and not name.startswith(stdlib) and not any(p in name for p in LIBRARY_PARTS):
            return frame
        frame = frame.f_back
    return first


def site(frame: Any) -> str:
    """`file:line (function): the line's code`, as a person finds it."""
    if frame is None:
        return "unknown"
    name, line = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(name, line).strip()
    where = f"{os.path.relpath(name) if not name.startswith('<') else name}:{line} ({frame.f_code.co_name})"
    return f"{where}: {text[:80]}" if text else where


class Facts:
    def __init__(self, probe: Probe):
        self.probe = probe
        self.gc_s = 0.0
        self.gc_n = 0
        self.gc_started = 0.0
        self.gc_sites: dict[str, float] = {}  # this step's collections by the code that triggered them
        self.compiled = (0, 0.0)  # frames compiled and seconds compiling, so far
        self.compiles, self.compile_s = 0, 0.0
        self.compile_calls: list[str] = []  # the lines that called torch.compile
        self.warnings: list[dict[str, str]] = []  # the script's warnings, one per message and line
        self.dtypes_seen = False
        self.float64 = False
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  # every torch optimizer that stepped
        self.epoch_began = False  # a DataLoader began an epoch (a new iterator) during this step
        self.loaders: dict[int, dict[str, Any]] = {}  # id(loader) -> what it reads
        self.iterators: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()

    # -- per step ---------------------------------------------------------------------------
    def step_record(self) -> dict[str, Any]:
        self._compilations()
        out: dict[str, Any] = {
            "gc_s": round(self.gc_s, 6),
            "gc_n": self.gc_n,
            "compiles": self.compiles,
            "compile_s": round(self.compile_s, 6),
        }
        if self.gc_sites:
            out["gc_sites"] = {where: round(s, 6) for where, s in self.gc_sites.items()}
        if self.epoch_began:
            out["epoch_began"] = True
            self.epoch_began = False
        self.gc_s, self.gc_n, self.compiles, self.compile_s = 0.0, 0, 0, 0.0
        self.gc_sites = {}
        return out

    def gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks: a collection's start and stop. Its time counts in the step (and in whatever phase it
        interrupted); a long one is charged to the code that triggered it: the line calling gc.collect(), or
        the allocation that crossed Python's threshold."""
        probe = self.probe
        if probe.broken:
            return
        try:
            if phase == "start":
                self.gc_started = probe.clock()
                return
            spent = probe.clock() - self.gc_started
            self.gc_s += spent
            self.gc_n += 1
            if spent >= GC_SITE_S and not probe.paused:
                caller = sys._getframe().f_back  # the frame that was running when Python collected
                where = site(user_frame(caller)) if caller is not None else "outside Python code"
                self.gc_sites[where] = self.gc_sites.get(where, 0.0) + spent
        except Exception as exc:
            probe.fail("gc", exc)

    def _compilations(self) -> None:
        """torch.compile's frames compiled and its compile time since the last step (read from dynamo's own
        counters, only where the script has imported dynamo)."""
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return
        try:
            metrics = utils.compilation_time_metrics  # each compilation appends its seconds
            frames = len(metrics.get("_compile.compile_inner", []))
            seconds = sum(sum(metrics.get(k, [])) for k in ("_compile.compile_inner", "backward._backward_impl"))
            breaks = sum(utils.counters["graph_break"].values())
        except Exception:
            return
        self.compiles, self.compile_s = frames - self.compiled[0], seconds - self.compiled[1]
        self.compiled = (frames, seconds)
        if frames:
            self.probe.note(compiled=True, compiled_frames=frames, graph_breaks=breaks)

    def compile_called(self, where: str) -> None:
        """torch.compile was called (directly, or by nn.Module.compile()) from `where`. Calling it compiles
        nothing: the frames compile when what it returned is first called, so a call whose result nobody calls
        (`torch.compile(model)` on a line of its own) leaves the steps eager, with no error and no warning."""
        if where not in self.compile_calls and len(self.compile_calls) < COMPILE_CALLS:
            self.compile_calls.append(where)
            self.probe.note(compile_calls=list(self.compile_calls))

    def warned(self, message: Any, category: Any, where: str) -> None:
        """A warning the script's run showed (torch's own among them: an autocast that disabled itself says so
        only here), once per message and line."""
        text = str(message).strip().splitlines()[0][:200] if str(message).strip() else ""
        entry = {"category": getattr(category, "__name__", str(category)), "message": text, "where": where}
        if entry not in self.warnings and len(self.warnings) < WARNINGS:
            self.warnings.append(entry)
            self.probe.note(warnings=[dict(w) for w in self.warnings])

    def autocast_disabled(self) -> bool:
        """torch.autocast turned itself off (asked for a device the run has no use of, or a dtype the device's
        autocast does not support): the forward the script wrote in a low precision runs in float32."""
        return any("Disabling autocast" in w["message"] for w in self.warnings)

    # -- the model --------------------------------------------------------------------------
    def first_forward(self, module: Any, args: tuple[Any, ...]) -> None:
        """At a training forward after the first step: the parameters' dtypes (elements per dtype), the input's
        and autocast's."""
        if self.dtypes_seen or self.probe.steps < 1:
            return
        self.dtypes_seen = True
        torch = self.probe.torch
        params: dict[str, int] = {}
        for p in module.parameters():
            key = str(p.dtype).removeprefix("torch.")
            params[key] = params.get(key, 0) + p.numel()
        inputs = sorted({str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)})
        device = "cuda" if any(a.is_cuda for a in args if isinstance(a, torch.Tensor)) else "cpu"
        autocast = None
        if torch.is_autocast_enabled(device):
            autocast = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        self.float64 = params.get("float64", 0) > 0.5 * sum(params.values())
        self.probe.note(param_dtypes=params, input_dtypes=inputs, autocast=autocast)

    def float64_parameters(self) -> bool:
        return self.float64

    def needless_gradients(self) -> set[int]:
        """After an optimizer step: the parameters of the model that backward gave a gradient but that no
        optimizer holds (a backbone meant to be frozen, left with requires_grad=True: backward computes their
        gradients, DDP all-reduces them, nothing reads them). Noted as their count and bytes beside all
        gradients' bytes; their ids returned, so the calibration can time the layers that hold only those."""
        held = {id(p) for opt in list(self.optimizers) for group in opt.param_groups for p in group["params"]}
        if not held:
            return set()
        graded: dict[int, Any] = {}
        for module in list(self.probe.tops):
            for p in module.parameters():
                if p.requires_grad and p.grad is not None:
                    graded[id(p)] = p
        needless = {key: p for key, p in graded.items() if key not in held}
        self.probe.note(
            needless_grad_params=len(needless),
            needless_grad_bytes=sum(p.numel() * p.element_size() for p in needless.values()),
            graded_bytes=sum(p.numel() * p.element_size() for p in graded.values()),
        )
        return set(needless)

    # -- data ---------------------------------------------------------------------------------
    def new_epoch(self, iterator: Any, loader: Any) -> None:
        """A DataLoader began an epoch: describe it once; close its last epoch's count."""
        self.epoch_began = True
        key = id(loader)
        if key not in self.loaders:
            if len(self.loaders) >= LOADERS:
                return
            self.loaders[key] = describe_loader(self.probe.torch, loader)
        facts = self.loaders[key]
        facts["epochs"] += 1
        self.iterators[iterator] = [facts, 0, 0]  # its facts, batches and samples delivered this epoch

    def batch(self, iterator: Any, batch: Any) -> None:
        entry = self.iterators.get(iterator)
        if entry is None:
            return
        facts = entry[0]
        entry[1] += 1
        n = _samples(self.probe.torch, batch)
        entry[2] += n
        facts["batches"] += 1
        facts["samples"] += n
        if entry[1] == 1 and facts.get("first_batch_sum") is None:
            facts["first_batch_sum"] = _checksum(self.probe.torch, batch)
        facts["epoch_samples"] = max(facts.get("epoch_samples", 0), entry[2])
        padded = padding(self.probe.torch, batch)
        if padded is not None:
            # token positions the batch carries, and those up to its longest sample (what padding each batch
            # to its own longest would carry)
            facts["padded_positions"] = facts.get("padded_positions", 0) + padded[0] * padded[1]
            facts["longest_positions"] = facts.get("longest_positions", 0) + padded[0] * padded[2]

    # -- written with the records -------------------------------------------------------------
    def flush(self) -> None:
        probe = self.probe
        if self.loaders:
            probe.note(loaders=[dict(f) for f in self.loaders.values()])
        probe.note(**memory(probe.torch, probe.device))


def first_len(value: Any, torch: Any, depth: int = 0) -> int | None:
    """The leading dimension of the first tensor in a batch (a tensor, or a tuple, list or dict of them)."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else None
    if depth > 3:
        return None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            n = first_len(item, torch, depth + 1)
            if n is not None:
                return n
    return None


def padding(torch: Any, batch: Any) -> tuple[int, int, int] | None:
    """A batch of sequences padded to a fixed width: (rows, width, longest), where `longest` is the width up to its
    longest sample, found as the trailing columns in which every row holds one value (the pad id, a mask's
    zero, a label's ignore index). The batch's integer or boolean matrices are read (a dict's values, a tuple's
    items); the widest padding any of them shows beyond its longest sample is taken, unless another matrix of the
    same shape has none (a second input that is really that wide). None when no matrix of sequences is there."""
    items = list(batch.values()) if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    found: dict[tuple[int, int], int] = {}  # shape -> the longest width any matrix of it needs
    for x in items:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.is_floating_point() or x.is_complex():
            continue
        rows, width = x.shape
        if rows < 2 or width < PAD_MIN_WIDTH or x.numel() > PAD_MAX_NUMEL or x.device.type != "cpu":
            continue
        last = x[:, -1]
        if not bool((last == last[0]).all()):
            longest = width  # some row reaches the end: no padding beyond the longest sample
        else:
            real = (~(x == last[0]).all(0)).nonzero()
            longest = int(real[-1]) + 1 if len(real) else 0
        found[(rows, width)] = max(found.get((rows, width), 0), longest)
    if not found:
        return None
    (rows, width), longest = min(found.items(), key=lambda item: item[1] / item[0][1])
    return rows, width, longest


def describe_loader(torch: Any, loader: Any) -> dict[str, Any]:
    """What a DataLoader reads: its dataset (class, where its __getitem__ or __iter__ is, its length), its
    sampler (a DistributedSampler gives each rank its share), batches an epoch, workers; and the world."""
    import inspect

    dataset = loader.dataset
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    method = getattr(type(dataset), "__iter__" if iterable else "__getitem__", None)
    where = None
    try:
        where = f"{os.path.relpath(inspect.getsourcefile(method))}:{inspect.getsourcelines(method)[1]}"
    except (TypeError, OSError):
        pass
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    sampler = inner if inner is not None and type(sampler).__name__ != "DistributedSampler" else sampler
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return {
        "dataset": type(dataset).__name__,
        "dataset_code": where,
        "iterable": iterable,
        "length": _length(dataset),
        # Read in the rank's own process only where the loader reads there anyway: a dataset that opens files
        # lazily in __getitem__ (h5py) must not open them before its workers fork.
        "dataset_sum": None if iterable or loader.num_workers else _first_sample_sum(torch, dataset),
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "sampler_replicas": getattr(sampler, "num_replicas", None),
        "batch_size": loader.batch_size,
        "batches_per_epoch": None if iterable else _length(loader),
        "workers": loader.num_workers,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "collate_fn": _code(getattr(loader, "collate_fn", None)),
        "world": world,
        "epochs": 0,
        "batches": 0,
        "samples": 0,
    }


def _code(function: Any) -> str | None:
    """Where a callable's code is (`file:line (name)`), for a callable object its class's __call__; None for
    torch's own (the default collate)."""
    import inspect

    if function is None:
        return None
    target = function if inspect.isfunction(function) or inspect.ismethod(function) else type(function).__call__
    try:
        path = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return None
    if path is None or any(part in path for part in LIBRARY_PARTS):
        return None
    name = getattr(function, "__qualname__", type(function).__qualname__)
    return f"{os.path.relpath(path)}:{line} ({name})"


def _first_sample_sum(torch: Any, dataset: Any) -> float | None:
    """The checksum of the dataset's first sample: equal on two ranks when they hold the same dataset (not each
    its own shard, a Subset of other indices). Every random stream is restored, so a random augmentation in
    __getitem__ draws as it would have."""
    try:
        with random_streams_kept(torch):
            return _checksum(torch, dataset[0])
    except Exception:
        return None


def _length(value: Any) -> int | None:
    try:
        return len(value)
    except Exception:
        return None


def _samples(torch: Any, batch: Any) -> int:
    return first_len(batch, torch) or 0


def _checksum(torch: Any, batch: Any) -> float | None:
    """The sum of the batch's first CPU tensor: equal on two ranks when they read the same samples in the same
    order (a GPU tensor is not read: that would wait for the device)."""
    value = batch
    for _ in range(4):
        if isinstance(value, dict):
            value = next(iter(value.values()), None)
        elif isinstance(value, (list, tuple)):
            value = value[0] if value else None
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel():
        return round(float(value.double().sum()), 6)
    return None


def memory(torch: Any, device: Any) -> dict[str, Any]:
    """The rank's peak memory and what it may hold: on a GPU the caching allocator's peak against the device's
    memory; on the CPU the process's peak resident set against its limit (an address-space limit, the
    cgroup's, else the machine's memory shared by the local ranks)."""
    if device is not None and torch.cuda.is_initialized():
        return {
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
            "memory_limit_bytes": int(torch.cuda.get_device_properties(device).total_memory),
            "memory_kind": "device",
        }
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    limits = [resource.getrlimit(resource.RLIMIT_AS)[0]]
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        if text != "max":
            limits.append(int(text) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except (OSError, ValueError):
        pass
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    limits = [x for x in limits if x > 0 and x != resource.RLIM_INFINITY] + [machine]
    return {"peak_memory_bytes": int(peak), "memory_limit_bytes": int(min(limits)), "memory_kind": "host"}
