"""Peak memory of one run on one rank, not of the process's whole life.

A rank can run inside a process that trained before (`--workers 1` runs in the calling process:
scaling studies, sweeps' in-process trials, notebooks). Both counters paratrain reads are
high-water marks that never go down by themselves, so each run resets them when it starts:
- GPUs: `torch.cuda.max_memory_allocated`, reset by `torch.cuda.reset_peak_memory_stats`; at the
  end the caching allocator's blocks go back to the driver (`torch.cuda.empty_cache`) so the next
  run in the process starts from what it allocates itself.
  The reset comes before the rank builds its model, so the peak holds everything the run put in
  memory: the whole model where it was built whole, only the shards where fsdp built it on the
  meta device and materialised its own part (engine/strategies/fsdp.py).
- CPU: the process's peak resident set (`VmHWM` in /proc/self/status) less the pages it maps from
  files (`RssFile`: the libraries' code, which the page cache decides, see `peak_rss_bytes`), reset by
  writing 5 to /proc/self/clear_refs (Linux 4.0 and newer); elsewhere `ru_maxrss`, which cannot be reset.

`MemoryMeter` adds where the memory goes, per rank (summary.json's `memory` block): the bytes of
the parameters, gradients and optimizer state the rank holds, counted from its own tensors (the
local shard of a DTensor, ZeRO's own partition of the optimizer state, a pipeline stage's layers),
and the peak of the tensors autograd saved for backward during one step. It measures one step of
the run (the second of the launch), so the other steps pay nothing.

`limit_rank_memory` bounds a CPU rank's memory (--memory-limit) with RLIMIT_DATA; see its docstring.
"""

from __future__ import annotations

import re
import resource
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from paratrain.workloads.models import SELECTIVE_OBSERVERS

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_memory(device: torch.device) -> None:
    """Start counting this run's peak from what is resident now."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:  # the host's peak too: summary.json's memory block reports it on GPU ranks as well
        _CLEAR_REFS.write_text("5")
    except OSError:
        pass  # no /proc (not Linux) or not allowed: the peak then covers the process's life


def peak_memory_bytes(device: torch.device) -> int:
    """The largest memory this run has held on `device` since `reset_peak_memory`."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """The process's peak resident memory since `reset_peak_memory`, less the pages it maps from files.

    VmHWM counts every resident page, the shared libraries' among them. Those are shared by every rank on
    the host, the kernel drops them under pressure, RLIMIT_DATA (--memory-limit) does not count them, and
    how many a process has mapped depends on the page cache, not on the run: the same rank held 81 MiB of
    them with torch installed a day before, 119 MiB with torch installed minutes before (a fresh clone's
    venv, as in CI), and its peak moved with them. So the file-backed pages resident at the reading
    (`RssFile`) are subtracted: the peak's own, but for code first run after the peak."""
    try:
        status = _STATUS.read_text()
    except OSError:
        status = ""
    peak, files = (re.search(rf"^{name}:\s+(\d+) kB", status, re.MULTILINE) for name in ("VmHWM", "RssFile"))
    if peak:
        return (int(peak.group(1)) - (int(files.group(1)) if files else 0)) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def release_cached_memory(device: torch.device) -> None:
    """Give the caching allocator's free blocks back, so the next run in this process is not charged."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- where a rank's memory goes ------------------------------------------------------------------


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The memory a tensor holds on this rank: a DTensor's local shard, and whatever tensor a wrapper subclass
    wraps (a shard can itself be functional collectives' AsyncCollectiveTensor while its collective runs, as
    tensor parallelism's input to a pipeline stage is); a wrapper's own storage is no memory and cannot be read."""
    while is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        tensor = getattr(tensor, names[0])
    return tensor


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind `tensors`, each storage once: a gradient that is a view into a
    DDP bucket counts as (its share of) the bucket, an FSDP shard with its padding."""
    seen: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        local = _local(tensor)
        if local.device.type == "meta":
            continue
        seen[_storage_key(local)] = local.untyped_storage().nbytes()
    return sum(seen.values())


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    # ZeroRedundancyOptimizer keeps this rank's partition in its local optimizer, `optim`; its own
    # `state` stays empty.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    for state in local.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state this rank holds, in bytes."""
    params = list(model.parameters())
    return {
        "parameters_bytes": storage_bytes(params),
        "gradients_bytes": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_bytes": storage_bytes(_optimizer_tensors(optimizer)),
    }


