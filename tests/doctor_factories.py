"""Models and datasets built to have one problem each, for the doctor's evidence tests."""

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset


class SlowDataset(TensorDataset):
    """A map-style dataset whose every sample takes 2 ms to 'read' (a slow disk, a costly decode)."""

    def __getitem__(self, index):
        time.sleep(0.002)
        return super().__getitem__(index)


def slow_pairs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(144, 3, 8, 8, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    return SlowDataset(x[:128], y[:128]), TensorDataset(x[128:], y[128:])


def wide_mlp(num_classes: int = 10, in_channels: int = 3, image_size: int = 8) -> nn.Module:
    """2.7 M parameters (11 MB of gradients per step) and almost no compute per sample."""
    width = 1536
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_channels * image_size * image_size, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, num_classes),
    )
