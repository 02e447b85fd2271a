"""Starting the ranks of one run on this machine with PyTorch's elastic launcher.

The same machinery as `torchrun --standalone`: a c10d rendezvous on a free local port, one agent
supervising N worker processes, a failure of any rank tearing the others down. Workers are spawned
(not forked from the caller), so this works from scripts and from notebooks alike; the CLI's train
and scale fork them from a server that imported torch beforehand (paratrain/forkserver.py). Across nodes (--nodes) each
node's agent starts its share of the ranks and the agents meet at node 0's rendezvous, as torchrun
does; with --max-restarts the agents restart every rank when one dies (docs/cluster.md).
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousTimeoutError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from paratrain import forkserver
from paratrain.config import TrainConfig
from paratrain.engine.distributed import Placement, address_towards
from paratrain.engine.memory import LIMITED_RANK_ENV
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import RunDir

# paratrain.engine.loop (the training loop: FSDP2, DTensor, about 2 s of imports beyond torch) is
# imported by the functions that start or read built-in ranks, not here: a script's launcher uses
# this module too and needs none of it.


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


def worker_env(threads: int) -> dict[str, str]:
    """What the workers must read at start-up: OpenMP's and MKL's pool size, and Python's fault handler, so
    that a rank killed by a signal in native code (a segfault in a library) leaves its Python stack in its log."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONFAULTHANDLER": "1"}


def quiet_elastic_logs() -> None:
    """The agent logs each failure with a full traceback; the rank's log has it, the user gets one line.
    torch's elastic modules set their loggers' own levels, so each is quietened by name."""
    quiet = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]
    for name in ("torch.distributed.elastic", "torch.multiprocessing.spawn", *quiet):
        logging.getLogger(name).setLevel(logging.CRITICAL)


# A failure that follows from another rank's: a peer's closed connection (it had already ended), or,
# after a rank's own error, a timeout waiting for a peer that stopped answering.
_PEER_CLOSED = re.compile(r"connection (closed|reset)|broken pipe", re.IGNORECASE)


def _message(failure: ProcessFailure) -> str:
    return failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)


def _consequence_order(failure: ProcessFailure, stopped_by_the_agent: bool) -> int:
    """0 for a rank's own error or death, 1 for a peer that went silent, 2 for a peer that went away,
    3 for a rank the agent stopped because another had failed."""
    if stopped_by_the_agent:
        return 3
    message = _message(failure)
    if _PEER_CLOSED.search(message):
        return 2
    return 1 if message.startswith("CollectiveFailed") else 0


def root_failure(exc: ChildFailedError, rank_log: Callable[[int], Path] | None = None) -> tuple[int, ProcessFailure]:
    """The local rank whose failure caused the others', and its failure.

    The agent reports the ranks it saw exit, then those it stopped (SIGTERM) itself. The first to
    exit is not always the cause: after a collective fails, every rank tears down (gc,
    destroy_process_group) for up to seconds, and they finish in any order. When rank 1 is stopped,
    rank 0 times out waiting for it, and rank 1 wakes to a closed connection or its own expired
    wait, either may exit first. Every rank that raised wrote its error.json beside the reported
    one; the cause is the failure that is not a consequence of another's (its own error or death,
    then a timeout, then a closed connection, then the agent's SIGTERM), then the first:
    by the time the rank logged its failure before its teardown (`rank_log(local_rank)`, paratrain's
    ranks), else by when its error.json was written."""
    failures = dict(exc.failures)
    # A failure without a file has error_file "<N/A>": only real ones name the attempt's directory.
    attempts = {Path(f.error_file).parent.parent for f in exc.failures.values() if Path(f.error_file).is_file()}
    for error_file in (found for attempt in attempts for found in attempt.glob("*/error.json")):  # <local rank>/
        local_rank = int(error_file.parent.name)
        failures.setdefault(local_rank, ProcessFailure(local_rank, pid=0, exitcode=1, error_file=str(error_file)))

    def failed_at(local_rank: int, failure: ProcessFailure) -> float:
        error_file = Path(failure.error_file)
        if not error_file.is_file():
            return -math.inf  # killed before it could write: first
        # The log's last failure belongs to this attempt: this attempt's error.json follows it.
        logged = None
        if rank_log:  # a built-in rank's log; a script's ranks log where the script says
            from paratrain.engine.loop import logged_failure_time

            logged = logged_failure_time(rank_log(local_rank))
        return logged if logged is not None else error_file.stat().st_mtime

    # Once a rank fails the agent sends SIGTERM to the rest, and torch (2.13) lists those ranks among the
    # failures too. They are consequences unless every failure is a SIGTERM (one sent from outside).
    terminated = {rank for rank, failure in failures.items() if failure.exitcode == -signal.SIGTERM}
    stopped = terminated if len(terminated) < len(failures) else set()
    return min(
        failures.items(), key=lambda item: (_consequence_order(item[1], item[0] in stopped), failed_at(*item), item[0])
    )


