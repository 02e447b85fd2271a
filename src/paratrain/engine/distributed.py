"""Where a rank runs and how it talks to the others.

The launcher decides the placement (backend, device, threads and cores per rank) once for all
ranks; each rank applies its share of it here before it builds anything, so the thread pool and
the CPU affinity are right from the first tensor op.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Placement:
    backend: str                      # gloo | nccl | mpi
    device_type: str                  # cpu | cuda
    threads_per_worker: int
    cpu_sets: Optional[list[list[int]]] = None   # cores of each local rank; None leaves affinity alone
    allreduce: str = "backend"        # shm | backend: how data-parallel ranks average gradients

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    allreduce: str = "backend"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) in place across ranks; a no-op on one rank."""
        if self.distributed:
            dist.all_reduce(tensor)
        return tensor

    def gather_objects(self, obj: object) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def init_rank(placement: Placement) -> RankContext:
    """Apply this rank's placement and join the process group that the launcher's env describes."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))

    if placement.device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    if world_size > 1 and not dist.is_initialized():
        kwargs = {"device_id": device} if placement.device_type == "cuda" else {}
        dist.init_process_group(placement.backend, timeout=timedelta(minutes=10), **kwargs)

    if placement.cpu_sets is not None:
        # Pin the compute thread (and the OpenMP threads it starts later) to this rank's cores, so
        # ranks never time-slice one core. This runs *after* the process group exists on purpose:
        # affinity is per thread on Linux, and gloo's I/O threads, started above, keep the whole
        # CPU set. Pinned onto the compute core too, they made a 250 KB all-reduce take 2.1 ms
        # instead of 0.36 ms on 2 cores (see docs/benchmarks.md).
        os.sched_setaffinity(0, placement.cpu_sets[local_rank])
    torch.set_num_threads(placement.threads_per_worker)
    return RankContext(rank, world_size, local_rank, device, placement.allreduce)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
