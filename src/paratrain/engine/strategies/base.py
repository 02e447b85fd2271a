"""What every strategy does unless it says otherwise: each rank runs the whole model.

Single-process, data-parallel and sharded strategies (DDP, ZeRO, FSDP) all run the model's full
forward and backward on the rank's share of the batch; they differ in how the model is wrapped,
how gradients are averaged and where optimizer state lives. Strategies that split the model into
stages (pipeline, model-parallel, hybrid) override the step and evaluation, because a pipeline
schedule runs forward and backward over micro-batches itself.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.grad_noise import DataParallelNorms

# Builds the run's optimizer (--optimizer, --lr, ...) over a module's parameters.
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
StepResult = tuple[torch.Tensor | None, torch.Tensor | None]  # (mean loss, output); None where the rank has none


class WholeModelStrategy:
    name = "whole-model"
    allreduce: str | None = None
    # ddp or fsdp with --grad-noise: each step's gradient norms before and after averaging
    grad_norms: DataParallelNorms | None = None
    trains = True  # False on a rank that only serves (async-ps's parameter servers)

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        self.cfg, self.ctx, self.stamp = cfg, ctx, stamp

    def data_shard(self) -> tuple[int, int]:
        """(index, count) of the training-data shard this rank reads: one per data-parallel replica."""
        return self.ctx.rank, self.ctx.world_size

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """The model this rank wraps, from `make` (which seeds and builds it on the host): on the rank's device."""
        return make().to(self.ctx.device)

    def split(self, model: nn.Module) -> None:
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def build_optimizer(self, model: nn.Module, make: OptimizerFactory) -> torch.optim.Optimizer:
        return make(self.unwrap(model))

    def forward_backward(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_divisor: int,
        scaler: torch.amp.GradScaler,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        with autocast():
            loss, out = objective(model, x, y)
        scaler.scale(loss / loss_divisor if loss_divisor > 1 else loss).backward()
        return loss.detach(), out

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        with autocast():
            return objective(self.unwrap(model), x, y)

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        return nullcontext()

    def comm_started(self) -> Any | None:
        return None

    def discard_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Drop every gradient this rank holds, those accumulated under no_sync too."""
        optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> tuple[Any, Any] | None:
        """Apply this step's gradients; returns the clock stamps (start, end) of communication the
        step ran (local SGD's parameter averaging, a parameter server's push and pull), else None."""
        scaler.step(optimizer)
        scaler.update()
        return None

    def bytes_sent(self) -> int | None:
        """Bytes this rank has handed to communication so far; None where the strategy does not count."""
        return None

    def resolve_timings(self) -> None:
        """Turn the clock stamps kept across steps into seconds (only the pipeline keeps any: its busy spans)."""
        return None

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Model and optimizer state to save, on rank 0 (None elsewhere). Every rank calls it."""
        if not self.ctx.is_main:
            return None
        return {"model": self.unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    def summary_fields(self) -> dict[str, Any]:
        """Strategy-specific figures for summary.json (rank 0's are kept). Every rank calls it."""
        return {}
