"""Choosing the batch size and the learning rate by measurement (docs/batch-size.md).

One module per command: `find_batch` (the largest per-worker batch that fits, and the throughput
knee), `noise_scale` (the gradient noise scale, McCandlish et al. 2018), `lr_find` (the LR range
test) and `recommend` (all three combined for N workers). Each runs ordinary training runs through
`paratrain.train` with the engine's general options (`--max-steps`, `--grad-noise`, `--schedule
range-test`) and reads their run directories; the engine knows nothing of this package.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from paratrain.config import BATCH_COMMAND_OWNED, TrainConfig, validate
from paratrain.errors import UsageError
from paratrain.runs import write_json

# Flags each command sets itself on the runs it starts.


def check_train_flags(train: dict[str, Any], command: str) -> None:
    """Refuse train flags the command sets itself, before anything runs."""
    owned = [k for k in train if k in BATCH_COMMAND_OWNED]
    if owned:
        raise UsageError(
            f"paratrain {command} sets --{owned[0].replace('_', '-')} itself on the runs it starts; drop it"
        )


def check_out(out: Path) -> None:
    """Refuse an --out that cannot be written before the measurement runs, not minutes later when the
    result is saved: the nearest directory on its path that exists must be one this process may write
    to. (A name longer than the file system allows raises its OSError here, which the CLI words.)"""
    out = Path(out)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"--out {out}: {existing} is a file, not a directory; pass a path under a directory")
    if not os.access(existing, os.W_OK):
        raise UsageError(
            f"--out {out}: {existing} is not writable (its permissions, or a read-only file system); "
            "pass a path you may write to"
        )


def train_samples(cfg: TrainConfig) -> int:
    """Training samples of the config's dataset (decoded once and cached, as `paratrain.train` does)."""
    from paratrain.workloads import load_data

    return len(load_data(cfg).train)


def epochs_for(cfg: TrainConfig, steps: int, samples: int) -> int:
    """Epochs that hold at least `steps` optimizer steps of `cfg` (the run stops at --max-steps)."""

    def ceil_div(a: int, b: int) -> int:
        return -(-a // b)

    per_rank = ceil_div(samples, cfg.data_parallel_size)
    steps_per_epoch = ceil_div(ceil_div(per_rank, cfg.batch_size), cfg.grad_accum)
    return max(1, math.ceil(steps / steps_per_epoch))


def run_config(train: dict[str, Any], **overrides: Any) -> TrainConfig:
    """The validated config of a measurement run: the user's train flags with the command's own."""
    return validate(TrainConfig, {**train, **overrides})


def steps_run_config(train: dict[str, Any], steps: int, **overrides: Any) -> TrainConfig:
    """A measurement run of `steps` optimizer steps: --max-steps, with enough epochs to hold them."""
    first = run_config(train, **overrides, max_steps=steps)
    return run_config(train, **overrides, max_steps=steps, epochs=epochs_for(first, steps, train_samples(first)))


def clear_measurement_run(run_dir: Path) -> None:
    """A run left in OUT by an earlier measurement of the same command is its scratch, replaced like
    the JSON result beside it (a rerun would otherwise be refused as a non-empty run directory).
    Called once the new run's configuration is valid, so bad input leaves it as it was."""
    if run_dir.exists():
        shutil.rmtree(run_dir)


def read_result(path: Path, train: dict[str, Any], **options: Any) -> dict[str, Any] | None:
    """A command's earlier result in `path`, if the same train flags and the same `options` of the
    command (its recorded `options`) made it: recommend reuses it."""
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    made_by = result.get("options", {})
    same = result.get("train") == json.loads(json.dumps(train, default=str))
    return result if same and all(made_by.get(k) == v for k, v in options.items()) else None


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
