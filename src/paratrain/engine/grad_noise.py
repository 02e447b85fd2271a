"""Squared gradient norms of a small and a big batch at every optimizer step (`--grad-noise`).

They are what the unbiased two-batch estimators of the gradient noise scale take (McCandlish,
Kaplan, Amodei 2018, arXiv:1812.06162, Appendix A); `paratrain noise-scale` computes the estimate
from the files this writes. Each rank measures where the two batches already exist, so the
measurement costs a squared norm per bucket or per step and no extra communication:

- Data parallel on 2+ ranks (ddp, zero1): DDP's comm hook is wrapped, as k-diffusion's `gns.py`
  does: each bucket's squared norm is taken before averaging (this rank's gradient: the small
  batch, per-worker batch x --grad-accum) and after (the averaged gradient: the big batch, the
  global batch). The wrapped hook is whichever one averages the gradients (the shared-memory
  average or the process group's all-reduce), so the measurement does not change how they are
  averaged; summary.json's `grad_noise.source` names it.
- Fully sharded (fsdp, HSDP with --dp-replicate) on 2+ ranks: FSDP's reduce-scatter is the strategy's own
  (`set_custom_reduce_scatter`, PyTorch's documented override), and the input it is handed is this
  rank's unsharded gradient of one FSDP unit (padding is zeros): summed over the units, the small
  batch. The big batch is the averaged gradient each rank keeps a shard of after backward: its
  shards' squared norms are summed over the ranks at the log points (one small all-reduce there,
  none per step), divided by the --dp-replicate replicas that each hold the same shards.
- One worker with --grad-accum K: the loss of each micro-step is divided by K, so after the first
  micro-step the accumulated gradient is that micro-batch's mean gradient / K (the small batch,
  --batch-size) and after the last it is the step's mean gradient (the big batch, K x --batch-size).

The norms stay on the device and are written at the loop's log points and epoch ends, where it
reads the loss anyway, so no step waits for the device. Steps with a short batch (the end of an
epoch) are not recorded: the estimators need the batch sizes they are told.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from paratrain.config import TrainConfig
from paratrain.engine.distributed import group_device

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future]


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(tensor.float()).square()


class BucketNorms:
    """A DDP comm hook's wrapper that sums each bucket's squared norm before and after averaging."""

    def __init__(self) -> None:
        self.local: list[torch.Tensor] = []
        self.averaged: list[torch.Tensor] = []

    def wrap(self, hook: CommHook) -> CommHook:
        # Unannotated: DDP checks a hook's annotations against the real classes, and this module's are strings.
        def measured_hook(state, bucket):  # type: ignore[no-untyped-def]
            # Taken before the hook runs: the backend hook divides the bucket in place.
            self.local.append(squared_norm(bucket.buffer()))
            return hook(state, bucket).then(self._after_averaging)

        return measured_hook

    def _after_averaging(self, future: torch.futures.Future) -> torch.Tensor:
        averaged = future.value()
        self.averaged.append(squared_norm(averaged))
        return averaged

    def source(self, averaging: str | None) -> str:
        return f"ddp comm hook around the {averaging} average"

    def take(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's (|local gradient|², |averaged gradient|²); DDP has waited for every bucket."""
        local, averaged = torch.stack(self.local).sum(), torch.stack(self.averaged).sum()
        self.local.clear()
        self.averaged.clear()
        return local, averaged

    def complete(self, averaged: torch.Tensor) -> torch.Tensor:
        """The averaged gradients' squared norms of the steps since the last log point: whole already."""
        return averaged


class ShardNorms:
    """FSDP: this rank's unsharded gradient as each reduce-scatter receives it, and the averaged shards it
    keeps (module docstring)."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.local: list[torch.Tensor] = []

    def before_reduce_scatter(self, unsharded: torch.Tensor) -> None:
        self.local.append(squared_norm(unsharded))

    def source(self, averaging: str | None) -> str:
        return f"fsdp {averaging}: each rank's gradient going in, the averaged shards summed over the ranks"

    def take(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's (|local gradient|², this rank's part of |averaged gradient|²), after the backward that
        reduce-scattered: FSDP has waited for its reduce-scatters and put the averaged shards into .grad."""
        local = torch.stack(self.local).sum()
        self.local.clear()
        shards = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
        return local, torch.stack([squared_norm(shard) for shard in shards]).sum()

    def complete(self, averaged: torch.Tensor) -> torch.Tensor:
        """The steps' |averaged gradient|²: every rank's shards summed, once per replica of them. Summed on the
        group's device: --cpu-offload keeps the shards, and so their norms, in host memory, which NCCL refuses."""
        summed = averaged.to(group_device())
        dist.all_reduce(summed)
        return summed / self.replicas


