"""One run at a time in a run directory.

A run (train, launch, a scale study's --out) holds an exclusive flock(2) on DIR/.lock from before
it writes anything until it ends. A second run into the same directory (a --resume while the
first still trains, two commands started at once into a new directory) finds the lock taken and
is refused before it touches anything. The kernel drops the lock when the holder's process ends however it ends, SIGKILL
included, so a killed run leaves no stale lock: the file stays, locked by nobody.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from paratrain.errors import UsageError

LOCK_FILE = ".lock"


@contextmanager
def run_dir_lock(path: Path, fresh: bool, option: str = "--run-dir") -> Iterator[None]:
    """Hold `path`'s lock for the block, creating the directory (`option`: the flag that named it,
    for the message). `fresh`: the run starts from nothing, so the directory must hold nothing else;
    checked again once the lock is held, since a run that won the race may have written meanwhile."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"{path} is in use by another paratrain run right now; wait for it to end, or choose another {option}"
            ) from None
        if fresh and run_dir_entries(path):
            raise UsageError(
                f"{path} already exists and is not empty (another run has just started in it); choose another {option}"
            )
        yield
    finally:
        os.close(fd)


def run_dir_entries(path: Path) -> list[Path]:
    """What the directory holds besides its lock file (a run that was killed before writing leaves only that)."""
    return [p for p in path.iterdir() if p.name != LOCK_FILE] if path.is_dir() else []
