"""MosaicML's MPT models as llm-foundry benchmarked them, for `paratrain plan --model mpt:NAME` (run with
PYTHONPATH=benchmarks): the runs the plan's transformer efficiency is derived from
(benchmarks/matrix_efficiency.py) and checked against.

A plain PyTorch decoder laid out as llm-foundry's MPT (llmfoundry/models/mpt/modeling_mpt.py, read, not
copied) under the benchmark's settings (scripts/train/benchmarking/submit_benchmarks.py: low-precision
LayerNorm, fused attention): token and learned position embeddings, `blocks` an nn.ModuleList of
pre-norm blocks (LayerNorm, attention with a fused query-key-value projection, LayerNorm, a GELU
feed-forward of 4x the width), a final LayerNorm, and the output tied to the token embedding. Linear
layers and norms carry biases. The shapes are the benchmark yamls' (scripts/train/yamls/pretrain): the
parameter counts match the README's NumParams column to the parameter (mpt_7b at sequence 2,048:
6,658,859,008; mpt_13b: 12,853,954,560).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MptShape:
    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int = 50_368


SHAPES = {"mpt_7b": MptShape(4096, 32, 32), "mpt_13b": MptShape(5120, 40, 40), "mpt_30b": MptShape(7168, 48, 64)}


class Attention(nn.Module):
    def __init__(self, shape: MptShape):
        super().__init__()
        self.n_heads = shape.n_heads
        self.Wqkv = nn.Linear(shape.dim, 3 * shape.dim)
        self.out_proj = nn.Linear(shape.dim, shape.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, dim = x.shape
        q, k, v = self.Wqkv(x).view(batch, time, 3, self.n_heads, dim // self.n_heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(batch, time, dim))


class Block(nn.Module):
    def __init__(self, shape: MptShape):
        super().__init__()
        self.norm_1 = nn.LayerNorm(shape.dim)
        self.attn = Attention(shape)
        self.norm_2 = nn.LayerNorm(shape.dim)
        self.ffn = nn.Sequential(nn.Linear(shape.dim, 4 * shape.dim), nn.GELU(), nn.Linear(4 * shape.dim, shape.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x))
        return x + self.ffn(self.norm_2(x))


class Mpt(nn.Module):
    def __init__(self, shape: MptShape, seq_len: int):
        super().__init__()
        self.wte = nn.Embedding(shape.vocab_size, shape.dim)
        self.wpe = nn.Embedding(seq_len, shape.dim)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layers))
        self.norm_f = nn.LayerNorm(shape.dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm_f(x), self.wte.weight)


def mpt_7b(seq_len: int = 2048) -> Mpt:
    return Mpt(SHAPES["mpt_7b"], seq_len)


def mpt_13b(seq_len: int = 2048) -> Mpt:
    return Mpt(SHAPES["mpt_13b"], seq_len)


def mpt_30b(seq_len: int = 2048) -> Mpt:
    return Mpt(SHAPES["mpt_30b"], seq_len)
