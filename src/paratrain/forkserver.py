"""Ranks that are ready by the time the command has checked its input.

`paratrain train --workers N` used to import torch in the launching process, check everything,
and only then spawn N fresh interpreters that each imported torch again: two imports of about 3 s
back to back before the first step. The CLI now starts a fork server first thing, before it imports
torch itself: the server imports torch and the engine once, on another core, while the command
imports and validates, and every rank is forked from it with everything already imported
(launch/local.py asks `start_method()`). A forked rank has the environment the server started
with; the launcher hands it what has changed since (`environ_changes()`), which it applies first.

Only the CLI's train and scale start it, for their command's duration. The server lives as long
as the process that started it, which suits one command; `paratrain.train` called from Python (a
notebook training many times over hours) keeps spawning its ranks.

Nothing here imports torch: that is the point.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import forkserver

# The guard makes the server die with the thread that started it (PR_SET_PDEATHSIG), so a killed
# command leaves no server behind; then the engine, which brings torch, and torch._dynamo, which
# DistributedDataParallel's constructor imports in every rank (about as long as torch's own import).
PRELOAD = ["paratrain.sweep.guard", "torch", "torch._dynamo", "paratrain.engine.loop"]
_server_environ: dict[str, str] | None = None  # what the server started with, when started here
_serving = False


@contextmanager
def serving(wanted: bool) -> Iterator[None]:
    """Start the fork server now when `wanted` (from the main thread, before importing torch: it
    imports on its own meanwhile), and let launches inside the block fork their ranks from it.

    Blocks nest: one that does not want the server leaves an enclosing block's serving (the test
    suite serves its whole session, so its Python-API runs start their ranks as the CLI's do)."""
    global _server_environ, _serving
    if wanted and _server_environ is None and not _started_elsewhere():
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
        _server_environ = dict(os.environ)
    enclosing = _serving
    _serving = enclosing or wanted
    try:
        yield
    finally:
        _serving = enclosing


def start_method() -> str:
    """How the elastic agent should start ranks now: forked from the server while serving."""
    return "forkserver" if _serving and _server_environ is not None else "spawn"


def environ_changes() -> dict[str, str | None]:
    """How this process's environment differs from the one the server started with (None: removed):
    a forked rank applies it first thing (engine/loop.py run_rank), so it sees what a spawned one would."""
    if _server_environ is None:
        return {}
    now = dict(os.environ)
    changes: dict[str, str | None] = {k: v for k, v in now.items() if _server_environ.get(k) != v}
    changes.update({k: None for k in _server_environ if k not in now})
    return changes


def apply_environ_changes(changes: dict[str, str | None]) -> None:
    """In a forked rank, first thing: `environ_changes()` as the launcher computed them."""
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _started_elsewhere() -> bool:
    """The process's one fork server was started by someone else (a sweep driver), with an
    environment and preloads this module does not know."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None
