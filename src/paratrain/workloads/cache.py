"""The dataset cache: what decoding left behind, how large it is, and clearing it.

Every dataset is decoded once (JPEG, pickle or text to uint8) and kept as one `.pt` file in the
cache directory (`--cache-dir`, `$PARATRAIN_CACHE`, default `~/.cache/paratrain`), named after its
source and a fingerprint of it. A full CIFAR-10 entry takes about 180 MB; nothing else removes them.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from paratrain.errors import UsageError
from paratrain.workloads.datasets import default_cache_dir


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    size_bytes: int
    modified: str


def cache_entries(cache_dir: Path | None = None) -> list[CacheEntry]:
    """The cache's files, largest first (an absent cache is an empty one)."""
    root = cache_dir or default_cache_dir()
    if not root.is_dir():
        return []
    files = [p for p in root.iterdir() if p.is_file() and not p.name.startswith(".")]
    entries = [
        CacheEntry(p, p.stat().st_size, _dt.datetime.fromtimestamp(p.stat().st_mtime).strftime("%Y-%m-%d %H:%M"))
        for p in files
    ]
    return sorted(entries, key=lambda e: -e.size_bytes)


def clear_cache(cache_dir: Path | None = None, prefix: str = "") -> list[CacheEntry]:
    """Delete the entries whose names start with `prefix` (all of them for ""); returns what went."""
    chosen = [e for e in cache_entries(cache_dir) if e.path.name.startswith(prefix)]
    if prefix and not chosen:
        names = ", ".join(e.path.name for e in cache_entries(cache_dir)) or "none"
        raise UsageError(f"no cache entry starts with {prefix!r}; the entries are: {names}")
    for entry in chosen:
        entry.path.unlink(missing_ok=True)
    return chosen
