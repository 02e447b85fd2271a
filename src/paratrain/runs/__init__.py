"""The run directory: the contract between a training run and every tool that reads it.

DIR/config.json     the resolved configuration (what ran, after defaults and derivations)
DIR/metrics.jsonl   one JSON object per line, each with an "event" key (step, epoch, eval, ...)
DIR/summary.json    the outcome; its keys are listed in SUMMARY_KEYS
DIR/logs/rank<R>.log  each rank's log
DIR/checkpoint.pt   the latest checkpoint, with --checkpoint-every
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from paratrain.errors import UsageError

if TYPE_CHECKING:  # pydantic only when a record is read: `import paratrain` loads this module
    from paratrain.runs.records import Summary

SCALING_FILE = "scaling.json"  # a scaling study's table, in the study directory
SWEEP_FILE = "sweep.json"  # a sweep's trials and best, in the sweep directory
SUMMARY_KEYS = (
    "status",
    "workers",
    "strategy",
    "batch_size",
    "global_batch_size",
    "lr",
    "epochs",
    "epoch_times_s",
    "epoch_time_s",
    "samples_per_s",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "wall_time_s",
    "breakdown",
    "peak_memory_bytes",
    "memory",
)


Epoch = TypeVar("Epoch")


def steady_epochs(epochs: Sequence[Epoch]) -> Sequence[Epoch]:
    """The epochs that time training: all but the first, which pays for start-up (process-group set-up,
    allocations, first kernels, caches); the only epoch when there is one. The rule lives here alone: the
    engine's summary, a launched script's throughput, scale and the doctor all take epoch time through it."""
    return epochs[1:] or epochs


def steady_epoch_time(times: Sequence[float]) -> float:
    """The median time of the steady epochs: the median, so that one epoch slowed by other work does not move it."""
    return statistics.median(steady_epochs(times))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def json_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file written by ranks (none if it is missing); a line a killed
    rank left half-written is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    config = property(lambda self: self.path / "config.json")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    summary = property(lambda self: self.path / "summary.json")
    logs = property(lambda self: self.path / "logs")

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def is_run(self) -> bool:
        return self.config.is_file()

    def read_config(self) -> dict[str, Any]:
        return json.loads(self.config.read_text())

    def read_summary(self) -> dict[str, Any]:
        return json.loads(self.summary.read_text())

    def summary_record(self) -> Summary:
        """summary.json as a typed record (runs/records.py)."""
        from paratrain.runs.records import read_summary_record

        return read_summary_record(self.read_summary(), str(self.summary))

    def read_metrics(self) -> Iterator[dict[str, Any]]:
        if not self.metrics.exists():
            return
        with open(self.metrics) as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def open_run_dir(path: Path) -> RunDir:
    """A run directory that analysis tools may read; one-line error if it is not one."""
    run = RunDir(path)
    if not run.is_run():
        raise UsageError(f"{path} is not a paratrain run directory (no config.json); pass the --run-dir of a run")
    return run


def _whole_event(line: str) -> bool:
    """False for a blank line, or the torn last line of a rank killed while writing it."""
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class MetricsWriter:
    """Appends events to metrics.jsonl, one line each, flushed so a killed run keeps what it logged."""

    def __init__(self, path: Path, keep_until_step: int | None = None):
        if keep_until_step is not None and path.exists():
            # A resumed run rewinds the log to its checkpoint: events the interrupted run wrote
            # after that point describe work that is about to be redone.
            kept = [
                line
                for line in path.read_text().splitlines()
                if _whole_event(line) and json.loads(line).get("step", 0) <= keep_until_step
            ]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, path)
        self.file = open(path, "a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        self.file.write(json.dumps({"event": event, **fields}) + "\n")

    def close(self) -> None:
        self.file.close()
