"""Batches for one rank: the in-memory fast path and the DataLoader path.

Sharding follows torch's DistributedSampler exactly (a permutation shared by all ranks, seeded by
seed + epoch, padded to a multiple of the world size, rank r taking every world-th index from r),
so N ranks with batch b see, step by step, the same samples as one process with batch N·b.

The in-memory path keeps the whole uint8 dataset on the device and cuts batches with one
`index_select`: no per-sample Python, no collate, no host-to-device copy per step. Conversion to
float, augmentation and normalisation run batched on the device.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from paratrain.engine.distributed import RankContext
from paratrain.workloads.datasets import Split
from paratrain.workloads.objective import Inputs
from paratrain.workloads.samples import KeywordSamples, map_inputs
from paratrain.workloads.text import TokenStream

# The inputs are a tensor, or a dict of keyword inputs (dict samples: workloads/samples.py); the targets a tensor.
Batch = tuple[Inputs, torch.Tensor]


class BatchPreparer:
    """uint8 images -> float in [0, 1] -> optional resize and augmentation -> normalised to [-1, 1].

    The normalisation is that of PyTorch's CIFAR-10 tutorial (mean 0.5, std 0.5 per channel).
    Float inputs (user datasets) are taken as already normalised and only resized or augmented.
    """

    def __init__(self, image_size: int | None = None, augment: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.image_size = image_size
        self.augment = augment

    def __call__(self, x: Inputs, train: bool) -> Inputs:
        if isinstance(x, dict):
            return x  # keyword inputs go to the model as the collate made them
        if x.dim() == 2 and not x.is_floating_point():
            return x.long()  # token ids [B, T] (text): nothing to convert
        images = x.dtype == torch.uint8
        x = x.float()
        if images:
            x = x.mul_(1 / 255)
        if self.image_size is not None and x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        if train and self.augment is not None:
            x = self.augment(x)
        if images:
            x = x.mul_(2).sub_(1)
        return x


def shard_indices(n: int, ctx: RankContext, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """This rank's indices for one epoch, as torch's DistributedSampler (drop_last=False) gives them."""
    if shuffle:
        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator)
    else:
        order = torch.arange(n)
    total = -(-n // ctx.world_size) * ctx.world_size
    if total > n:
        order = torch.cat([order, order[: total - n]])
    return order[ctx.rank : total : ctx.world_size]


class TensorBatches:
    """Training batches of an in-memory split, sharded across ranks and reshuffled every epoch."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int, ctx: RankContext, seed: int, prepare: BatchPreparer
    ):
        self.x = x.to(ctx.device)
        self.y = y.to(ctx.device)
        self.batch_size = batch_size
        self.ctx = ctx
        self.seed = seed
        self.prepare = prepare
        self.per_rank = -(-len(y) // ctx.world_size)

    def __len__(self) -> int:
        return -(-self.per_rank // self.batch_size)

    def epoch(self, epoch: int, first: int = 0) -> Iterator[Batch]:
        """This rank's batches of `epoch`, from batch `first` on (a run resumed mid-epoch); skipped
        batches are never prepared, so they draw no augmentation randomness."""
        idx = shard_indices(len(self.y), self.ctx, self.seed, epoch, shuffle=True).to(self.ctx.device)
        for start in range(first * self.batch_size, len(idx), self.batch_size):
            batch = idx[start : start + self.batch_size]
            yield self.prepare(self.x.index_select(0, batch), train=True), self.y.index_select(0, batch)


class WindowBatches:
    """Training windows of a text: each epoch `samples_per_epoch` random windows of seq_len + 1 bytes.

    The windows' start offsets are drawn from a generator seeded by seed + epoch and dealt to the
    ranks as `shard_indices` deals samples, so N ranks with batch b train, step by step, on the
    same windows as one process with batch N·b.
    """

    def __init__(self, stream: TokenStream, batch_size: int, ctx: RankContext, seed: int):
        self.tokens = stream.tokens.to(ctx.device)
        self.seq_len = stream.seq_len
        self.samples = stream.samples_per_epoch
        self.batch_size = batch_size
        self.ctx = ctx
        self.seed = seed
        self.offsets = torch.arange(stream.seq_len + 1, device=ctx.device)
        self.per_rank = -(-self.samples // ctx.world_size)

    def __len__(self) -> int:
        return -(-self.per_rank // self.batch_size)

    def epoch(self, epoch: int, first: int = 0) -> Iterator[Batch]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        starts = torch.randint(0, len(self.tokens) - self.seq_len, (self.samples,), generator=generator)
        mine = starts[shard_indices(self.samples, self.ctx, self.seed, epoch, shuffle=False)].to(self.ctx.device)
        for start in range(first * self.batch_size, len(mine), self.batch_size):
            windows = self.tokens[mine[start : start + self.batch_size, None] + self.offsets].long()
            yield windows[:, :-1], windows[:, 1:]


class LoaderBatches:
    """Training batches through a DataLoader: for datasets that are not in memory or need workers."""

    def __init__(
        self, dataset: Any, batch_size: int, ctx: RankContext, seed: int, prepare: BatchPreparer, workers: int
    ):
        self.sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed)
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=workers,
            collate_fn=_collate(dataset),
            pin_memory=ctx.device.type == "cuda",
            persistent_workers=workers > 0,
        )
        self.ctx = ctx
        self.prepare = prepare
        self.per_rank = len(self.sampler)

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, first: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        for x, y in itertools.islice(self.loader, first, None):  # skipped batches are loaded, never prepared
            x = _to(x, self.ctx.device)
            yield self.prepare(x, train=True), y.to(self.ctx.device, non_blocking=True)


def _to(x: Inputs, device: torch.device) -> Inputs:
    return map_inputs(lambda t: t.to(device, non_blocking=True), x)


def _collate(dataset: Any) -> Callable[[list[Any]], Any] | None:
    """Dict samples' own collate; None: the DataLoader's default."""
    return dataset.collate if isinstance(dataset, KeywordSamples) else None


def eval_batches(
    data: Any, ctx: RankContext, batch_size: int, prepare: BatchPreparer, workers: int = 0
) -> Iterator[Batch]:
    """This rank's share of an evaluation split (rank::world, no padding, so nothing counts twice)."""
    if isinstance(data, Split) and workers == 0:
        idx = torch.arange(ctx.rank, len(data), ctx.world_size)
        for start in range(0, len(idx), batch_size):
            batch = idx[start : start + batch_size]
            yield prepare(data.x[batch].to(ctx.device), train=False), data.y[batch].to(ctx.device)
        return
    dataset = SplitDataset(data) if isinstance(data, Split) else data
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=range(ctx.rank, len(dataset), ctx.world_size),
        num_workers=workers,
        collate_fn=_collate(dataset),
        pin_memory=ctx.device.type == "cuda",
    )
    for x, y in loader:
        yield prepare(_to(x, ctx.device), train=False), y.to(ctx.device, non_blocking=True)


class SplitDataset(torch.utils.data.Dataset):
    """A map-style view of an in-memory split, for the DataLoader path."""

    def __init__(self, split: Any):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> Batch:
        return self.split.x[i], self.split.y[i]


def training_batches(
    data: Any, batch_size: int, ctx: RankContext, seed: int, prepare: BatchPreparer, loader_workers: int
) -> TensorBatches | WindowBatches | LoaderBatches:
    if isinstance(data, TokenStream):
        return WindowBatches(data, batch_size, ctx, seed)  # windows are cut on the device: no loader needed
    if isinstance(data, Split) and loader_workers == 0:
        return TensorBatches(data.x, data.y, batch_size, ctx, seed, prepare)
    dataset = SplitDataset(data) if isinstance(data, Split) else data
    return LoaderBatches(dataset, batch_size, ctx, seed, prepare, loader_workers)
