"""Needless activation checkpointing: every block of a small residual CNN runs under torch.utils.checkpoint,
copied from a large-model recipe, though this model's activations take a few MiB of a machine with gigabytes
free. Backward then runs every block's forward again. Fix (`--fix`): no checkpointing.

    paratrain launch -n 2 benchmarks/doctor_faults/needless_checkpointing.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.net(x))


class ResidualCNN(nn.Module):
    def __init__(self, recompute: bool, channels: int = 32, depth: int = 6):
        super().__init__()
        self.recompute = recompute
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(Block(channels) for _ in range(depth))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute else block(x)
        return self.head(x)


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(ResidualCNN(recompute=not args.fix))
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
meter = Meter(args)
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if meter.step(len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
