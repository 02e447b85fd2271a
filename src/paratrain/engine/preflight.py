"""Checks the launcher runs in its own process before any rank starts, on one batch of the data.

In the engine, not in workloads: they feed a batch through the engine's batch preparation, and
workloads sit below the engine in the layers (pyproject.toml's import-linter contract).
"""

from __future__ import annotations

import torch

from paratrain.config import TrainConfig
from paratrain.engine.data import BatchPreparer, eval_batches
from paratrain.engine.distributed import RankContext
from paratrain.errors import UsageError
from paratrain.workloads import TrainingData, build_model, check_inputs, gpt, models, workload_of
from paratrain.workloads.objective import build_objective, check_scalar
from paratrain.workloads.samples import map_inputs


def check_loss(config: TrainConfig, data: TrainingData) -> None:
    """With --loss, or a model that computes its own loss, run one tiny forward and loss here, in the
    launching process, so a loss that is not a scalar fails before anything is written.

    The model is built on the meta device when it can be (shapes only: free even for gpt-xl).
    """
    name = workload_of(config).model
    check_inputs(name, data)  # here, before any rank starts or anything is written
    if config.loss is None and (name in models.MODELS or name in gpt.PRESETS):
        return

    one = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    x, y = next(eval_batches(data.test, one, 2, BatchPreparer(config.image_size)))
    for device in ("meta", "cpu"):
        try:
            with torch.device(device):
                model = build_model(config, data)
            objective = build_objective(config.loss, model)
            if objective.in_nats:
                return  # a user model under the built-in loss: its own errors surface in the ranks
            loss, _ = objective(model, map_inputs(lambda t, device=device: t.to(device), x), y.to(device))
            break
        except UsageError:
            raise
        except Exception as exc:
            if device == "cpu":
                raise UsageError(
                    f"the model and loss fail on a batch of 2 samples ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''})"
                ) from None
    source = f"--loss {config.loss}" if config.loss else f"{name}'s forward(x, {objective.target_parameter}=y)"
    check_scalar(loss, source)
