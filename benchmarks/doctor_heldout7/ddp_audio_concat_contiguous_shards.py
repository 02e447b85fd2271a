"""Plain DDP audio classifier whose hand-made shards give rank 1 all the long recordings.

Mistake: the training set is two corpora joined with `ConcatDataset`: 384 half-second command clips and
384 ten-second utterances, the same number of clips each. `__getitem__` decodes the clip and computes its
log-mel spectrogram block by block (STFT, mel projection, log), pooled to a fixed 40 x 32 image, so every sample reaches
the model at the same size and the model's work per step is the same on both ranks; but the cost of
`__getitem__` grows with the clip's length. Instead of a DistributedSampler the user shards by hand with a
contiguous slice, `Subset(dataset, range(rank * n, (rank + 1) * n))`, so rank 0 gets exactly the short
corpus and rank 1 exactly the long one. Both ranks make the same number of steps of 16 clips, but rank 1's
data loading (in the main process, num_workers=0) is many times rank 0's and longer than the whole
balanced step, and rank 0 waits for it in every
gradient all-reduce.
Fix (--fix): `DistributedSampler(dataset, shuffle=True, seed=0)` over the concatenated set (with
`set_epoch`): every rank gets an even mix of short and long clips; the same 768 clips per epoch, 384 per
rank (24 steps).
Expected diagnosis: a straggler from the data, slow rank 1: rank 1's time per step is longer because its
samples are heavier to load (`ClipFeatures.__getitem__`: decode + STFT of 10 s clips vs 0.5 s on rank 0; the
model's forward/backward is the same size on both ranks) and rank 0 spends the difference waiting in the
gradient all-reduce; the cause is the contiguous hand-made shard over the concatenated corpora; use a
(shuffling) DistributedSampler or balance the audio seconds per rank.
"""

import gc
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

RATE, N_FFT, HOP, MELS, FRAMES, CLASSES = 16_000, 512, 160, 40, 32, 12
BLOCK = RATE // 4


def mel_filterbank() -> torch.Tensor:
    """Triangular filters, (MELS, N_FFT // 2 + 1), evenly spaced on the mel scale."""
    hz = torch.linspace(0, RATE / 2, N_FFT // 2 + 1)
    mel = 2595 * torch.log10(1 + hz / 700)
    centres = torch.linspace(0, float(mel[-1]), MELS + 2)
    lower, centre, upper = centres[:-2, None], centres[1:-1, None], centres[2:, None]
    return torch.clamp(torch.minimum((mel - lower) / (centre - lower), (upper - mel) / (upper - centre)), min=0)


class ClipFeatures(Dataset):
    """One corpus of synthetic recordings of `seconds` each: decoded on read, returned as a log-mel image."""

    def __init__(self, clips: int, seconds: float, seed: int):
        self.clips, self.length, self.seed = clips, int(seconds * RATE), seed
        self.window, self.mel = torch.hann_window(N_FFT), mel_filterbank()
        self.labels = torch.randint(0, CLASSES, (clips,), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.clips

    def __getitem__(self, index: int):
        label = int(self.labels[index])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        blocks = []
        for start in range(0, self.length, BLOCK):  # streamed: decode and featurise 0.25 s at a time
            t = torch.arange(start, min(start + BLOCK, self.length)) / RATE
            wave = 0.3 * torch.sin(2 * torch.pi * (200 + 60 * label) * t) + 0.1 * torch.randn(len(t), generator=g)
            power = torch.stft(wave, N_FFT, HOP, window=self.window, center=False, return_complex=True).abs().pow(2)
            blocks.append((self.mel @ power).clamp_min(1e-6).log())
        logmel = torch.cat(blocks, dim=1)
        return F.adaptive_avg_pool1d(logmel[None], FRAMES)[0][None], label


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_corpus = 24 * args.batch_size * world // 2
    dataset = ConcatDataset([ClipFeatures(per_corpus, 0.5, seed=1), ClipFeatures(per_corpus, 10.0, seed=2)])
    if args.fix:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    else:
        sampler, per_rank = None, len(dataset) // world
        shard = Subset(dataset, range(rank * per_rank, (rank + 1) * per_rank))  # this rank's part of the data
        loader = DataLoader(shard, batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (MELS // 4) * (FRAMES // 4), 64),
        nn.ReLU(),
        nn.Linear(64, CLASSES),
    )
    model = DDP(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        total_loss = steps = 0
        began = time.perf_counter()
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            steps += 1
            if meter.step(len(yb)):
                break
        print(
            f"epoch {epoch} rank-{rank} loss {total_loss / max(steps, 1):.4f} {time.perf_counter() - began:.2f} s",
            flush=True,
        )
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
