"""Models for the pipeline tests, as `--model pipeline_factories:NAME` loads them."""

import torch
import torch.nn.functional as F
from torch import nn


def linear_stack(num_classes: int = 10, in_channels: int = 1, image_size: int = 32, depth: int = 8) -> nn.Module:
    """Flatten, `depth` identical Linear+ReLU blocks as wide as the input, a small classifier: a
    model whose stages cost the same when its blocks are cut in half."""
    width = in_channels * image_size * image_size
    return nn.Sequential(
        nn.Flatten(),
        *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)),
        nn.Linear(width, num_classes),
    )


def small_stack(num_classes: int = 10, in_channels: int = 1, image_size: int = 8) -> nn.Module:
    """The same shape, small: for the correctness runs."""
    return linear_stack(num_classes, in_channels, image_size, depth=4)


class NotAChain(nn.Module):
    """Two children, but the forward flattens between them: not its children applied in order."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3)
        self.fc = nn.Linear(4 * (image_size - 2) ** 2, num_classes)

    def forward(self, x):
        return self.fc(self.conv(x).relu().flatten(1))


class DeclaredChain(NotAChain):
    """The same model, declaring the chain its forward runs: the flatten belongs to the first unit."""

    def pipeline_units(self):
        return [
            ("conv", ("conv",), lambda root, x: root.conv(x).relu().flatten(1)),
            ("fc", ("fc",), lambda root, x: root.fc(x)),
        ]


class Fork(nn.Module):
    """A trunk whose output two heads both read, summed: two operators of one unit save the same tensor."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 3)
        self.left = nn.Linear(3, 2)
        self.right = nn.Linear(3, 2)

    def forward(self, x):
        h = self.trunk(x)
        return self.left(h) + self.right(h)


def forked_chain(num_classes: int = 3, in_channels: int = 1, image_size: int = 2) -> nn.Module:
    """Five units small enough to count by hand (tests/test_formulas_unit_bytes.py): flatten a 1x2x2 image,
    Linear(4, 4), ReLU, Fork, Linear(2, num_classes)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(in_channels * image_size**2, 4), nn.ReLU(), Fork(), nn.Linear(2, num_classes)
    )


class NanoBlock(nn.Module):
    """nanoGPT's block: pre-LayerNorm, one fused query-key-value projection, causal attention, a GELU MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, time, width = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, time, width)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's layout (model.py): token and position embeddings summed and dropped out before the blocks, which
    are a ModuleList inside a ModuleDict, then a final LayerNorm and the head, its weight the token embedding's.
    Its children in order are not its forward: a pipeline reads its units from its forward graph."""

    def __init__(self, vocab_size: int = 256, seq_len: int = 16, layers: int = 4, width: int = 32, heads: int = 2):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, width),
                wpe=nn.Embedding(seq_len, width),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList(NanoBlock(width, heads) for _ in range(layers)),
                ln_f=nn.LayerNorm(width),
            )
        )
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
