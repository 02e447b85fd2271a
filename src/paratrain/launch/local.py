"""Starting the ranks of one run on this machine with PyTorch's elastic launcher.

The same machinery as `torchrun --standalone`: a c10d rendezvous on a free local port, one agent
supervising N worker processes, a failure of any rank tearing the others down. Workers are spawned
(not forked), so this works from scripts and from notebooks alike.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from paratrain.config import TrainConfig
from paratrain.engine.distributed import Placement
from paratrain.engine.loop import run_rank
from paratrain.engine.memory import LIMITED_RANK_ENV
from paratrain.errors import RunFailed


class RanksFailed(RunFailed):
    """A rank died; the message names it and its log."""


@contextmanager
def scoped_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables that the workers inherit, restoring this process's afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def thread_env(threads: int) -> dict[str, str]:
    """OpenMP/MKL read their pool size at start-up, so it must be in the workers' environment."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def quiet_elastic_logs() -> None:
    """The agent logs each failure with a full traceback; the rank's log has it, the user gets one line.
    torch's elastic modules set their loggers' own levels, so each is quietened by name."""
    quiet = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]
    for name in ("torch.distributed.elastic", "torch.multiprocessing.spawn", *quiet):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def launch_local(cfg: TrainConfig, placement: Placement, run_dir: Path) -> Optional[dict[str, Any]]:
    """Run `cfg` on `cfg.workers` local ranks; returns rank 0's summary."""
    # A memory limit bounds a process of the rank's own, never the caller's.
    if cfg.workers == 1 and cfg.memory_limit is None:
        return _run_here(cfg, placement, run_dir)
    quiet_elastic_logs()
    # The agent's own files (each rank's error.json) go into the run directory, not a temporary
    # directory that nothing removes; kept when a rank fails, removed after a clean run.
    elastic_logs = run_dir / "logs" / "elastic"
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=cfg.workers, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
        start_method="spawn", logs_specs=DefaultLogsSpecs(log_dir=str(elastic_logs)),
    )
    try:
        with scoped_environ({**thread_env(placement.threads_per_worker), **(LIMITED_RANK_ENV if cfg.memory_limit else {})}):
            results = elastic_launch(launch_config, run_rank)(cfg.model_dump(mode="json"), placement.to_dict(), str(run_dir))
    except SignalException as exc:
        # SIGTERM or SIGHUP to the launcher (`kill`, a scheduler's time limit): the agent has already
        # stopped the ranks; the run ends as a failed one, with its summary.
        raise RanksFailed(f"stopped by {signal.Signals(exc.sigval).name}; the ranks were terminated") from None
    except ChildFailedError as exc:
        rank, failure = min(exc.failures.items())
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
        reason = _last_line(message) or f"exit code {failure.exitcode}"
        raise RanksFailed(f"rank {rank} failed: {reason} (see {run_dir / 'logs' / f'rank{rank}.log'})") from None
    shutil.rmtree(elastic_logs, ignore_errors=True)
    return results[0]


def _run_here(cfg: TrainConfig, placement: Placement, run_dir: Path) -> Optional[dict[str, Any]]:
    """One rank needs no agent and no rendezvous: run it in this process.

    Spawning a rank costs a fresh interpreter and a second `import torch` (about 2 s here), which
    dominated short runs and sweep trials. The rank pins this thread and sizes torch's pool; both
    are put back afterwards so a notebook calling `paratrain.train` keeps its own settings.
    """
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        with scoped_environ(thread_env(placement.threads_per_worker)):
            return run_rank(cfg.model_dump(mode="json"), placement.to_dict(), str(run_dir))
    except Exception as exc:
        reason = _last_line(str(exc)) or type(exc).__name__
        raise RanksFailed(f"rank 0 failed: {reason} (see {run_dir / 'logs' / 'rank0.log'})") from None
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
