"""Checkpoints of a model whose parameters are DTensors (fsdp's shards, tensor parallelism's splits).

torch.distributed.checkpoint (DCP) with `get_state_dict`/`set_state_dict`: every rank writes its own
shards into a directory beside checkpoint.pt, and loading reshards them to the ranks that load.
checkpoint.pt names the directory and is written last, so a run killed while saving resumes from the
previous complete one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from paratrain.engine.distributed import RankContext

# Where the sharded state of a checkpoint lives: RUN_DIR/checkpoint.dcp/save-NNNNNN/.
DCP_DIR = "checkpoint.dcp"


class ShardedCheckpoints:
    """What a strategy of DTensor models does for its checkpoint_state and load_checkpoint_state."""

    def __init__(self, ctx: RankContext, run_dir: str | None):
        self.ctx = ctx
        self._saved: str | None = None  # the DCP directory checkpoint.pt names (relative to the run)
        self.run_dir = Path(run_dir) if run_dir is not None else Path(".")

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Every rank writes its shards to a new DCP directory; rank 0 returns its name for checkpoint.pt.

        Directories other than the one checkpoint.pt names now (left by a save that was
        interrupted, or superseded by the last save) are removed first, so at most two exist.
        """
        root = self.run_dir / DCP_DIR
        number = int(self._saved.rsplit("-", 1)[1]) + 1 if self._saved else 1
        name = f"{DCP_DIR}/save-{number:06d}"
        if self.ctx.is_main and root.is_dir():
            for entry in root.iterdir():
                if f"{DCP_DIR}/{entry.name}" != self._saved:
                    shutil.rmtree(entry, ignore_errors=True)
        dist.barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=self.run_dir / name)
        self._saved = name
        return {"dcp": name} if self.ctx.is_main else None

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        model_state, optim_state = get_state_dict(model, optimizer)
        loaded = {"model": model_state, "optimizer": optim_state}
        dcp.load(loaded, checkpoint_id=self.run_dir / state["dcp"])
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
        self._saved = state["dcp"]
