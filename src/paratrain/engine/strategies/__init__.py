"""Parallel strategies, chosen by name.

A strategy wraps the model for its kind of parallelism, builds the optimizer over what the rank
updates, runs one micro-step's forward and backward, and says how gradient synchronisation is
deferred during gradient accumulation; the loop, the data and the bookkeeping are shared. One
module each.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Optional, Protocol

import torch
from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.base import OptimizerFactory, StepResult
from paratrain.engine.strategies.ddp import DataParallel
from paratrain.engine.strategies.fsdp import FullyShardedDataParallel
from paratrain.engine.strategies.hybrid import Hybrid
from paratrain.engine.strategies.model_parallel import ModelParallel
from paratrain.engine.strategies.pipeline import PipelineParallel
from paratrain.engine.strategies.single import SingleProcess
from paratrain.engine.strategies.zero1 import ZeroOne
from paratrain.errors import UsageError


class Strategy(Protocol):
    """How one rank takes part in training; strategies/base.py holds the defaults and says which
    strategies override what."""

    name: str
    allreduce: Optional[str]      # what averages gradients (shm, gloo, nccl, ...); None: nothing to average

    def data_shard(self) -> tuple[int, int]:
        """(index, count) of the training-data shard this rank reads; ranks of one pipeline share one."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """Return the model to train, wrapped (or split) for this kind of parallelism."""

    def build_optimizer(self, model: nn.Module, make: OptimizerFactory) -> torch.optim.Optimizer:
        """The optimizer over what this rank updates (ZeRO shards its state; a stage has its layers)."""

    def forward_backward(self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor,
                         loss_divisor: int, scaler: torch.amp.GradScaler, autocast: Callable[[], AbstractContextManager]) -> StepResult:
        """Forward and backward of one micro-step; the mean loss and output on ranks that hold them."""

    def evaluate(self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor,
                 autocast: Callable[[], AbstractContextManager]) -> StepResult:
        """Forward only, without gradients."""

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        """Context for micro-steps whose gradients are accumulated locally, not synchronised."""

    def comm_started(self) -> Optional[Any]:
        """Clock stamp of this step's last gradient all-reduce launch (None: no communication)."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module."""

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Optional[dict[str, Any]]:
        """Model and optimizer state to save, on rank 0 (None elsewhere). Every rank calls it."""

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Put saved model and optimizer state back."""

    def summary_fields(self) -> dict[str, Any]:
        """Strategy-specific figures for summary.json (rank 0's are kept). Every rank calls it."""


# Each is built from the run's config, the rank's context and the clock's stamp function.
STRATEGIES: dict[str, Callable[[TrainConfig, RankContext, Callable[[], Any]], Strategy]] = {
    "single": SingleProcess,
    "ddp": DataParallel,
    "zero1": ZeroOne,
    "fsdp": FullyShardedDataParallel,
    "pipeline": PipelineParallel,
    "model-parallel": ModelParallel,
    "hybrid": Hybrid,
}


def check_strategy(name: str) -> None:
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")


def build_strategy(cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]) -> Strategy:
    check_strategy(cfg.strategy_name)
    return STRATEGIES[cfg.strategy_name](cfg, ctx, stamp)
