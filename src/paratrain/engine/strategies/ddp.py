"""Data parallel: the model replicated on every rank, the batch split, gradients averaged.

PyTorch's DistributedDataParallel (Li et al. 2020): gradients are bucketed and all-reduced while
backward is still running. The comm hook below is DDP's default all-reduce with one addition: it
stamps the moment each bucket is launched, so the loop can tell how much of the all-reduce was
left exposed after the backward computation finished.
"""
from contextlib import AbstractContextManager
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.engine.distributed import RankContext


class DataParallel:
    name = "ddp"

    def __init__(self, ctx: RankContext, stamp: Callable[[], Any]):
        self.ctx = ctx
        self.stamp = stamp
        self._last_launch: Optional[Any] = None

    def wrap(self, model: nn.Module) -> nn.Module:
        wrapped = DistributedDataParallel(
            model,
            device_ids=[self.ctx.device.index] if self.ctx.device.type == "cuda" else None,
            # Gradients live inside the buckets: saves a copy per step and the memory of one.
            gradient_as_bucket_view=True,
        )
        wrapped.register_comm_hook(state=self, hook=_timed_allreduce)
        return wrapped

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        return model.no_sync()

    def comm_started(self) -> Optional[Any]:
        launched, self._last_launch = self._last_launch, None
        return launched

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module


def _timed_allreduce(strategy: "DataParallel", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    strategy._last_launch = strategy.stamp()
    tensor = bucket.buffer().div_(strategy.ctx.world_size)
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])
