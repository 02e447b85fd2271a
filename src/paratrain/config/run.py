"""Where and how a run is recorded: its seed, run directory, checkpoints, logs and trackers."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field, field_validator


class RunOptions(BaseModel):
    # Run bookkeeping.
    seed: int = Field(0, description="seed of model init, shuffling and augmentation")
    run_dir: Path | None = Field(None, description="run directory (default runs/<time>-<workload>-w<workers>)")
    checkpoint_every: str | int = Field(
        0, description="save a checkpoint every N epochs (N or Nepochs) or every N optimizer steps (Nsteps); 0: never"
    )
    resume: bool = Field(False, description="continue the run in --run-dir from its checkpoint (same configuration)")
    log_every: int = Field(
        50, gt=0, description="optimizer steps between step events in metrics.jsonl (each reads the loss once)"
    )
    monitor_hz: float = Field(
        2.0,
        gt=0,
        description="samples per second of the monitor (CPU, memory and GPU use of the host and each rank) into "
        "RUN_DIR/system.jsonl",
    )
    quiet: bool = Field(False, description="no progress bar or table")
    tensorboard: Path | None = Field(
        None, description="also write TensorBoard event files to this directory while training"
    )
    mlflow: str | None = Field(
        None,
        description="after training, log params, metrics and the report to this MLflow tracking URI (e.g. sqlite:///mlflow.db)",
    )
    mlflow_experiment: str = Field("paratrain", description="MLflow experiment name")

    @field_validator("checkpoint_every")
    @classmethod
    def _checkpoint_interval(cls, value: str | int) -> str | int:
        """N or Nepochs -> N (epochs, an int as before); Nsteps -> "Nsteps"."""
        match = re.fullmatch(r"\s*(\d+)\s*(epochs?|steps?)?\s*", str(value).lower())
        if isinstance(value, bool) or not match:
            raise ValueError(
                f"{value!r} is not an interval; write N or Nepochs (every N epochs) or Nsteps (every N optimizer steps)"
            )
        count, unit = int(match.group(1)), match.group(2) or "epochs"
        return f"{count}steps" if unit.startswith("step") and count else count

    @property
    def checkpoint_every_steps(self) -> int:
        """Optimizer steps between checkpoints (0: checkpoints are per epoch, or none)."""
        return int(self.checkpoint_every[:-5]) if isinstance(self.checkpoint_every, str) else 0

    @property
    def checkpoint_every_epochs(self) -> int:
        return self.checkpoint_every if isinstance(self.checkpoint_every, int) else 0
