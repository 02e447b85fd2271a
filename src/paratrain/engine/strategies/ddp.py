"""Data parallel: the model replicated on every rank, the batch split, gradients averaged.

PyTorch's DistributedDataParallel (Li et al. 2020): gradients are bucketed and averaged while
backward is still running. Each bucket goes through one of two comm hooks, both of which stamp the
moment the bucket is handed over, so the loop can tell how much of the averaging was left exposed
after the backward computation finished:
- `_backend_allreduce`: DDP's default, an asynchronous all-reduce on the process group (NCCL, gloo);
- `_shm_average`: CPU ranks on one host average through shared memory (engine/shm_allreduce.py),
  all buckets at once when the last is ready, where each rank has cores of its own
  (docs/training.md).
"""
import logging
from contextlib import AbstractContextManager
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.shm_allreduce import SharedMemoryAverage, open_shared_average
from paratrain.engine.strategies.base import WholeModelStrategy

log = logging.getLogger("paratrain.rank")


class DataParallel(WholeModelStrategy):
    name = "ddp"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        self.bucket_cap_mb = cfg.bucket_cap_mb
        self.allreduce: Optional[str] = None        # what averaged the gradients: shm, gloo, nccl, ...
        self._shm: Optional[SharedMemoryAverage] = None
        self._pending: list[tuple[torch.Tensor, torch.futures.Future]] = []    # buckets of this step, in order
        self._last_launch: Optional[Any] = None

    def wrap(self, model: nn.Module) -> nn.Module:
        wrapped = DistributedDataParallel(
            model,
            device_ids=[self.ctx.device.index] if self.ctx.device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb,
            # Gradients live inside the buckets: no second copy of them is held. The loop's
            # zero_grad(set_to_none=True) drops the views each step and DDP points them back into
            # the buckets after backward, copying once (benchmarks/grad_bucket_view.py: views in
            # every step; zeroing in place instead was 5-10 % slower on CPU, docs/benchmarks.md).
            gradient_as_bucket_view=True,
        )
        if self.ctx.allreduce == "shm":
            self._shm = open_shared_average(self.ctx.rank, self.ctx.world_size)
            if self._shm is None:
                log.warning("shared-memory all-reduce unavailable on some rank; averaging through %s", dist.get_backend())
        if self._shm is not None:
            self.allreduce = "shm"
            wrapped.register_comm_hook(state=self, hook=_shm_average)
        else:
            self.allreduce = dist.get_backend()
            wrapped.register_comm_hook(state=self, hook=_backend_allreduce)
        return wrapped

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        return model.no_sync()

    def comm_started(self) -> Optional[Any]:
        launched, self._last_launch = self._last_launch, None
        return launched

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module


def _backend_allreduce(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    strategy._last_launch = strategy.stamp()
    tensor = bucket.buffer().div_(strategy.ctx.world_size)
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


def _shm_average(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # Buckets wait until the last one is ready and are then averaged together: the ranks meet
    # once per step instead of once per bucket, and each meeting costs the wait for the slower
    # rank. Little is lost to overlap on CPU: averaging would use the rank's own core, as backward does.
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    strategy._pending.append((bucket.buffer(), future))
    if bucket.is_last():
        strategy._last_launch = strategy.stamp()
        for buffer, pending in strategy._pending:
            pending.set_result(strategy._shm.average_(buffer))
        strategy._pending.clear()
    return future