def _stopped_by(sigval: int) -> BaseException:
    """What a signal to the launcher means, the agent having stopped the ranks: Ctrl-C (SIGINT) is the user
    interrupting, as Python raises it; SIGTERM or SIGHUP (`kill`, a scheduler's time limit) end the run as a
    failed one, with its summary."""
    if sigval == signal.SIGINT:
        return KeyboardInterrupt()
    return RanksFailed(f"stopped by {signal.Signals(sigval).name}; the ranks were terminated")


def launch_local(cfg: TrainConfig, placement: Placement, run_dir: Path) -> dict[str, Any] | None:
    """Run `cfg` on `cfg.workers` local ranks; returns rank 0's summary."""
    from paratrain.engine.loop import run_rank

    # A memory limit bounds a process of the rank's own, never the caller's; restarts need an agent.
    if cfg.workers == 1 and cfg.memory_limit is None and cfg.max_restarts == 0:
        return _run_here(cfg, placement, run_dir)
    quiet_elastic_logs()
    # The agent's own files (each rank's error.json) go into the run directory, not a temporary
    # directory that nothing removes; kept when a rank fails, removed after a clean run. Another
    # node than node 0 must not write there before the nodes have met (node 0 refuses a directory
    # that is not empty, and on a shared file system it is the same one): it uses one of its own.
    elastic_logs = (
        run_dir / "logs" / "elastic" if not cfg.node_rank else Path(tempfile.mkdtemp(prefix="paratrain-elastic-"))
    )
    start_method = "spawn" if cfg.memory_limit else forkserver.start_method()
    launch_config = LaunchConfig(
        nproc_per_node=cfg.workers_per_node,
        **rendezvous(cfg),
        local_addr=node_address(cfg),
        max_restarts=cfg.max_restarts,
        monitor_interval=0.1,
        # A rank that does not end on SIGTERM (hung, stopped) is killed after this; paratrain's ranks
        # have nothing to flush (checkpoints are written atomically), so torch's 30 s are not waited.
        shutdown_timeout=5,
        # Forked from the CLI's fork server when it runs (paratrain/forkserver.py: torch already
        # imported); spawned otherwise, and always under --memory-limit, whose malloc setting
        # (LIMITED_RANK_ENV) a process reads when it starts.
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(elastic_logs)),
    )
    # Another node's terminal shows one line at the end: the C++ store's retries while it waits for
    # node 0 (and its ranks' output before they open their logs) go to a file in its agent directory.
    quiet = _stderr_to(elastic_logs / "agent-stderr.log") if cfg.node_rank else nullcontext()
    agent_output = f"; this node's agent output: {elastic_logs / 'agent-stderr.log'}" if cfg.node_rank else ""
    # torch 2.13's agents keep one TCP store for the ranks across restarts, with the last attempt's
    # keys in it: restarted gloo ranks read their peers' old addresses and fail to connect. With
    # restarts, rank 0 hosts a fresh store for every attempt instead (torch's own opt-out).
    fresh_store = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if cfg.max_restarts else {}
    try:
        with (
            scoped_environ(
                {
                    **worker_env(placement.threads_per_worker),
                    **(LIMITED_RANK_ENV if cfg.memory_limit else {}),
                    **fresh_store,
                }
            ),
            quiet,
        ):
            # A forked rank has the environment the fork server started with: it applies what changed since.
            changes = forkserver.environ_changes() if start_method == "forkserver" else None
            results = elastic_launch(launch_config, run_rank)(
                cfg.model_dump(mode="json"), placement.to_dict(), str(run_dir), changes
            )
    except SignalException as exc:
        raise _stopped_by(exc.sigval) from None
    except ChildFailedError as exc:
        # The agent numbers ranks by the rendezvous; paratrain by --node-rank (engine/distributed.py).
        first_rank = (cfg.node_rank or 0) * cfg.workers_per_node
        local_rank, failure = root_failure(exc, lambda local: RunDir(run_dir).rank_log(first_rank + local))
        rank = first_rank + local_rank
        message = _message(failure)
        # paratrain's own errors are whole sentences; torch's record prefixes their class names.
        reason = (
            re.sub(r"^(CollectiveFailed|MemoryLimitExceeded): ", "", failure_line(message))
            or f"exit code {failure.exitcode}"
        )
        restarts = f" after {cfg.max_restarts} restart(s)" if cfg.max_restarts else ""
        raise RanksFailed(
            f"rank {rank} failed{restarts}: {reason} (see {run_dir / 'logs' / f'rank{rank}.log'}{agent_output})"
        ) from None
    except RendezvousError as exc:
        raise RendezvousFailed(rendezvous_failure(cfg, exc) + agent_output) from None
    # Kept when the run failed, like node 0's agent files; removed after a clean run.
    shutil.rmtree(elastic_logs, ignore_errors=True)
    # Rank 0 returns the summary; across nodes it runs on node 0 and the other nodes get None.
    return next((summary for summary in results.values() if summary is not None), None)


