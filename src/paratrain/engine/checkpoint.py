"""Checkpoints that survive being killed mid-write and refuse to load into the wrong run.

Written to a temporary file, flushed to disk, then renamed over the old one: a reader sees either
the previous checkpoint or the new one, never half of one. Sharded state (fsdp) is written first,
by every rank, into a new directory that the checkpoint then names, so the same holds for it. Loaded with
`weights_only=True`, so a
checkpoint file cannot run code.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from paratrain.errors import UsageError

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path}; run without --resume, or with --checkpoint-every N first") from None
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"checkpoint {path} is truncated or corrupt ({reason}); delete it to start over") from None
    if not isinstance(state, dict) or "identity" not in state:
        raise UsageError(f"{path} is not a paratrain checkpoint; delete it to start over")
    # Sharded (fsdp) state lives in a torch.distributed.checkpoint directory that checkpoint.pt names;
    # its .metadata file is written last, once every rank has written its shards.
    if "dcp" in state and not (path.parent / state["dcp"] / ".metadata").is_file():
        raise UsageError(
            f"{path} names sharded state in {path.parent / state['dcp']}, which is missing or incomplete; "
            "delete the checkpoint to start over"
        )
    return state
