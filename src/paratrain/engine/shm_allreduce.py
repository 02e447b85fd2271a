"""Gradient averaging through shared memory, for data-parallel ranks on one CPU host.

Why not gloo: between two local CPU ranks gloo sends the gradients over TCP loopback and its I/O
threads must be woken by the kernel at each step. For the tutorial CNN (248 KB of gradients) that
left 1.5-2.3 ms of exposed communication per 14 ms step, most of it waiting for a thread to be
scheduled, not moving bytes (docs/benchmarks.md). Here the ranks map one segment of `/dev/shm`,
and a rank that waits for the others polls a counter in it: each CPU rank owns its core(s), so
polling costs nothing that would otherwise run, and nobody has to be woken.

Per chunk of at most `chunk_bytes` (a reduce-scatter, then an all-gather):
  1. every rank copies its chunk into its own input slot, then arrives at barrier 0;
  2. rank r sums slice r of every input slot, in rank order, into the result (fp16 in float32,
     which a sum of gradients could overflow), divides by the world size, then arrives at barrier 1;
  3. every rank copies the whole result back into its gradients.
All ranks copy the same result bytes, so replicas stay bit-identical whatever the world size.
One set of slots is enough: a rank writes its input for the next chunk only after barrier 1,
when every rank has finished reading the inputs, and writes the result only after the next
barrier 0, when every rank has finished copying the previous result out.

The barriers are counters that only grow, each on its own cache line. A rank stores its counter
after its data; another rank that sees the counter therefore sees the data, because x86-64 makes
every core's stores visible to the others in program order. That guarantee is why this path is
x86-64 only: elsewhere the process group's backend is used.

Nothing in torch.distributed or its CPU backends does this (gloo has no shared-memory transport);
DeepSpeed and Intel's oneCCL bindings have one in compiled code that does not match every torch
release, so this is written by hand in ~100 lines of torch operations.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import tempfile
import time

import torch
import torch.distributed as dist

log = logging.getLogger("paratrain.rank")

CHUNK_BYTES = 4 << 20  # large enough to amortise two barriers, small enough for a 64 MB /dev/shm
_LINE = 64  # bytes: one counter per cache line, so ranks never write the same line
_SHM_DIR = "/dev/shm"


def shm_supported() -> bool:
    """Shared-memory averaging relies on x86-64's store ordering and on Linux's /dev/shm."""
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(_SHM_DIR)


def segment_bytes(world_size: int, chunk_bytes: int) -> int:
    return (world_size + 1) * chunk_bytes + 2 * world_size * _LINE


class SharedMemoryAverage:
    """Averages a flat tensor across the ranks that mapped the same segment."""

    def __init__(self, path: str, rank: int, world_size: int, chunk_bytes: int = CHUNK_BYTES, timeout_s: float = 600.0):
        self.rank, self.world_size, self.chunk_bytes, self.timeout_s = rank, world_size, chunk_bytes, timeout_s
        raw = torch.from_file(path, shared=True, size=segment_bytes(world_size, chunk_bytes), dtype=torch.uint8)
        data = world_size * chunk_bytes
        self._inputs = raw[:data].view(world_size, chunk_bytes)
        self._result = raw[data : data + chunk_bytes]
        counters = raw[data + chunk_bytes :].view(torch.int64).view(2, world_size, _LINE // 8)
        self._arrived = counters[:, :, 0].numpy()  # a view: reads see the other ranks' stores
        self._calls = 0  # chunks averaged so far; the segment starts zeroed

    def average_(self, flat: torch.Tensor) -> torch.Tensor:
        """Replace `flat` (1-D, contiguous, the same size on every rank) by its mean over the ranks."""
        per_chunk = self.chunk_bytes // flat.element_size()
        inputs = self._inputs.view(flat.dtype)
        result = self._result.view(flat.dtype)
        world, rank = self.world_size, self.rank
        for start in range(0, flat.numel(), per_chunk):
            piece = flat[start : start + per_chunk]
            n = piece.numel()
            self._calls += 1
            inputs[rank, :n].copy_(piece)
            self._arrive(0)
            lo, hi = n * rank // world, n * (rank + 1) // world
            mine = result[lo:hi]
            if flat.dtype == torch.float16:
                # fp16 overflows above 65,504: the sum of N gradients can where their mean cannot.
                total = inputs[0, lo:hi].float()
                for other in range(1, world):
                    total.add_(inputs[other, lo:hi])
                mine.copy_(total.div_(world))
            else:
                torch.add(inputs[0, lo:hi], inputs[1, lo:hi], out=mine)
                for other in range(2, world):
                    mine.add_(inputs[other, lo:hi])
                mine.div_(world)
            self._arrive(1)
            piece.copy_(result[:n])
        return flat

    def _arrive(self, barrier: int) -> None:
        counters, calls = self._arrived[barrier], self._calls
        counters[self.rank] = calls
        if (counters >= calls).all():
            return
        deadline = time.monotonic() + self.timeout_s
        while not (counters >= calls).all():
            # Hands the core over only if something else (a loader worker, an oversubscribed
            # rank) is waiting for it; otherwise returns at once and the poll goes on.
            os.sched_yield()
            if time.monotonic() > deadline:
                missing = ", ".join(str(r) for r in range(self.world_size) if counters[r] < calls)
                raise TimeoutError(
                    f"shared-memory all-reduce: rank(s) {missing} did not arrive within --timeout "
                    f"{self.timeout_s:g} s (stopped, hung or dead)"
                )


def open_shared_average(
    rank: int, world_size: int, chunk_bytes: int = CHUNK_BYTES, timeout_s: float = 600.0
) -> SharedMemoryAverage | None:
    """Collective: rank 0 creates the segment, every rank maps it. None (on every rank) when any
    rank cannot map it, e.g. because the ranks are on different hosts or /dev/shm is too small."""
    size = segment_bytes(world_size, chunk_bytes)
    path: str | None = None
    if rank == 0:
        try:
            if shutil.disk_usage(_SHM_DIR).free >= 2 * size:
                fd, path = tempfile.mkstemp(prefix="paratrain-allreduce-", dir=_SHM_DIR)
                os.ftruncate(fd, size)
                os.close(fd)
        except OSError as exc:
            log.warning("shared-memory all-reduce unavailable: %s", exc)
            path = None
    box = [path]
    dist.broadcast_object_list(box, src=0)
    path = box[0]
    engine: SharedMemoryAverage | None = None
    if path is not None and os.path.exists(path):
        try:
            engine = SharedMemoryAverage(path, rank, world_size, chunk_bytes, timeout_s)
        except (OSError, RuntimeError) as exc:
            log.warning("rank %d cannot map %s: %s", rank, path, exc)
    everyone = torch.tensor([1 if engine is not None else 0])
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)  # also: every rank has mapped it by now
    if rank == 0 and path is not None:
        os.unlink(path)  # the mappings live on; nothing to clean up later
    return engine if everyone.item() == 1 else None
