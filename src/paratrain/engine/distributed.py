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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.distributed_c10d import _set_pg_timeout  # torch's own setter, used by its tests

STARTUP_TIMEOUT_S = 600.0  # torch's own default for gloo collectives, for the waits before training

# The process groups this rank made beside the default one (device meshes' dimensions, the pipeline's
# groups): bound_collectives bounds them with the default group, and shutdown forgets them with it.
_GROUPS: list[dist.ProcessGroup] = []


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

    if world_size > 1 and placement.spans_hosts and "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo listens on the address the host name resolves to, which may be one the other
        # machines cannot reach (Debian maps it to 127.0.1.1): use the interface that reaches rank
        # 0's host instead (a GLOO_SOCKET_IFNAME set by the user wins). Under NCCL too: the groups
        # that keep object collectives in host memory are gloo's (host_group).
        interface = interface_of(address_towards(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    if world_size > 1 and not dist.is_initialized():
        kwargs = {"device_id": device} if placement.device_type == "cuda" else {}
        # Until training starts, ranks may legitimately be far apart (loading data, building the
        # model on a busy machine): the start-up waits get at least STARTUP_TIMEOUT_S; the loop
        # then bounds every collective by --timeout (bound_collectives).
        dist.init_process_group(placement.backend, timeout=startup_timeout(placement.timeout_s), **kwargs)

    if placement.cpu_sets is not None:
        # Pin the compute thread (and the OpenMP threads it starts later) to this rank's cores, so
        # ranks never time-slice one core. This runs *after* the process group exists on purpose:
        # affinity is per thread on Linux, and gloo's I/O threads, started above, keep the whole
        # CPU set. Pinned onto the compute core too, they made a 250 KB all-reduce take 2.1 ms
        # instead of 0.36 ms on 2 cores (see docs/benchmarks.md).
        os.sched_setaffinity(0, placement.cpu_sets[local_rank])
    torch.set_num_threads(placement.threads_per_worker)
    return RankContext(rank, world_size, local_rank, device, placement.allreduce, placement.timeout_s)


def join_group_of_one(device: torch.device) -> None:
    """A process group of this rank alone, where it joined none (one worker): DDP and FSDP2 wrap a model only
    inside a group, so that one rank runs their code path (and writes checkpoints any number of ranks resume)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def startup_timeout(seconds: float) -> timedelta:
    """How long a collective may wait for a peer before training starts (init_rank); bound_collectives
    then brings every group down to --timeout."""
    return timedelta(seconds=max(seconds, STARTUP_TIMEOUT_S))


def new_group(ctx: RankContext, ranks: list[int] | None = None, backend: str | None = None) -> dist.ProcessGroup:
    """dist.new_group with the run's timeout: torch gives a new group its backend's default (10 minutes
    for NCCL, 30 for gloo), not the default group's. Every rank calls it, in the same order."""
    group = dist.new_group(ranks, timeout=startup_timeout(ctx.timeout_s), backend=backend)
    if group is not dist.GroupMember.NON_GROUP_MEMBER:
        _GROUPS.append(group)
    return group


def device_mesh(ctx: RankContext, shape: tuple[int, ...], names: tuple[str, ...] | None, seed: int) -> DeviceMesh:
    """A device mesh of the rank's device type whose process groups wait as long as the default one
    (torch's init_device_mesh gives each new group its backend's default), and DTensor's random
    generator seeded over it (seed_dtensor_random). Every rank calls it, in the same order."""
    mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=names)
    for group in mesh.get_all_groups():
        _set_pg_timeout(startup_timeout(ctx.timeout_s), group)
        _GROUPS.append(group)
    seed_dtensor_random(mesh, seed, ctx.device)
    return mesh


def seed_dtensor_random(mesh: DeviceMesh, seed: int, device: torch.device) -> None:
    """DTensor's random-number tracker, built now on every rank of the mesh, seeded alike, on this
    rank's own device (torchtitan's set_determinism calls the same torch function).

    Left to itself, DTensor builds the tracker at the first random op on a DTensor (dropout, an
    initialisation) and broadcasts rank 0's generator state over the world group: where only some
    ranks run such an op (pipeline stages under --tp with dropout), the others never join and the run
    hangs. torch also puts the tracker on device (global rank % device count), which is another GPU
    than the rank's own when a node runs fewer ranks than it has GPUs. CPU meshes have no tracker
    (their random ops draw from each rank's own generator)."""
    from torch.distributed.tensor import _random

    if mesh.device_type == "cpu":
        return
    _random.manual_seed(seed, mesh)  # builds the tracker without the broadcast; torch.manual_seed(seed)
    _random._rng_tracker._device = device  # the device it forks and sets the generator state of


def host_group(ctx: RankContext) -> dist.ProcessGroup | None:
    """A process group of all ranks whose object collectives keep their buffers in host memory: None
    (the default group) when that is gloo, else a new gloo group. Every rank calls it, in the same order."""
    if dist.get_backend() == "gloo":
        return None
    return new_group(ctx, backend="gloo")


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a tensor handed to `group`'s collectives must be: on this rank's current GPU under NCCL
    (where torch's own object collectives put theirs: torch.cuda.current_device(), which init_rank
    set), in host memory otherwise."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bound_collectives(seconds: float) -> None:
    """From now on a collective of any group this rank made waits at most `seconds` for a peer: one
    that stops answering (killed, stopped, cut off) fails the waiting rank instead of hanging it."""
    if dist.is_initialized():
        for group in (None, *_GROUPS):
            _set_pg_timeout(timedelta(seconds=seconds), group)


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
    _GROUPS.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
