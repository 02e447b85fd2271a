"""Where a rank runs and how it talks to the others.

The launcher decides the placement (backend, device, threads and cores per rank) once for all
ranks; each rank applies its share of it here before it builds anything, so the thread pool and
the CPU affinity are right from the first tensor op.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

STARTUP_TIMEOUT_S = 600.0  # torch's own default for gloo collectives, for the waits before training


@dataclass(frozen=True)
class Placement:
    backend: str  # gloo | nccl | mpi
    device_type: str  # cpu | cuda
    threads_per_worker: int
    cpu_sets: list[list[int]] | None = None  # cores of each local rank; None leaves affinity alone
    allreduce: str = "backend"  # shm | backend: how data-parallel ranks average gradients
    timeout_s: float = 600.0  # how long a collective may wait for a peer (--timeout)
    node_rank: int | None = (
        None  # --node-rank of a run across nodes: global rank = node_rank x ranks per node + local rank
    )
    spans_hosts: bool = False  # the ranks are on several machines (--nodes, srun or mpirun across nodes)
    store_host: str | None = (
        None  # node 0's address, where rank 0 hosts each attempt's store (--nodes with --max-restarts)
    )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    allreduce: str = "backend"
    timeout_s: float = 600.0  # --timeout: how long a collective waits for a peer

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

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's `obj` on every rank (other ranks pass anything)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

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
    if placement.node_rank is not None:
        # The rendezvous numbers nodes in the order of their addresses; paratrain numbers them by
        # --node-rank, so node 0 holds global rank 0 (which writes the run directory) on every
        # start and restart. Any numbering that every rank agrees on is a valid process group.
        rank = placement.node_rank * int(os.environ["LOCAL_WORLD_SIZE"]) + local_rank
        os.environ["RANK"] = str(rank)
        if placement.store_host is not None:
            # Rank 0 hosts the store (launch/local.py: a fresh one per attempt), and rank 0 is on
            # node 0, whichever node the rendezvous put first and published as MASTER_ADDR.
            os.environ["MASTER_ADDR"] = placement.store_host

    if placement.device_type == "cuda":
        # Modulo the devices this rank sees: a task that srun bound to one GPU (--gpus-per-task=1)
        # sees it as device 0 whatever its local rank; ranks that see every GPU of the machine get
        # one each (placement refuses more local ranks than GPUs there: launch/placement.py).
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    if (
        world_size > 1
        and placement.spans_hosts
        and placement.backend == "gloo"
        and "GLOO_SOCKET_IFNAME" not in os.environ
    ):
        # gloo listens on the address the host name resolves to, which may be one the other
        # machines cannot reach (Debian maps it to 127.0.1.1): use the interface that reaches rank
        # 0's host instead (a GLOO_SOCKET_IFNAME set by the user wins).
        interface = interface_of(address_towards(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    if world_size > 1 and not dist.is_initialized():
        kwargs = {"device_id": device} if placement.device_type == "cuda" else {}
        # Until training starts, ranks may legitimately be far apart (loading data, building the
        # model on a busy machine): the start-up waits get at least STARTUP_TIMEOUT_S; the loop
        # then bounds every collective by --timeout (bound_collectives).
        dist.init_process_group(
            placement.backend, timeout=timedelta(seconds=max(placement.timeout_s, STARTUP_TIMEOUT_S)), **kwargs
        )

    if placement.cpu_sets is not None:
        # Pin the compute thread (and the OpenMP threads it starts later) to this rank's cores, so
        # ranks never time-slice one core. This runs *after* the process group exists on purpose:
        # affinity is per thread on Linux, and gloo's I/O threads, started above, keep the whole
        # CPU set. Pinned onto the compute core too, they made a 250 KB all-reduce take 2.1 ms
        # instead of 0.36 ms on 2 cores (see docs/benchmarks.md).
        os.sched_setaffinity(0, placement.cpu_sets[local_rank])
    torch.set_num_threads(placement.threads_per_worker)
    return RankContext(rank, world_size, local_rank, device, placement.allreduce, placement.timeout_s)


def host_group() -> dist.ProcessGroup | None:
    """A process group of all ranks whose object collectives keep their buffers in host memory: None
    (the default group) when that is gloo, else a new gloo group. Every rank calls it, in the same order."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def bound_collectives(seconds: float) -> None:
    """From now on a collective of the default group waits at most `seconds` for a peer: one that
    stops answering (killed, stopped, cut off) fails the waiting rank instead of hanging it."""
    if dist.is_initialized():
        from torch.distributed.distributed_c10d import _set_pg_timeout  # torch's own setter, used by its tests

        _set_pg_timeout(timedelta(seconds=seconds))


def address_towards(host: str, port: int) -> str:
    """This machine's address on its route to `host`. A UDP socket "connected" there sends nothing:
    the kernel only picks the route, and with it the source address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def interface_of(address: str) -> str | None:
    import psutil

    return next((name for name, addrs in psutil.net_if_addrs().items() for a in addrs if a.address == address), None)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
