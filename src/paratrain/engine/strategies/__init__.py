"""Parallel strategies, chosen by name.

A strategy wraps the model for its kind of parallelism and says how gradient synchronisation is
deferred during gradient accumulation; everything else (loop, data, optimizer) is shared. One
module each.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Optional, Protocol

from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.ddp import DataParallel
from paratrain.engine.strategies.single import SingleProcess
from paratrain.errors import UsageError


class Strategy(Protocol):
    name: str
    allreduce: Optional[str]      # what averages gradients (shm, gloo, nccl, ...); None: nothing to average

    def wrap(self, model: nn.Module) -> nn.Module:
        """Return the model to train, wrapped for this kind of parallelism."""

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        """Context for micro-steps whose gradients are accumulated locally, not synchronised."""

    def comm_started(self) -> Optional[Any]:
        """Clock stamp of this step's last gradient all-reduce launch (None: no communication)."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module, for checkpoints."""


# Each is built from the run's config, the rank's context and the clock's stamp function.
STRATEGIES: dict[str, Callable[[TrainConfig, RankContext, Callable[[], Any]], Strategy]] = {
    "single": SingleProcess,
    "ddp": DataParallel,
}


def check_strategy(name: str) -> None:
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")


def build_strategy(cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]) -> Strategy:
    check_strategy(cfg.strategy_name)
    return STRATEGIES[cfg.strategy_name](cfg, ctx, stamp)
