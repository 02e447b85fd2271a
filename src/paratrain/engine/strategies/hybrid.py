"""Hybrid: data parallel × pipeline on a DeviceMesh (dp_replicate, dp_shard, pp): `--dp D` replicas of a
`--stages K` pipeline, D × K ranks; with `--pp K --dp-shard S` (torchtitan's PP × FSDP) the stages are
sharded over S of the D replicas and replicated over the other D / S.

Replicated stages: each stage is wrapped in DistributedDataParallel over its replicas (the ranks that hold
the same stage in the other pipelines); each replica reads its own data shard. PipelineStage runs every
micro-batch's backward but the last under DDP's no_sync (stage.py, backward_maybe_with_nosync), so a
stage's gradients are averaged across replicas once per step, after the last micro-batch, exactly the
data-parallel average. The all-reduce of the last micro-batch runs inside that micro-batch's backward, so
the measured busy time of a stage includes it.

Sharded stages (`--dp-shard S`): each stage is FSDP2's, unit by unit as `fsdp` shards a whole model
(strategies/fsdp.py: shard_in_units), over the stage's S shard ranks, and HSDP's all-reduce across the
D / S replicas when there are several. PipelineStage drives FSDP itself: every micro-batch's backward
keeps its unsharded gradients and the reduce-scatter runs once, after the last (perform_reduce_grad).
A rank then holds 1/S of its stage's parameters, gradients and optimizer state, and gathers a unit's
parameters for each micro-batch's forward and backward: torchtitan's 2-D layout for models whose
stages do not fit whole. Split stages in replicas without shards (`--dp-replicate R --pp K --tp T`, Megatron-LM's
3-D layout) are FSDP2's too, over an (R, 1) mesh: shards of one rank are whole replicas whose gradients are
all-reduced after the last micro-batch, as DDP's would be (DDP cannot hold split layers). Checkpoints gather the
shards whole (pipeline.py): checkpoint.pt holds the whole model, as every pipeline's does, and a resumed run takes
its shards of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.fsdp import shard_in_units
from paratrain.engine.strategies.pipeline import PipelineParallel


class Hybrid(PipelineParallel):
    name = "hybrid"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        replicas = self.dp // self.shards
        if self.shards > 1 or (self.tp > 1 and replicas > 1):
            across = f" + all-reduce over {replicas} replicas" if replicas > 1 else ""
            split = "; all-reduce in each split layer pair" if self.tp > 1 else ""
            kind = "reduce-scatter" if self.shards > 1 else "FSDP2 over shards of one rank"
            self.allreduce = f"{kind}{across}{split} ({dist.get_backend()})"
        else:
            self.allreduce = dist.get_backend() if self.dp > 1 else None

    def _partition(self, module: nn.Module) -> None:
        super()._partition(module)  # the tensor-parallel split first, as torchtitan applies them
        if self._fully_sharded:
            mesh = self.mesh["dp_replicate", "dp_shard"] if self.dp > self.shards else self.mesh["dp_shard"]
            shard_in_units(module, self.cfg, mesh)

    @property
    def _fully_sharded(self) -> bool:
        """FSDP2 holds the stages: sharded ones, and split ones in replicas (Megatron's 3-D layout), as shards of one
        rank, since DDP cannot hold split layers (a DTensor's parameters)."""
        return self.shards > 1 or (self.tp > 1 and self.dp > 1)

    def _replicate(self, module: nn.Module) -> nn.Module:
        if self._fully_sharded or self.dp == 1:
            return module
        return DistributedDataParallel(
            module,
            process_group=self.mesh.get_group("dp_replicate"),
            device_ids=[self.ctx.device.index] if self.ctx.device.type == "cuda" else None,
            # Every replica already holds the same weights (one seed; meta_init.py materialises the same values on
            # each). DDP's start-up broadcast would resend them through a 250 MB staging buffer, which took a
            # stage that fits a rank over --memory-limit (tests/test_meta_build.py).
            init_sync=False,
        )
