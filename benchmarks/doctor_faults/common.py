"""What the catalogue's scripts share: the synthetic CIFAR-shaped data, the small CNN, and the benchmark's
bookkeeping. The data and the model stand for a user's own `data.py` and `model.py`; `Meter` is the
benchmark's (it bounds the run and prints the THROUGHPUT line) and adds no per-step collective, so it does
not change what a fault costs.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


def arguments(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="apply the remedy")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps")
    parser.add_argument("--seconds", type=float, default=12.0, help="stop at the first epoch end after this")
    parser.add_argument(
        "--factor",
        type=int,
        default=None,
        help="the fix's size where it has one: the global batch's factor the doctor's remedy names (default: the "
        "script's own)",
    )
    return parser


def synthetic_cifar(samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels shaped like CIFAR-10, made in memory with a fixed seed (no download)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(samples, 3, 32, 32, generator=generator), torch.randint(0, 10, (samples,), generator=generator)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(64 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class Meter:
    """Counts this rank's training samples and says when to stop: after `--steps` optimizer steps, or at
    the first epoch end after `--seconds` (rank 0's clock, broadcast so that every rank stops at the same
    epoch). `report()` has rank 0 print `THROUGHPUT <samples/s>`: the training samples of all ranks per
    second of wall time after the first epoch (evaluation and checkpoints included), or after the first
    20 % of the steps when the run stopped within its first epoch."""

    def __init__(self, args: argparse.Namespace):
        self.max_steps, self.max_seconds = args.steps, args.seconds
        self.start = time.perf_counter()
        self.samples = 0
        self.steps: list[tuple[float, int]] = []  # (time, samples so far) after each optimizer step
        self.epochs: list[tuple[float, int]] = []  # the same at each epoch's end

    def step(self, samples: int) -> bool:
        """Call after each optimizer step; True when the step budget is spent."""
        self.samples += samples
        self.steps.append((time.perf_counter(), self.samples))
        return self.max_steps is not None and len(self.steps) >= self.max_steps

    def end_epoch(self) -> bool:
        """Call at each epoch's end on every rank; True when the run should stop."""
        now = time.perf_counter()
        self.epochs.append((now, self.samples))
        spent = self.max_steps is not None and len(self.steps) >= self.max_steps
        stop = torch.tensor([int(spent or now - self.start >= self.max_seconds)])
        dist.broadcast(stop, src=0)
        return bool(stop.item())

    def report(self) -> None:
        if len(self.epochs) >= 2:
            (began, before), (ended, _) = self.epochs[0], self.epochs[-1]
        else:
            skip = len(self.steps) // 5
            began, before = self.steps[skip - 1] if skip else (self.start, 0)
            ended = self.steps[-1][0]
        counted = torch.tensor([float(self.samples - before)])
        dist.all_reduce(counted)
        if dist.get_rank() == 0:
            print(f"THROUGHPUT {counted.item() / (ended - began):.1f}", flush=True)