# What measures a data-parallel step's two norms: DDP's buckets or FSDP's reduce-scatters.
DataParallelNorms = BucketNorms | ShardNorms


class MeasuredReduceScatter(ReduceScatter):
    """FSDP's own reduce-scatter (`dist.reduce_scatter_single`), given to each FSDP module with
    `set_custom_reduce_scatter`: it hands the local gradient to `norms` (when measuring) and calls `started`
    (when timing) first."""

    def __init__(self, norms: ShardNorms | None, started: Callable[[], None] | None = None):
        self.norms, self.started = norms, started

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        if self.started is not None:
            self.started()
        if self.norms is not None:
            self.norms.before_reduce_scatter(input_tensor)
        return dist.reduce_scatter_single(output_tensor, input_tensor, group=group, op=op, async_op=async_op)


class GradNoiseRecorder:
    """Collects one (small, big) pair per optimizer step and appends them to this rank's file."""

    def __init__(
        self,
        cfg: TrainConfig,
        rank: int,
        data_parallel_ranks: int,
        run_path: Path,
        norms: DataParallelNorms | None,
        allreduce: str | None,
    ):
        self.data_parallel = data_parallel_ranks
        self.norms = norms
        if norms is not None:
            self.source = norms.source(allreduce)
        else:
            self.source = "gradient accumulation (first micro-batch and whole step)"
        self.small_batch, self.big_batch = self.batches(cfg.batch_size, cfg.grad_accum)
        self.ranks = data_parallel_ranks if norms is not None else 1
        self.path = grad_noise_file(run_path, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor, int, int]] = []
        self.first: torch.Tensor | None = None
        self.full = True

    def batches(self, micro_batch: int, accum: int) -> tuple[int, int]:
        """The (small, big) batch sizes of a step of `accum` micro-steps of `micro_batch` samples a rank
        (--batch-schedule changes both)."""
        if self.norms is not None:  # this rank's step, and the average over the ranks
            return micro_batch * accum, micro_batch * accum * self.data_parallel
        return micro_batch, micro_batch * accum  # the first micro-batch, and the whole step

    def micro_step(
        self, model: nn.Module, index: int, sync: bool, batch_len: int, step: int, micro_batch: int, accum: int
    ) -> None:
        """After micro-step `index` (0-based within optimizer step `step`, 1-based, of `accum` micro-steps of
        `micro_batch` samples) has run backward. A step of fewer micro-steps (an epoch's last) is not recorded:
        its batches are not `accum`'s, and on one worker a step of one micro-step has no small batch."""
        self.full = (self.full or index == 0) and batch_len == micro_batch
        if self.norms is None and index == 0:
            self.first = _gradient_squared_norm(model) * accum**2
        if not sync:
            return
        if self.norms is not None:
            small, big = self.norms.take(model)
        else:
            small, big = self.first, _gradient_squared_norm(model)
        if self.full and index == accum - 1:
            self.pending.append((step, small, big, micro_batch, accum))

    def flush(self) -> list[tuple[float, float, int, int]]:
        """Append the steps measured since the last flush to this rank's file; returns them as
        (|small|², |big|², small batch, big batch), for --batch-schedule adaptive."""
        if not self.pending:
            return []
        smalls = torch.stack([small for _, small, _, _, _ in self.pending])
        bigs = torch.stack([big for _, _, big, _, _ in self.pending])
        if self.norms is not None:
            bigs = self.norms.complete(bigs)
        values = torch.stack([smalls, bigs], dim=1).tolist()
        measured = [
            (small, big, *self.batches(micro_batch, accum))
            for (_, _, _, micro_batch, accum), (small, big) in zip(self.pending, values)
        ]
        with open(self.path, "a") as f:
            for (step, *_), (small, big, small_batch, big_batch) in zip(self.pending, measured):
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "small_sq": small,
                            "big_sq": big,
                            "small_batch": small_batch,
                            "big_batch": big_batch,
                        }
                    )
                    + "\n"
                )
        self.pending.clear()
        return measured

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "small_batch": self.small_batch,
            "big_batch": self.big_batch,
            "ranks": self.ranks,
            "files": "grad_noise/rank<R>.jsonl",
        }


def grad_noise_file(run_path: Path, rank: int) -> Path:
    return Path(run_path) / "grad_noise" / f"rank{rank}.jsonl"


def _gradient_squared_norm(model: nn.Module) -> torch.Tensor:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads).float().square()
