"""Llama 2 and Llama 3.1 shaped models, for `paratrain plan --model llama:NAME` (run with
PYTHONPATH=benchmarks): the models of torchtitan's published runs, which docs/planner.md predicts.

A plain PyTorch decoder as torchtitan's llama3 model is laid out (torchtitan/models/llama3/model.py,
read, not copied): token embedding, `layers` an nn.ModuleList of blocks (RMSNorm, attention with
grouped-query keys and values and rotary positions, RMSNorm, SwiGLU feed-forward), a final RMSNorm
and an untied output projection. The shapes are Meta's published ones (the models' params.json):
hidden size of the feed-forward `multiple_of` rounded after `ffn_dim_multiplier`, as Meta's
reference code computes it. Parameter counts: llama3_8b 8.03 B, llama3_70b 70.6 B, llama3_405b
405.9 B, llama2_7b 6.7 B, llama2_13b 13.0 B, llama2_34b 33.7 B, llama2_70b 69.0 B.

The model declares its tensor-parallel plan (torchtitan's: q, k, v and the feed-forward's w1, w3 by
columns, the attention's and the feed-forward's output projections by rows, the embedding and the output
layer by vocabulary, with its sequence- and loss-parallel forms) and its pipeline units.
Only the plan builds these (on the meta device); paratrain's registry keeps to models it trains here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel


@dataclass(frozen=True)
class LlamaShape:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    multiple_of: int
    ffn_dim_multiplier: float | None = None

    @property
    def hidden_dim(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


SHAPES = {
    "llama3_8b": LlamaShape(4096, 32, 32, 8, 128_256, 1024, 1.3),
    "llama3_70b": LlamaShape(8192, 80, 64, 8, 128_256, 4096, 1.3),
    "llama3_405b": LlamaShape(16384, 126, 128, 8, 128_256, 4096, 1.2),
    "llama2_7b": LlamaShape(4096, 32, 32, 32, 32_000, 256),
    "llama2_13b": LlamaShape(5120, 40, 40, 40, 32_000, 256),
    "llama2_34b": LlamaShape(8192, 48, 64, 8, 32_000, 256),
    "llama2_70b": LlamaShape(8192, 80, 64, 8, 32_000, 4096, 1.3),
}


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) on the last dimension, in its real form."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.head_dim = shape.dim // shape.n_heads
        self.kv_repeats = shape.n_heads // shape.n_kv_heads
        self.wq = nn.Linear(shape.dim, shape.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(shape.dim, shape.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(shape.dim, shape.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(shape.n_heads * self.head_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # heads counted from the projections' width: under tensor parallelism, the rank's share
        q, k, v = (p(x).view(batch, time, -1, self.head_dim).transpose(1, 2) for p in (self.wq, self.wk, self.wv))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = (t.repeat_interleave(self.kv_repeats, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, time, -1))


class FeedForward(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.w1 = nn.Linear(shape.dim, shape.hidden_dim, bias=False)
        self.w2 = nn.Linear(shape.hidden_dim, shape.dim, bias=False)
        self.w3 = nn.Linear(shape.dim, shape.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.dim, eps=1e-5)
        self.attention = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.dim, eps=1e-5)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, shape: LlamaShape, seq_len: int):
        super().__init__()
        self.shape = shape
        head_dim = shape.dim // shape.n_heads
        self.tok_embeddings = nn.Embedding(shape.vocab_size, shape.dim)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.n_layers))
        self.norm = nn.RMSNorm(shape.dim, eps=1e-5)
        self.output = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        angles = torch.outer(
            torch.arange(seq_len, dtype=torch.float32),
            500_000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim),
        ).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        time = tokens.shape[1]
        cos, sin = self.cos[:time], self.sin[:time]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))

    def pipeline_units(self) -> list[tuple[str, tuple[str, ...], Callable[[nn.Module, torch.Tensor], torch.Tensor]]]:
        """The chain a pipeline cuts: the embedding, each block (given the rotary table for the sequence
        it is handed), the final norm and output (workloads/gpt.py's PipelineUnit)."""

        def block(i: int):
            def run(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
                return root.layers[i](x, root.cos[: x.shape[1]], root.sin[: x.shape[1]])

            return f"layers.{i}", (f"layers.{i}",), run

        return [
            ("tok_embeddings", ("tok_embeddings",), lambda root, tokens: root.tok_embeddings(tokens)),
            *(block(i) for i in range(len(self.layers))),
            ("output", ("norm", "output"), lambda root, x: root.output(root.norm(x))),
        ]

    def tensor_parallel_plan(
        self, degree: int, sequence_parallel: bool = False, loss_parallel: bool = False
    ) -> dict[str, str | ParallelStyle]:
        """torchtitan's plan (torchtitan/models/llama3/infra/parallelize.py, read, not copied): in each block
        q, k, v and the feed-forward's w1, w3 by columns, the two output projections by rows; the embedding
        by vocabulary rows (each rank looks up the words it holds, an all-reduce sums them) and the output
        layer by vocabulary columns, its logits gathered, or left split for the loss with `loss_parallel`.
        With `sequence_parallel`, as torchtitan's too: the norms on the rank's share of the tokens, each half
        gathering its input and reduce-scattering its output, the embedding reduce-scattering its sum into
        the rank's share of the tokens, the output layer gathering them."""
        if self.shape.n_kv_heads % degree:
            raise ValueError(f"--tp {degree} must divide the {self.shape.n_kv_heads} key-value heads")
        if self.shape.vocab_size % degree:
            raise ValueError(f"--tp {degree} must divide the vocabulary of {self.shape.vocab_size} words")
        entry = "sequence-input" if sequence_parallel else "replicated-input"
        out = "rowwise-to-sequence" if sequence_parallel else "rowwise"
        block: dict[str, str | ParallelStyle] = {"attention": entry, "attention.wq": "colwise"}
        block |= {"attention.wk": "colwise", "attention.wv": "colwise", "attention.wo": out}
        block |= {"feed_forward": entry, "feed_forward.w1": "colwise", "feed_forward.w3": "colwise"}
        block["feed_forward.w2"] = out
        if sequence_parallel:
            block |= {"attention_norm": "sequence-norm", "ffn_norm": "sequence-norm"}
        tokens = Shard(1) if sequence_parallel else Replicate()
        logits = Shard(-1) if loss_parallel else Replicate()
        return {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=tokens),
            **{f"layers.*.{name}": style for name, style in block.items()},
            **({"norm": "sequence-norm"} if sequence_parallel else {}),
            "output": ColwiseParallel(input_layouts=tokens, output_layouts=logits, use_local_output=not loss_parallel),
        }


def _factory(name: str):
    def build(seq_len: int = 8192) -> Llama:
        return Llama(SHAPES[name], seq_len)

    build.__name__ = name
    return build


llama3_8b = _factory("llama3_8b")
llama3_70b = _factory("llama3_70b")
llama3_405b = _factory("llama3_405b")
llama2_7b = _factory("llama2_7b")
llama2_13b = _factory("llama2_13b")
llama2_34b = _factory("llama2_34b")
llama2_70b = _factory("llama2_70b")
