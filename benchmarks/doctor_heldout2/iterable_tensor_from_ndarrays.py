"""IterableDataset that builds each batch with torch.tensor(list of numpy arrays).

Mistake: a streaming speech-feature dataset (an IterableDataset that reads this rank's shards and yields
ready-made batches, like a vocoder recipe's collater) assembles every batch of log-mel frames with
`torch.tensor(frames, dtype=torch.float)`, where `frames` is a Python list of numpy arrays. PyTorch then
walks the list element by element (it warns: "Creating a tensor from a list of numpy.ndarrays is
extremely slow"), tens of milliseconds of single-threaded host work per batch, in the training process.
Source: https://github.com/pytorch/pytorch/issues/13918 (and its duplicate
https://github.com/pytorch/pytorch/issues/57467, "orders of magnitude slower than np.array"), reported
from training code in https://github.com/kan-bayashi/ParallelWaveGAN/issues/367 (the collater's
`torch.tensor(y_batch, dtype=torch.float)`) and https://github.com/babysor/MockingBird/issues/731.
Fix (--fix): torch.from_numpy(np.stack(frames)) (one contiguous copy); the same batches, same model.
Expected diagnosis: the step waits on input: batch assembly in FeatureStream.__iter__ (torch.tensor on
a list of ndarrays) is host-bound, single-threaded; stack into one array first.
"""

import gc
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

MELS, FRAMES, SPEAKERS, UTTERANCES_PER_SHARD, SHARDS = 80, 100, 16, 64, 8


class FeatureStream(IterableDataset):
    """Yields (frames, speaker) batches from this rank's shards; shards stand for feature files on disk."""

    def __init__(self, rank: int, world: int, batch_size: int, stack: bool):
        self.shards = list(range(rank, SHARDS, world))
        self.batch_size, self.stack, self.epoch = batch_size, stack, 0

    def read_shard(self, shard: int):
        rng = np.random.default_rng(shard)
        speakers = rng.integers(0, SPEAKERS, UTTERANCES_PER_SHARD)
        centers = np.random.default_rng(99).standard_normal((SPEAKERS, MELS, 1)).astype(np.float32)
        noise = rng.standard_normal((UTTERANCES_PER_SHARD, MELS, FRAMES)).astype(np.float32)
        return [(centers[s] + noise[i], int(s)) for i, s in enumerate(speakers)]

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(self.shards)
        self.epoch += 1
        for shard in order:
            records = self.read_shard(int(shard))
            for start in range(0, len(records) - self.batch_size + 1, self.batch_size):
                chunk = records[start : start + self.batch_size]
                frames = [mel for mel, _ in chunk]
                if self.stack:
                    x = torch.from_numpy(np.stack(frames))
                else:
                    x = torch.tensor(frames, dtype=torch.float)
                yield x, torch.tensor([speaker for _, speaker in chunk])


class SpeakerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv1d(MELS, 96, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(96, 96, 5, padding=2),
            nn.ReLU(),
        )
        self.head = nn.Linear(96, SPEAKERS)

    def forward(self, x):
        return self.head(self.convs(x).mean(-1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("once", message="Creating a tensor from a list of numpy")
    dist.init_process_group("gloo")
    stream = FeatureStream(dist.get_rank(), dist.get_world_size(), args.batch_size, stack=args.fix)
    loader = DataLoader(stream, batch_size=None)
    torch.manual_seed(0)
    model = DDP(SpeakerNet())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter = Meter(args)
    while True:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(len(y)):
                break
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
