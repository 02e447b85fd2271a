"""Models of the published runs in benchmarks/planner_regimes/, for `paratrain plan --model regime_models:NAME`
(run with PYTHONPATH=benchmarks). Only the plan builds them, on the meta device.

- `gpt_l{layers}_h{hidden}_a{heads}_v{vocab}`: Megatron-LM's GPT (Narayanan et al. 2021, Table 1's models; GPT-3's
  layout, Brown et al. 2020): paratrain's own gpt (learned positions, pre-norm blocks of attention and a 4x
  GELU MLP, the head tied to the token embedding) at that shape, over the run's sequence.
- `vgg16`: VGG-16 (Simonyan & Zisserman 2015, configuration D): 13 3x3 convolutions in five stages, each
  closed by a 2x2 max-pool, then 4096-4096-classes fully connected layers; 138 M parameters at 224 pixels and
  1,000 classes, most of them in the first fully connected layer (what makes its all-reduce large).
"""

from __future__ import annotations

import re

from torch import nn

from paratrain.workloads.gpt import GPT, GPTConfig

VGG16_STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def vgg16(num_classes: int = 1000, in_channels: int = 3, image_size: int = 224) -> nn.Module:
    layers: list[nn.Module] = []
    channels = in_channels
    for width, convolutions in VGG16_STAGES:
        stage: list[nn.Module] = []
        for _ in range(convolutions):
            stage += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            channels = width
        layers.append(nn.Sequential(*stage, nn.MaxPool2d(2)))
    side = image_size // 2 ** len(VGG16_STAGES)
    return nn.Sequential(
        *layers,
        nn.Flatten(),
        nn.Linear(channels * side * side, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, num_classes),
    )


def __getattr__(name: str):
    shape = re.fullmatch(r"gpt_l(\d+)_h(\d+)_a(\d+)_v(\d+)", name)
    if shape is None:
        raise AttributeError(name)
    layers, hidden, heads, vocab = map(int, shape.groups())

    def build(seq_len: int = 2048) -> nn.Module:
        return GPT(GPTConfig(n_layer=layers, n_head=heads, n_embd=hidden, block_size=seq_len, vocab_size=vocab))

    build.__name__ = name
    return build