class SavedTensorPeak:
    """The peak bytes of tensors autograd saves for backward, while `watch()` is active.

    Each saved tensor is packed into a `_Saved` holder; autograd frees the holder when the graph
    releases it (after the node's backward ran), so the live total falls during backward and the
    maximum is a true peak. A storage saved several times (a tensor and its views) counts once;
    parameters (and views of them) are not activations and are skipped.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._refs: dict[tuple[str, int], list[int]] = {}  # storage -> [saved tensors alive, bytes]
        self._kept: list[Any] = []  # what --checkpoint-activations-ops keeps, held until the watch ends

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Saved tensors, and the op outputs --checkpoint-activations-ops keeps outside autograd's graph (in
        torch.utils.checkpoint's own store, freed as backward uses them; counted here until the micro-step's
        backward is over, which leaves the peak, reached at the end of forward, as it is)."""
        SELECTIVE_OBSERVERS.append(self._keep)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield
        finally:
            SELECTIVE_OBSERVERS.remove(self._keep)
            self._kept.clear()

    def _keep(self, op: Any, args: tuple, kwargs: dict, output: Any, saved: bool) -> None:
        if saved:
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            self._kept += [self._pack(t) for t in outputs if isinstance(t, torch.Tensor)]

    def _pack(self, tensor: torch.Tensor) -> Any:
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return tensor
        local = _local(tensor)
        key = _storage_key(local)
        ref = self._refs.get(key)
        if ref is None:
            ref = self._refs[key] = [0, local.untyped_storage().nbytes()]
            self.live += ref[1]
            self.peak = max(self.peak, self.live)
        ref[0] += 1
        return _Saved(tensor, self, key)

    def _release(self, key: tuple[str, int]) -> None:
        ref = self._refs[key]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[key]


class _Saved:
    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: torch.Tensor, meter: SavedTensorPeak, key: tuple[str, int]):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter._release(self.key)


def _unpack(packed: Any) -> torch.Tensor:
    return packed.tensor if isinstance(packed, _Saved) else packed


MEMORY_FIELDS = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes", "rss_peak_bytes")


class MemoryMeter:
    """Where one rank's memory goes, measured on one optimizer step (`step`, counted from 0).

    During that step's forward and backward (all its micro-steps) the saved tensors are watched;
    after its optimizer step, while the gradients still exist, the parameters, gradients and
    optimizer state are counted. The step is the second of the launch (the first creates the
    optimizer's state), or the only one; when an epoch ends in a step smaller than the batch (the batch
    does not divide a rank's share of the data), never that step while a full one follows: its
    activations are not the batch's, and find-batch's figures would fall as the batch grows.
    """

    def __init__(self, first_step: int, last_step: int, steps_per_epoch: int = 1, epochs_end_full: bool = True):
        full_steps = (s for s in range(first_step + 1, last_step) if epochs_end_full or (s + 1) % steps_per_epoch)
        self.step = next(full_steps, first_step)
        self.activations = SavedTensorPeak()
        self.held: dict[str, int] | None = None

    def watch(self, step: int) -> AbstractContextManager:
        """The context for one micro-step's forward and backward of optimizer step `step`."""
        return self.activations.watch() if step == self.step else nullcontext()

    def count(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Called after each optimizer step, before the gradients are dropped."""
        if step == self.step:
            self.held = held_bytes(model, optimizer)

    def figures(self) -> dict[str, int | None]:
        """This rank's five figures (None for the step figures when the step was never reached)."""
        held = self.held or {}
        return {
            "parameters_bytes": held.get("parameters_bytes"),
            "gradients_bytes": held.get("gradients_bytes"),
            "optimizer_bytes": held.get("optimizer_bytes"),
            "activations_peak_bytes": self.activations.peak if self.held is not None else None,
            "rss_peak_bytes": peak_rss_bytes(),
        }


def per_rank(figures: list[dict[str, int | None]]) -> dict[str, list[int | None]]:
    """Every rank's figures (in rank order) as summary.json's `memory` block: one list per figure."""
    return {name: [rank[name] for rank in figures] for name in MEMORY_FIELDS}


# -- --memory-limit ---------------------------------------------------------------------------------

# The environment of ranks started under --memory-limit. glibc's malloc serves large blocks with
# mmap and hands them back to the system when freed, but it raises that threshold (up to 32 MiB)
# each time such a block is freed, after which blocks of that size come from its heap and stay
# counted by RLIMIT_DATA after they are freed. Measured here: an fsdp rank, which then built the
# whole model before it kept its shards (now it builds on the meta device), failed under a 1.5G limit with the moving
# threshold and
# trained (peak RSS 1.28 GB) with it fixed at 128 KiB, glibc's default. Setting it fixes it.
LIMITED_RANK_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def limit_rank_memory(limit_bytes: int) -> None:
    """Bound this process's memory to `limit_bytes` with RLIMIT_DATA.

    RLIMIT_DATA (Linux 4.7 and newer) caps the process's private writable memory: the heap and
    anonymous mappings, which is where tensors live; shared libraries, thread stacks and the
    address space that allocators merely reserve do not count, so torch and gloo start under a
    limit near what the rank really uses (RLIMIT_AS would also count the hundreds of MiB of
    reserved address space). An allocation past the limit fails cleanly (torch raises
    "DefaultCPUAllocator: can't allocate memory") instead of the kernel's OOM killer ending the
    rank with SIGKILL, as a cgroup's memory.max would; it needs no privileges either. Only ranks
    started in their own process get a limit (launch starts even one rank in its own process then).
    """
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (on the host: the memory limit was reached)."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))
