"""Parallel strategies, chosen by name.

A strategy wraps the model for its kind of parallelism, builds the optimizer over what the rank
updates, runs one micro-step's forward and backward, and says how gradient synchronisation is
deferred during gradient accumulation; the loop, the data and the bookkeeping are shared. One
module each.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn

from paratrain.config import STRATEGY_PRESETS, TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.grad_noise import DataParallelNorms
from paratrain.engine.strategies.base import OptimizerFactory, StepResult
from paratrain.errors import UsageError


class Strategy(Protocol):
    """How one rank takes part in training; strategies/base.py holds the defaults and says which
    strategies override what."""

    name: str
    allreduce: str | None  # what averages gradients (shm, gloo, nccl, ...); None: nothing to average
    grad_norms: DataParallelNorms | None  # --grad-noise on 2+ data-parallel ranks: norms before and after averaging
    trains: bool  # False on a rank that only serves (async-ps's parameter servers)

    def data_shard(self) -> tuple[int, int]:
        """(index, count) of the training-data shard this rank reads; ranks of one pipeline share one."""

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """The model to wrap, from `make` (seeds and builds it): on the rank's device, or on meta
        for a strategy that materialises only its shards (fsdp)."""

    def split(self, model: nn.Module) -> None:
        """Split its layers across ranks in place (tensor parallelism), before activation checkpointing
        wraps its blocks; nothing for strategies that do not."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """Return the model to train, wrapped (or split into stages) for this kind of parallelism."""

    def build_optimizer(self, model: nn.Module, make: OptimizerFactory) -> torch.optim.Optimizer:
        """The optimizer over what this rank updates (ZeRO shards its state; a stage has its layers)."""

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
        """Forward and backward of one micro-step; the mean loss and output on ranks that hold them."""

    def evaluate(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        """Forward only, without gradients."""

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        """Context for micro-steps whose gradients are accumulated locally, not synchronised."""

    def comm_started(self) -> Any | None:
        """Clock stamp of this step's last gradient all-reduce launch (None: no communication)."""

    def discard_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Drop every gradient this rank holds, those accumulated under no_sync too (the adaptive batch's
        timing passes leave some, engine/loop.py)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> tuple[Any, Any] | None:
        """Apply the step's gradients; the stamps (start, end) of communication it ran, else None."""

    def bytes_sent(self) -> int | None:
        """Bytes this rank handed to communication so far; None where the strategy does not count."""

    def resolve_timings(self) -> None:
        """Turn the clock stamps (CUDA events) kept across steps into seconds; the loop calls it at each log
        point, which waits for the device anyway, so that no stamp is held longer than a log interval."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module."""

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Model and optimizer state to save, on rank 0 (None elsewhere). Every rank calls it."""

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Put saved model and optimizer state back."""

    def summary_fields(self) -> dict[str, Any]:
        """Strategy-specific figures for summary.json (rank 0's are kept). Every rank calls it."""


def _imported_when_built(path: str) -> Callable[[TrainConfig, RankContext, Callable[[], Any]], Strategy]:
    """The strategy class at `module:Class`, imported when a run builds it: the parts of
    torch.distributed some strategies stand on (DTensor and torch.distributed.checkpoint for fsdp,
    torch._dynamo under torch.distributed.pipelining, torch.distributed.optim for zero1, rpc for
    async-ps) took more than torch's own import time to import, on every run of any strategy."""
    module, _, name = path.partition(":")

    def build(cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]) -> Strategy:
        return getattr(importlib.import_module(module), name)(cfg, ctx, stamp)

    return build


# Each is built from the run's config, the rank's context and the clock's stamp function.
STRATEGIES: dict[str, Callable[[TrainConfig, RankContext, Callable[[], Any]], Strategy]] = {
    name: _imported_when_built(f"paratrain.engine.strategies.{path}")
    for name, path in {
        "single": "single:SingleProcess",
        "ddp": "ddp:DataParallel",
        "zero1": "zero1:ZeroOne",
        "fsdp": "fsdp:FullyShardedDataParallel",
        "pipeline": "pipeline:PipelineParallel",
        "model-parallel": "model_parallel:ModelParallel",
        "hybrid": "hybrid:Hybrid",
        "async-ps": "async_ps:AsyncParameterServer",
        "tp": "tensor:TensorParallel",
    }.items()
}


def check_strategy(name: str) -> None:
    if name not in STRATEGIES and name not in STRATEGY_PRESETS:
        raise UsageError(f"unknown strategy {name!r}; choose from {', '.join([*STRATEGIES, *STRATEGY_PRESETS])}")


def check_fsdp(cfg: TrainConfig, data: Any, device_type: str) -> None:
    """Refuse fsdp flags that need the device or the model, in the launching process, before anything is written
    (the flags alone: config/parallelism/sharded.py). Here rather than in fsdp.py, so that checking a run of
    another strategy does not import FSDP."""
    if cfg.strategy_name != "fsdp":
        return
    if cfg.cpu_offload and device_type != "cuda":
        raise UsageError(
            "--cpu-offload moves FSDP's shards from GPU to host memory; CPU ranks hold them in host memory "
            "already: drop --cpu-offload"
        )
    if cfg.shard_unit is not None:
        from paratrain.engine.strategies.fsdp import shard_units
        from paratrain.workloads import build_model

        with torch.device("meta"):  # shapes only: free even for large models
            shard_units(build_model(cfg, data), cfg.shard_unit)


def check_tensor_parallel(cfg: TrainConfig, data: Any) -> None:
    """Refuse a --tp the model cannot be split by, in the launching process (engine/strategies/tensor.py)."""
    if cfg.tp == 1:
        return
    from paratrain.engine.strategies import tensor
    from paratrain.workloads import build_model

    tensor.check_tensor_parallel(cfg, lambda: build_model(cfg, data))


def build_strategy(cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]) -> Strategy:
    check_strategy(cfg.strategy_name)
    return STRATEGIES[cfg.strategy_name](cfg, ctx, stamp)
