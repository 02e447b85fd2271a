"""Runs that span machines: ranks started by srun or mpirun, and which process writes the run.

Three ways a run's ranks get started, and what each process of it is:

- `paratrain train --workers N` on one machine: this process's elastic agent starts N ranks
  (launch/local.py).
- `--nodes N --node-rank R --rdzv HOST:PORT`, one command per machine: each machine's agent
  starts its share of the ranks and the agents meet at torch elastic's c10d rendezvous on node 0
  (launch/local.py, `rendezvous`). Under `srun` with one task per node, paratrain reads those three
  values from SLURM's variables, so `srun --ntasks-per-node=1 paratrain train --workers 8` works
  without them.
- `srun -n N paratrain train` (several tasks per node) or `mpirun -n N paratrain train`: the
  launcher has already started one process per rank, so each process IS a rank: it takes its
  rank, the world size and its local rank from the launcher's variables, finds rank 0's host, and
  runs its rank in place (no agent). SLURM pins tasks itself (`--cpu-bind`), and Open MPI binds
  its processes by default, so paratrain leaves every such rank's cores as the launcher set them.

Whichever way, global rank 0 (node 0's first rank) writes config.json, metrics.jsonl, the
checkpoints and summary.json; other processes only add their logs/rank<R>.log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.config import TrainConfig, validate
from paratrain.engine.distributed import Placement
from paratrain.errors import UsageError
from paratrain.launch.local import RanksFailed, launch_local, scoped_environ, worker_env
from paratrain.launch.placement import available_cores, check_gpus, resolve_backend, resolve_device


@dataclass(frozen=True)
class Tasks:
    """The processes an external launcher started, as this one sees them."""

    launcher: str  # "srun" or "mpirun"
    rank: int  # this process's index among all of them
    size: int  # how many there are
    local_rank: int  # its index among those on this machine
    local_size: int  # how many are on this machine
    node: int  # this machine's index (SLURM_NODEID; mpirun: unknown, 0)
    nodes: int  # machines taking part (mpirun: unknown, 1)
    master_addr: str | None  # the host of rank 0 (None: the environment does not say)
    master_port: int
    job: str  # the launcher's job id, for a default run directory every process agrees on
    cpus_per_task: int | None = None


def detect_tasks(env: Mapping[str, str]) -> Tasks | None:
    """The srun step or mpirun job this process belongs to, from its environment; None outside one.

    srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_NODES,
    SLURM_STEP_TASKS_PER_NODE and SLURM_STEP_NODELIST exist only inside a job step, so a batch
    script (the job's first step, SLURM_PROCID 0) is not mistaken for a rank of one. Open MPI:
    OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; MPICH and Intel MPI (Hydra):
    PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS. MASTER_ADDR/MASTER_PORT, when set, win.
    """
    port = env.get("MASTER_PORT")
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        job = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
        node = _int(env, "SLURM_NODEID", 0)
        per_node = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1")
        nodes = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES") or len(per_node)
        hosts = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        cpus = env.get("SLURM_CPUS_PER_TASK")
        return Tasks(
            "srun",
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_STEP_NUM_TASKS"),
            _int(env, "SLURM_LOCALID", 0),
            per_node[min(node, len(per_node) - 1)],
            node,
            nodes,
            env.get("MASTER_ADDR") or (first_host(hosts) if hosts else None),
            # A port of the job's own: two jobs sharing a first node must not pick the same one.
            _int(env, "MASTER_PORT") if port else 29500 + (_int(env, "SLURM_JOB_ID") or 0) % 2000,
            job,
            int(cpus) if cpus and cpus.isdigit() else None,
        )
    for rank, size, local_rank, local_size in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ):
        if rank in env and size in env:
            world = _int(env, size)
            local = _int(env, local_size, world)
            # Every process of one job sees the same job id: Open MPI 5 (PMIx), 4, Hydra.
            job = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or env.get("PMI_JOBID") or "0"
            # All ranks on this machine: rank 0 is here too. Across machines only the user knows.
            here = "127.0.0.1" if local == world else None
            return Tasks(
                "mpirun",
                _int(env, rank),
                world,
                _int(env, local_rank, 0),
                local,
                0,
                1,
                env.get("MASTER_ADDR") or here,
                _int(env, "MASTER_PORT") if port else 29500 + zlib.crc32(job.encode()) % 2000,
                job,
            )
    return None


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """A launcher's variable as a number; one line naming it when it is not one."""
    text = env.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(
            f"{name}={text!r} in the environment is not a number; unset it or set it to the launcher's value"
        ) from None


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed counts: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts or [1]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[003-005,009],login1' -> 'gpu003'.

    `scontrol show hostnames` is the authority where it is installed; the few lines here read the
    same list on a machine without SLURM's tools (and in the tests).
    """
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10
            )
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", nodelist.strip())
    if not match:
        return nodelist
    prefix, ranges, suffix = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"


def adopt_tasks(cfg: TrainConfig, env: Mapping[str, str] = os.environ) -> tuple[TrainConfig, Tasks | None]:
    """Fit the configuration to the srun or mpirun job this process is part of.

    Returns the tasks when each of them is a rank (they run in place, `run_ranks`); None when
    this process launches ranks itself: outside srun and mpirun, with one task (`srun -n 1`), or
    with one task per node, which then becomes this node's agent of a run across nodes.
    """
    tasks = detect_tasks(env)
    if tasks is None or tasks.size == 1 or cfg.nodes > 1:
        return cfg, None  # --nodes given: the command says where it runs (as `paratrain slurm`'s scripts do)
    given_workers = "workers" in cfg.model_fields_set
    if tasks.launcher == "srun" and tasks.local_size == 1 and tasks.nodes > 1:
        if tasks.master_addr is None:
            raise UsageError(
                "srun gives no node list (SLURM_STEP_NODELIST); pass --nodes, --node-rank and --rdzv yourself"
            )
        across = {
            "workers": cfg.workers if given_workers else tasks.nodes,
            "nodes": tasks.nodes,
            "node_rank": tasks.node,
            "rdzv": f"{tasks.master_addr}:{tasks.master_port}",
        }
        return validate(TrainConfig, {**cfg.model_dump(exclude_unset=True), **across}), None
    if cfg.max_restarts:
        raise UsageError(
            f"--max-restarts needs paratrain's own agent on each node, and {tasks.launcher} started every rank "
            "itself; start one task per node (srun --ntasks-per-node=1 ... --workers N), or drop --max-restarts"
        )
    if given_workers and cfg.workers != tasks.size:
        raise UsageError(
            f"{tasks.launcher} started {tasks.size} processes, each one rank, and --workers says {cfg.workers}; "
            f"drop --workers ({tasks.launcher} decides), or start {cfg.workers} processes"
        )
    if tasks.master_addr is None and cfg.backend != "mpi":
        raise UsageError(
            f"{tasks.launcher} spans machines and its environment does not say where rank 0 runs; export "
            "MASTER_ADDR=<rank 0's host> and MASTER_PORT=<a free port> to every rank (mpirun -x MASTER_ADDR "
            "-x MASTER_PORT), or use --backend mpi with a torch built with MPI"
        )
    return validate(TrainConfig, {**cfg.model_dump(exclude_unset=True), "workers": tasks.size}), tasks


def task_placement(cfg: TrainConfig, tasks: Tasks) -> Placement:
    """A rank started by srun or mpirun keeps the cores its launcher bound it to; its threads are
    --threads-per-worker, else srun's --cpus-per-task, else its cores shared by the ranks on its machine."""
    cuda = resolve_device(cfg.device)
    backend = resolve_backend(cfg.backend, cuda)
    if cuda:
        check_gpus(tasks.local_size, tasks.launcher)
    if cfg.allreduce == "shm" and tasks.local_size != tasks.size:
        raise UsageError(
            "--allreduce shm averages between the ranks of one host and these ranks span several; use --allreduce auto"
        )
    threads = cfg.threads_per_worker or tasks.cpus_per_task or max(1, len(available_cores()) // tasks.local_size)
    return Placement(
        backend=backend,
        device_type="cuda" if cuda else "cpu",
        threads_per_worker=threads,
        allreduce="shm" if cfg.allreduce == "shm" else "backend",
        timeout_s=cfg.timeout,
        spans_hosts=tasks.local_size != tasks.size,
    )


def default_run_dir(cfg: TrainConfig, tasks: Tasks | None) -> Path | None:
    """A run directory every process of a run across processes names alike (a timestamp would not be)."""
    if tasks is not None:
        return (
            Path("runs") / f"{tasks.launcher}-{re.sub(r'[^A-Za-z0-9.]+', '_', tasks.job)}-{cfg.workload}-w{cfg.workers}"
        )
    if cfg.nodes > 1:
        return Path("runs") / f"{cfg.workload}-n{cfg.nodes}-w{cfg.workers}-{cfg.identity()[:8]}"
    return None


def writes_run_dir(cfg: TrainConfig, tasks: Tasks | None) -> bool:
    """Global rank 0's process writes the run directory: node 0's agent, or rank 0 itself."""
    return not cfg.node_rank and (tasks is None or tasks.rank == 0)


def run_ranks(cfg: TrainConfig, placement: Placement, run_dir: Path, tasks: Tasks | None) -> dict[str, Any] | None:
    """Start this machine's ranks (launch_local), or run this process's own rank in place."""
    if tasks is None:
        return launch_local(cfg, placement, run_dir)
    from paratrain.engine.loop import run_rank

    # What torchrun would have set: env:// initialisation reads them; rank 0 hosts the TCP store.
    env = {
        "RANK": str(tasks.rank),
        "WORLD_SIZE": str(tasks.size),
        "LOCAL_RANK": str(tasks.local_rank),
        "LOCAL_WORLD_SIZE": str(tasks.local_size),
        "MASTER_ADDR": tasks.master_addr or "",
        "MASTER_PORT": str(tasks.master_port),
        **worker_env(placement.threads_per_worker),
    }
    try:
        with scoped_environ(env), _own_terminal():
            return run_rank(cfg.model_dump(mode="json"), placement.to_dict(), str(run_dir))
    except Exception as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else type(exc).__name__
        raise RanksFailed(
            f"rank {tasks.rank} failed: {reason} (see {run_dir / 'logs' / f'rank{tasks.rank}.log'})"
        ) from None


@contextmanager
def _own_terminal() -> Iterator[None]:
    """A rank other than 0 sends its stdout and stderr to its log (engine/loop.py); running in place,
    that is this command's own, which gets them back for its last line."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
