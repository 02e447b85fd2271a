"""ZeRO stage 1: data parallel with the optimizer state sharded across the ranks.

DDP averages the gradients exactly as `ddp` does (the same buckets, the same shared-memory or
backend all-reduce); PyTorch's `ZeroRedundancyOptimizer` (Rajbhandari et al. 2020, stage 1) then
gives each rank a partition of the parameters: a rank keeps optimizer state (momentum, Adam's
moments) for its partition only, steps that partition, and broadcasts the updated parameters to
the others. Optimizer memory per rank falls to about 1/N; the price is one broadcast of the
parameters per step.

The run's optimizer (--optimizer, including LARS and LAMB) is built as usual and then handed to
ZeRO by class, hyperparameters and parameter groups: ZeRO copies each group, with every key in it
(weight decay, LARS/LAMB's `adapt`), into the local optimizer of the rank that owns its parameters.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from paratrain.engine.strategies.base import OptimizerFactory
from paratrain.engine.strategies.ddp import DataParallel


class ZeroOne(DataParallel):
    name = "zero1"

    def build_optimizer(self, model: nn.Module, make: OptimizerFactory) -> torch.optim.Optimizer:
        template = make(self.unwrap(model))  # holds no state yet: optimizers create it at their first step
        accepted = inspect.signature(type(template)).parameters
        # Group-only keys (LARS/LAMB's `adapt`) stay in the groups; the constructor gets its own arguments.
        defaults = {k: v for k, v in template.defaults.items() if k in accepted}
        groups = [{k: v for k, v in group.items()} for group in template.param_groups]
        return ZeroRedundancyOptimizer(groups, optimizer_class=type(template), **defaults)

    def bytes_sent(self) -> int | None:
        # The hooks count the gradients; ZeRO's broadcast of the updated partitions happens inside
        # its step, uncounted: half a count would read as the whole.
        return None

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The whole optimizer state, gathered on rank 0 (every rank sends its partition)."""
        optimizer.consolidate_state_dict(to=0)
        return super().checkpoint_state(model, optimizer)
