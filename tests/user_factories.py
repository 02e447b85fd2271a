"""A user's own model and dataset factories, as `--model` / `--dataset pkg.module:factory` load them."""
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset


class TinyNet(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


def tiny_net(num_classes: int = 10) -> nn.Module:
    return TinyNet(num_classes)


class Exploding(TinyNet):
    def forward(self, x):
        if int(os.environ.get("RANK", 0)) == 1:
            raise RuntimeError("boom on rank 1")
        return super().forward(x)


def exploding_net(num_classes: int = 10) -> nn.Module:
    return Exploding(num_classes)


def float_pairs():
    """(train, test) map-style datasets of float images: fed through a DataLoader."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 8, 8, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    return TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])
