"""ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d at ImageNet scale, for `paratrain plan --model
dle_models:NAME` (run with PYTHONPATH=benchmarks): the two networks beside ResNet-50 in NVIDIA
DeepLearningExamples' PyTorch ConvNets, whose published 1- and 8-GPU throughput docs/planner.md
predicts. Architectures of Xie et al. 2017 (ResNeXt: 32 groups of width 4 in the first stage, the
stride on the grouped 3x3 as in ResNet v1.5) and Hu et al. 2018 (a squeeze-and-excitation gate of
reduction 16 after each block's last convolution): 44.2 M and 49.0 M parameters at 1,000 classes,
the figures those papers' reference implementations have. Only the plan builds them (on the meta
device); paratrain's registry keeps to models it trains here.
"""

from __future__ import annotations

import torch
from torch import nn

GROUPS, WIDTH_PER_GROUP, EXPANSION = 32, 4, 4


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(channels, channels // reduction, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels // reduction, channels, 1),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


class Bottleneck(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int, squeeze_excite: bool):
        super().__init__()
        width = GROUPS * WIDTH_PER_GROUP * planes // 64
        out = planes * EXPANSION
        layers = [
            nn.Conv2d(in_planes, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, groups=GROUPS, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False),
            nn.BatchNorm2d(out),
        ]
        if squeeze_excite:
            layers.append(SqueezeExcite(out))
        self.body = nn.Sequential(*layers)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(in_planes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or in_planes != out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def _resnext101(num_classes: int, in_channels: int, squeeze_excite: bool) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    in_planes = 64
    for index, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 23, 3))):
        for block in range(blocks):
            layers.append(Bottleneck(in_planes, planes, 2 if block == 0 and index > 0 else 1, squeeze_excite))
            in_planes = planes * EXPANSION
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_planes, num_classes)]
    return nn.Sequential(*layers)


def resnext101_32x4d(num_classes: int = 1000, in_channels: int = 3) -> nn.Module:
    return _resnext101(num_classes, in_channels, squeeze_excite=False)


def se_resnext101_32x4d(num_classes: int = 1000, in_channels: int = 3) -> nn.Module:
    return _resnext101(num_classes, in_channels, squeeze_excite=True)
