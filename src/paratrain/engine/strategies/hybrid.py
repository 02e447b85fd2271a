"""Hybrid: data parallel × pipeline on a 2-D DeviceMesh (dp, pp): `--dp D` replicas of a
`--stages K` pipeline, D × K ranks.

Each stage is wrapped in DistributedDataParallel over its `dp` sub-group (the ranks that hold the
same stage in the other replicas); each replica reads its own data shard. DDP rather than FSDP
over `dp` (torchtitan's choice on GPUs, for memory): PipelineStage runs every micro-batch's
backward but the last under DDP's no_sync (stage.py, backward_maybe_with_nosync), so a stage's
gradients are averaged across replicas once per step, after the last micro-batch, exactly the
data-parallel average; sharding inside a stage is `fsdp`'s job and would add parameter
all-gathers to every micro-batch. The all-reduce of the last micro-batch runs inside that
micro-batch's backward, so the measured busy time of a stage includes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.pipeline import PipelineParallel


class Hybrid(PipelineParallel):
    name = "hybrid"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        self.allreduce = dist.get_backend() if self.dp > 1 else None

    def _replicate(self, module: nn.Module) -> nn.Module:
        if self.dp == 1:
            return module
        return DistributedDataParallel(
            module,
            process_group=self.mesh.get_group("dp"),
            device_ids=[self.ctx.device.index] if self.ctx.device.type == "cuda" else None,
        )
