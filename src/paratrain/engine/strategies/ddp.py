"""Data parallel: the model replicated on every rank, the batch split, gradients averaged.

PyTorch's DistributedDataParallel (Li et al. 2020): gradients are bucketed and averaged while
backward is still running. Each bucket goes through one of two comm hooks, both of which stamp the
moment the bucket is handed over, so the loop can tell how much of the averaging was left exposed
after the backward computation finished:
- `_backend_allreduce`: DDP's default, an asynchronous all-reduce on the process group (NCCL, gloo);
- `_shm_average`: CPU ranks on one host average through shared memory (engine/shm_allreduce.py),
  all buckets at once when the last is ready, where each rank has cores of its own
  (docs/training.md).
Synchronising less, sending less (docs/synchronisation.md): `--sync-every H` (local SGD, torch's
post-local-SGD hook and PeriodicModelAverager), `--grad-compression fp16|bf16` (torch's compress
wrappers around either hook), `--grad-compression powersgd` (torch's PowerSGD hook) and
`--reduce ps` (reduce to rank 0 and broadcast back). Every hook counts the bytes it hands over.
With --grad-noise the chosen hook is wrapped to take each bucket's squared norm before and after
it averages (engine/grad_noise.py).
"""

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_wrapper, fp16_compress_wrapper
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext, join_group_of_one
from paratrain.engine.grad_noise import BucketNorms
from paratrain.engine.shm_allreduce import SharedMemoryAverage, open_shared_average
from paratrain.engine.strategies.base import WholeModelStrategy
from paratrain.errors import UsageError

log = logging.getLogger("paratrain.rank")

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future]