class RendezvousFailed(UsageError):
    """The nodes did not meet: an address that cannot be reached, or nodes that never came."""


def rendezvous(cfg: TrainConfig) -> dict[str, Any]:
    """The elastic agent's rendezvous: a private one on a free local port, or the nodes' shared one.

    Across nodes the run id is the configuration's identity, so every node started with the same
    training command joins the same rendezvous, and a node started with a different one waits
    alone and fails after --rdzv-timeout instead of training something else. Node 0 hosts the
    rendezvous's TCP store at --rdzv (`is_host`); the others connect to it, for up to
    --rdzv-timeout (`read_timeout`), and all wait for each other as long (`join_timeout`).
    """
    if cfg.nodes == 1:
        return dict(
            min_nodes=1, max_nodes=1, run_id=str(uuid.uuid4()), rdzv_backend="c10d", rdzv_endpoint="localhost:0"
        )
    seconds = max(1, math.ceil(cfg.rdzv_timeout))
    return dict(
        min_nodes=cfg.nodes,
        max_nodes=cfg.nodes,
        run_id=f"paratrain-{cfg.identity()}",
        rdzv_backend=cfg.rdzv_backend,
        rdzv_endpoint=cfg.rdzv,
        rdzv_configs={
            "is_host": cfg.node_rank == 0,
            "join_timeout": seconds,
            "read_timeout": seconds,
            "timeout": seconds,
        },
    )


def node_address(cfg: TrainConfig) -> str | None:
    """This machine's address on the route to node 0 (None on one machine: torch's default is right).

    The node that the rendezvous makes its rank 0 publishes its address as the workers'
    MASTER_ADDR; torch would take the host name's, which may not be reachable from the other nodes
    (Debian maps the host name to 127.0.1.1).
    """
    if cfg.nodes == 1:
        return None
    host, _, port = cfg.rdzv.rpartition(":")
    try:
        return address_towards(host.strip("[]"), int(port))
    except OSError as exc:
        raise RendezvousFailed(
            f"--rdzv {cfg.rdzv}: no route from this machine to {host} ({exc.strerror or exc}); give "
            "node 0's address as the other nodes reach it"
        ) from None


def rendezvous_failure(cfg: TrainConfig, exc: RendezvousError) -> str:
    where = f"the rendezvous at {cfg.rdzv}" if cfg.rdzv else "the local rendezvous"
    if isinstance(exc, RendezvousTimeoutError):
        return (
            f"not every node joined {where} within --rdzv-timeout {cfg.rdzv_timeout:g} s (--nodes {cfg.nodes}); start "
            "the same command with each --node-rank on the other nodes"
        )
    cause = failure_line(str(exc.__cause__ or exc)) or type(exc).__name__
    if cfg.node_rank == 0:
        return (
            f"node 0 cannot host {where} ({cause}); --rdzv must be an address of this machine that the other nodes "
            "can reach, with a free port"
        )
    return (
        f"cannot reach {where} within --rdzv-timeout {cfg.rdzv_timeout:g} s ({cause}); start node 0 first and check "
        "that this machine reaches that address and port"
    )


def _run_here(cfg: TrainConfig, placement: Placement, run_dir: Path) -> dict[str, Any] | None:
    """One rank needs no agent and no rendezvous: run it in this process.

    Spawning a rank costs a fresh interpreter and a second `import torch` (about 2 s here), which
    dominated short runs and sweep trials. The rank pins this thread and sizes torch's pool; both
    are put back afterwards so a notebook calling `paratrain.train` keeps its own settings.
    """
    from paratrain.engine.loop import run_rank

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        with scoped_environ(worker_env(placement.threads_per_worker)):
            return run_rank(cfg.model_dump(mode="json"), placement.to_dict(), str(run_dir))
    except Exception as exc:
        reason = failure_line(str(exc)) or type(exc).__name__
        raise RanksFailed(f"rank 0 failed: {reason} (see {run_dir / 'logs' / 'rank0.log'})") from None
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Send this process's file descriptor 2 (C++ logging writes there directly) to `path` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 2)
    os.close(target)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def failure_line(text: str) -> str:
    """The line of an error that says what went wrong: a traceback's last (the exception), else the first (an
    exception whose message goes on over several lines, a module's repr in it, says what at its start)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback (most recent call last)") else lines[0]
