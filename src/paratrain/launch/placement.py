"""Deciding where ranks run: backend, device, threads and cores per rank.

On CPU a "worker" is a rank with its own core(s), playing the role a GPU plays. Ranks never share
cores by accident: asking for more threads than the machine has is refused unless the user says
--allow-oversubscribe, because oversubscribed ranks time-slice and every measurement turns to noise.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from paratrain.config import TrainConfig
from paratrain.engine.distributed import Placement
from paratrain.engine.shm_allreduce import shm_supported
from paratrain.errors import UsageError


def available_cores() -> list[int]:
    """The cores this process may run on (respects taskset, cgroups cpusets and SLURM binding)."""
    return sorted(os.sched_getaffinity(0))


def resolve_backend(requested: str, cuda: bool) -> str:
    if requested == "auto":
        return "nccl" if cuda and dist.is_nccl_available() else "gloo"
    checks = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}
    if not checks[requested]():
        hint = "use --backend gloo on CPU" if requested != "gloo" else "install a torch build with gloo"
        raise UsageError(
            f"--backend {requested}: this torch build ({torch.__version__}) has no {requested} support; {hint}"
        )
    if requested == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo on CPU")
    return requested


def resolve_device(requested: str) -> bool:
    """True when the ranks compute on CUDA GPUs."""
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise UsageError(
            "--device cuda: no CUDA GPU is visible to this torch build "
            f"({torch.__version__}); use --device cpu (or auto)"
        )
    return requested == "cuda" or (requested == "auto" and available)


def check_gpus(local_ranks: int, launcher: str | None = None) -> None:
    """Refuse GPU ranks on this machine that would share a GPU (NCCL refuses two ranks on one device).

    Rank `local_rank` computes on CUDA device `local_rank % device_count` (engine/distributed.py).
    Ranks paratrain starts itself (`launcher` None: --workers) see the same devices, so each needs one
    of its own. Ranks that srun or mpirun (`launcher`) started each see their own environment: one
    visible GPU per task is the task's own (`srun --gpus-per-task=1`, or a GPU bound per task), and
    tasks that see several must see at least one each.
    """
    gpus = torch.cuda.device_count()
    if local_ranks <= gpus:
        return
    if launcher is None:
        raise UsageError(
            f"--workers {local_ranks} needs {local_ranks} GPUs but {gpus} are visible; use --workers {gpus} or fewer"
        )
    if gpus > 1:
        raise UsageError(
            f"{launcher} started {local_ranks} tasks on this machine and each sees the same {gpus} GPUs, so "
            f"ranks would share one; bind one GPU per task (srun --gpus-per-task=1) or start {gpus} tasks per machine"
        )


def plan_placement(cfg: TrainConfig) -> Placement:
    cuda = resolve_device(cfg.device)
    backend = resolve_backend(cfg.backend, cuda)
    cores = available_cores()
    if cfg.allreduce == "shm" and cuda:
        raise UsageError(
            "--allreduce shm is for CPU ranks; on GPUs the gradients go through NCCL (use --allreduce auto)"
        )
    if cfg.allreduce == "shm" and not shm_supported():
        raise UsageError(
            "--allreduce shm needs Linux on x86-64 (/dev/shm and its store ordering); use --allreduce backend"
        )
    if cfg.allreduce == "shm" and cfg.nodes > 1:
        raise UsageError(
            "--allreduce shm averages between the ranks of one host and --nodes puts them on several; "
            "use --allreduce auto (the process group's backend)"
        )
    # Cores and GPUs are this machine's; across nodes each node places its own share of the ranks.
    local = cfg.workers_per_node
    across = {
        "timeout_s": cfg.timeout,
        "node_rank": cfg.node_rank if cfg.nodes > 1 else None,
        "spans_hosts": cfg.nodes > 1,
        "store_host": cfg.rdzv.rpartition(":")[0].strip("[]") if cfg.nodes > 1 and cfg.max_restarts else None,
    }
    if cuda:
        check_gpus(local)
        threads = cfg.threads_per_worker or max(1, len(cores) // local)
        return Placement(backend=backend, device_type="cuda", threads_per_worker=threads, **across)

    threads, cpu_sets = core_sets(local, cfg.threads_per_worker, cfg.allow_oversubscribe, cores)
    # Waiting ranks poll shared memory; that is free only when each rank has cores of its own, and
    # it reaches only the ranks of one host.
    own_cores = cpu_sets is not None and cfg.workers > 1 and cfg.nodes == 1
    allreduce = (
        "shm" if cfg.allreduce == "shm" or (cfg.allreduce == "auto" and own_cores and shm_supported()) else "backend"
    )
    return Placement(
        backend=backend, device_type="cpu", threads_per_worker=threads, cpu_sets=cpu_sets, allreduce=allreduce, **across
    )


def core_sets(
    workers: int, threads_per_worker: int | None, allow_oversubscribe: bool, cores: list[int]
) -> tuple[int, list[list[int]] | None]:
    """Threads per rank and each rank's own cores (None when they must share: oversubscribed)."""
    threads = threads_per_worker or len(cores) // workers
    needed = workers * max(threads, 1)
    if needed > len(cores) and not allow_oversubscribe:
        if workers > len(cores):
            raise UsageError(
                f"--workers {workers} needs at least {workers} cores but this machine gives {len(cores)}; "
                f"use --workers {len(cores)} or fewer (or --allow-oversubscribe to time-slice)"
            )
        raise UsageError(
            f"--workers {workers} x --threads-per-worker {threads} = {needed} threads on {len(cores)} cores; "
            f"use --threads-per-worker {len(cores) // workers} (or --allow-oversubscribe)"
        )
    threads = max(threads, 1)
    return threads, [cores[i * threads : (i + 1) * threads] for i in range(workers)] if needed <= len(cores) else None
