"""paratrain: train PyTorch models in parallel and measure whether the parallelism pays off."""

from typing import Any

from paratrain.errors import UsageError
from paratrain.export import MLFLOW
from paratrain.runs.exports import register
from paratrain.script_client import params, report

# The launcher exports a run as its config asks, through what is registered (runs/exports.py):
# the exporter sits above the launcher and cannot be imported by it.
register(MLFLOW)

__all__ = ["TrainConfig", "UsageError", "batch_schedule", "params", "report", "train"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # torch loads on first use of the engine, not on `import paratrain`: a sweep's trial script
    # that only calls paratrain.report() and the CLI's --help stay fast.
    if name == "train":
        from paratrain.launch.builtin import train

        return train
    if name == "batch_schedule":
        from paratrain.engine.script_schedule import batch_schedule

        return batch_schedule
    if name == "TrainConfig":
        from paratrain.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'paratrain' has no attribute {name!r}")