class DataParallel(WholeModelStrategy):
    name = "ddp"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        join_group_of_one(ctx.device)  # one worker: DDP's reducer and hooks on a group of one
        self.bucket_cap_mb = cfg.bucket_cap_mb
        self.allreduce: str | None = None  # what averaged the gradients: shm, gloo, nccl, ...
        self._shm: SharedMemoryAverage | None = None
        self._pending: list[tuple[torch.Tensor, torch.futures.Future]] = []  # buckets of this step, in order
        self._last_launch: Any | None = None
        self._bytes = 0  # bytes this rank handed to collectives (compressed size when compressed)
        self._why: str | None = None  # why the gradients took the path they took
        self._local_sgd: PostLocalSGDState | None = None  # --sync-every H > 1
        self._averager: PeriodicModelAverager | None = None
        self._powersgd: PowerSGDState | None = None  # --grad-compression powersgd

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
        hook = self._gradient_hook()
        if self.cfg.measures_grad_noise and self.ctx.world_size > 1:
            # --grad-noise: norms of each bucket before and after whichever hook averages it.
            self.grad_norms = norms = BucketNorms()
            hook = norms.wrap(hook)
        wrapped.register_comm_hook(state=self, hook=hook)
        return wrapped

    def _gradient_hook(self) -> CommHook:
        """The comm hook that synchronises gradients under this run's --sync-every, --grad-compression
        and --reduce; sets `allreduce` (what moved them) and `_why` (why that path)."""
        cfg, backend = self.cfg, dist.get_backend()
        if cfg.sync_every > 1:
            # Local SGD (Lin et al. 2018): torch's post-local-SGD hook all-reduces gradients for the
            # first --sync-warmup steps and then leaves them local (post_local_gradient_allreduce=False:
            # its default would all-reduce them within each node, i.e. on one host everywhere);
            # PeriodicModelAverager averages the parameters after every H-th optimizer step.
            self._local_sgd = PostLocalSGDState(
                process_group=None,
                subgroup=None,
                start_localSGD_iter=cfg.sync_warmup,
                post_local_gradient_allreduce=False,
            )
            self._averager = PeriodicModelAverager(period=cfg.sync_every, warmup_steps=cfg.sync_warmup)
            self.allreduce, self._why = (
                backend,
                ("local SGD: torch's post_localSGD_hook and PeriodicModelAverager average through the process group"),
            )
            return _local_sgd
        if cfg.grad_compression == "powersgd":
            self._powersgd = PowerSGDState(
                process_group=None, matrix_approximation_rank=cfg.powersgd_rank, start_powerSGD_iter=cfg.powersgd_start
            )
            self.allreduce, self._why = (
                backend,
                (
                    "PowerSGD all-reduces its low-rank factors through the process group; "
                    "the shared-memory average has no low-rank form"
                ),
            )
            return _powersgd
        if cfg.reduce == "ps":
            hook: CommHook = _reduce_to_one
            self.allreduce, self._why = (
                f"reduce+broadcast ({backend})",
                "--reduce ps: gradients summed on rank 0, which broadcasts the average",
            )
        else:
            if self.ctx.allreduce == "shm" and self.ctx.world_size > 1:  # one rank has nothing to average
                self._shm = open_shared_average(self.ctx.rank, self.ctx.world_size, timeout_s=self.ctx.timeout_s)
                if self._shm is None:
                    log.warning("shared-memory all-reduce unavailable on some rank; averaging through %s", backend)
            hook = _shm_average if self._shm is not None else _backend_allreduce
            self.allreduce = "shm" if self._shm is not None else backend
            if self.ctx.world_size == 1:
                self._why = "one rank: the all-reduce of a group of one, which moves nothing"
            elif self._shm is not None:
                self._why = "CPU ranks with cores of their own on one x86-64 host"
            else:
                unavailable = " (shared memory was unavailable)" if self.ctx.allreduce == "shm" else ""
                self._why = "the process group's all-reduce" + unavailable
        if cfg.grad_compression in ("fp16", "bf16"):
            # torch's compress wrapper casts each bucket before whichever hook averages it and back
            # after: half the bytes through shared memory, the backend or the reduce-to-one alike.
            wrapper = fp16_compress_wrapper if cfg.grad_compression == "fp16" else bf16_compress_wrapper
            hook = wrapper(hook)
            self._why += f"; buckets cast to {cfg.grad_compression} first"
        return hook

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> tuple[Any, Any] | None:
        super().optimizer_step(optimizer, scaler)
        if self._averager is None:
            return None
        averager = self._averager
        # PeriodicModelAverager's own rule (it counts the step whether or not it averages).
        averages = (
            averager.step >= averager.warmup_steps and (averager.step - averager.warmup_steps) % averager.period == 0
        )
        start = self.stamp()
        averager.average_parameters(optimizer.param_groups)
        if not averages:
            return None
        self._bytes += sum(_nbytes(p) for group in optimizer.param_groups for p in group["params"])
        return start, self.stamp()

    def bytes_sent(self) -> int | None:
        return self._bytes

    def summary_fields(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "sync": {
                "sync_every": cfg.sync_every,
                "sync_warmup": cfg.sync_warmup,
                "grad_compression": cfg.grad_compression,
                **(
                    {"powersgd_rank": cfg.powersgd_rank, "powersgd_start": cfg.powersgd_start}
                    if cfg.grad_compression == "powersgd"
                    else {}
                ),
                "reduce": cfg.reduce,
                "path": self.allreduce,
                "why": self._why,
            }
        }

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        return model.no_sync()

    def comm_started(self) -> Any | None:
        launched, self._last_launch = self._last_launch, None
        return launched

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _backend_allreduce(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    strategy._last_launch = strategy.stamp()
    strategy._bytes += _nbytes(bucket.buffer())
    tensor = bucket.buffer().div_(strategy.ctx.world_size)
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


def _at_the_last_bucket(
    strategy: DataParallel, bucket: dist.GradBucket, average: Callable[[torch.Tensor], tuple[torch.Tensor, int]]
) -> torch.futures.Future[torch.Tensor]:
    """Hold each bucket until the last one is ready, then `average` them all (each call returns the
    averaged bucket and the bytes this rank handed over): the ranks meet once per step instead of
    once per bucket, and each meeting costs the wait for the slower rank. Little is lost to
    overlap on CPU: averaging would use the rank's own core, as backward does."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    strategy._pending.append((bucket.buffer(), future))
    if bucket.is_last():
        strategy._last_launch = strategy.stamp()
        for buffer, pending in strategy._pending:
            averaged, sent = average(buffer)
            strategy._bytes += sent
            pending.set_result(averaged)
        strategy._pending.clear()
    return future


def _shm_average(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return _at_the_last_bucket(strategy, bucket, lambda buffer: (strategy._shm.average_(buffer), _nbytes(buffer)))


def _reduce_to_one(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # --reduce ps, a synchronous parameter server made of torch.distributed's reduce and broadcast:
    # rank 0 receives every rank's gradient and sends the average back to each, so its traffic
    # grows with the ranks where a ring all-reduce's stays flat. Each bucket is divided before it
    # is summed, as the all-reduce hook does: with 2 ranks the two agree bitwise.
    def via_rank_0(buffer: torch.Tensor) -> tuple[torch.Tensor, int]:
        buffer.div_(strategy.ctx.world_size)
        dist.reduce(buffer, dst=0)
        dist.broadcast(buffer, src=0)
        # Every rank hands its gradient to the reduce; rank 0 also hands the average to the broadcast.
        return buffer, _nbytes(buffer) * (2 if strategy.ctx.is_main else 1)

    return _at_the_last_bucket(strategy, bucket, via_rank_0)


def _local_sgd(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state = strategy._local_sgd
    if state.iter < state.start_localSGD_iter:  # warm-up: the hook all-reduces this bucket
        strategy._last_launch = strategy.stamp()
        strategy._bytes += _nbytes(bucket.buffer())
    return post_localSGD_hook(state, bucket)


def _powersgd(strategy: DataParallel, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # What PowerSGD all-reduces is read from its own count of elements after compression (the P
    # and Q factors plus the tensors not worth compressing); before --powersgd-start, whole buckets.
    state = strategy._powersgd
    strategy._last_launch = strategy.stamp()
    compressing = state.iter >= state.start_powerSGD_iter
    before = state.total_numel_after_compression
    future = powerSGD_hook(state, bucket)
    elements = state.total_numel_after_compression - before if compressing else bucket.buffer().numel()
    strategy._bytes += elements * bucket.buffer().element_size()
    return future


def check_synchronisation(cfg: TrainConfig, device_type: str) -> None:
    """Before anything is written: the options that need the process group are not forced onto
    shared memory, and the device can compute in the compressed type."""
    needs_group = (
        "--sync-every"
        if cfg.sync_every > 1
        else "--grad-compression powersgd"
        if cfg.grad_compression == "powersgd"
        else "--reduce ps"
        if cfg.reduce == "ps"
        else None
    )
    if needs_group and cfg.allreduce == "shm":
        raise UsageError(
            f"--allreduce shm cannot carry {needs_group}: it runs through the process group's collectives "
            "(torch's hooks); use --allreduce auto or backend"
        )
    if cfg.grad_compression == "bf16" and not _ddp_accepts_bf16_hook():
        # DDP's register_comm_hook refuses torch's bf16 wrapper unless the build has CUDA with NCCL
        # 2.10+ (or XPU), whatever the backend: gloo itself would average bfloat16.
        raise UsageError(
            f"--grad-compression bf16: DDP accepts torch's bf16 compress hook only in torch builds with CUDA "
            f"and NCCL 2.10+ (this is {torch.__version__}); use --grad-compression fp16"
        )
    if cfg.grad_compression == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("--grad-compression bf16: this GPU has no bfloat16; use --grad-compression fp16")


def _ddp_accepts_bf16_hook() -> bool:
    """The condition of DistributedDataParallel.register_comm_hook for bf16_compress_wrapper_hook."""
    cuda_nccl = (
        (torch.version.cuda is not None or torch.version.hip is not None)
        and dist.is_nccl_available()
        and torch.cuda.nccl.version() >= (2, 10)
    )
    xpu = dist.is_xccl_available() and torch.xpu.is_available()
    return bool(cuda_nccl or xpu)
