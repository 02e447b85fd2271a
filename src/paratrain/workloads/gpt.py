"""`gpt`: a decoder-only transformer language model in the style of nanoGPT / GPT-2.

Pre-LayerNorm blocks (LN -> causal self-attention -> residual, LN -> GELU MLP -> residual), causal
attention through `F.scaled_dot_product_attention(is_causal=True)` (PyTorch picks the fused kernel
for the device), learned position embeddings, input and output embeddings tied (Press & Wolf 2017,
as GPT-2), GPT-2's initialisation (normal(0, 0.02), residual projections scaled by 1/sqrt(2 L)).
No dropout: runs are short and deterministic comparisons stay exact.

The model is three separable parts, so the parallel strategies can shard, split and checkpoint it:
`embed` (token + position embeddings), `blocks` (an nn.ModuleList of `n_layer` identical `Block`s:
the unit of FSDP wrapping, pipeline split points `blocks.<i>` and activation checkpointing) and
`head` (final LayerNorm + the language-model projection). The head's weight *is* the token
embedding's weight (`head.lm_head.weight is embed.wte.weight`): a pipeline that puts `embed` and
`head` on different stages has to keep that tie itself.

The vocabulary is bytes (256): the text workloads need no tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.errors import UsageError

BYTE_VOCAB = 256

# A link of the chain a pipeline cuts a model along (engine/strategies/pipeline_split.py): its name (what
# --split takes), the submodule paths it owns, and how it runs given a module holding those paths.
PipelineUnit = tuple[str, tuple[str, ...], Callable[[nn.Module, torch.Tensor], torch.Tensor]]


def call_unit(path: str) -> PipelineUnit:
    """The unit that is one submodule, called on the previous unit's output."""
    return path, (path,), lambda root, x: root.get_submodule(path)(x)


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # the context: longest sequence the position embeddings cover
    vocab_size: int = BYTE_VOCAB

    def validate(self) -> None:
        if self.n_embd % self.n_head:
            raise UsageError(
                f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}; "
                "choose a head count that divides the width or a width that is a multiple of the heads"
            )


# The presets, by parameter count (byte vocabulary, so fewer than the GPT-2 model of the same shape):
# gpt-tiny    0.86 M  tests and smoke runs
# gpt-small  10.8 M   nanoGPT's shakespeare-char shape
# gpt-medium 86.0 M   GPT-2 small's shape (12 x 768)
# gpt-large   304 M   GPT-2 medium's shape (24 x 1024): Adam model state 4.5 GiB a replica, two fit in 24 GiB
# gpt-xl      710 M   GPT-2 large's shape (36 x 1280): 10.6 GiB a replica, so 2 DDP ranks (21 GiB before
#                     activations) overflow a 24 GiB machine and sharding or a pipeline makes it train
PRESETS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "gpt-small": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt-medium": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "gpt-large": GPTConfig(n_layer=24, n_head=16, n_embd=1024, block_size=1024),
    "gpt-xl": GPTConfig(n_layer=36, n_head=20, n_embd=1280, block_size=1024),
}


def resolve(preset: str, n_layer: int | None = None, n_head: int | None = None, n_embd: int | None = None) -> GPTConfig:
    """The preset's shape with any of --n-layer/--n-head/--n-embd applied; validated."""
    overrides = {k: v for k, v in (("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd)) if v is not None}
    config = replace(PRESETS[preset], **overrides)
    config.validate()
    return config


class Linear(nn.Linear):
    """nn.Linear as GPT-2 initialises it: weights normal with standard deviation `std`, biases zero.

    The initialisation is the module's own `reset_parameters`, run once as the constructor runs it, not a pass over
    the whole model afterwards: a rank that builds the model on the meta device and materialises only its part
    (tensor parallelism, fsdp, a pipeline's stages; engine/strategies/meta_init.py) runs each module's
    `reset_parameters` in the same order and draws the same values, so every layout starts from one process's
    weights for the same seed. Named as torch's class: `--shard-unit Linear` and the probe's layer tables read
    the name."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, std: float = 0.02):
        self.std = std  # read by reset_parameters, which nn.Linear's constructor calls
        super().__init__(in_features, out_features, bias)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    """nn.Embedding as GPT-2 initialises it, normal with standard deviation 0.02, as its own `reset_parameters`
    (see Linear)."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=0.02)


def _residual_std(config: GPTConfig) -> float:
    """GPT-2: the projections that write into the residual stream shrink with depth, so the stream's variance does
    not grow with the number of blocks."""
    return 0.02 / math.sqrt(2 * config.n_layer)


class CausalSelfAttention(nn.Module):
    """Queries, keys and values from three projections, not one fused `qkv` (nanoGPT's): tensor
    parallelism splits each by output columns, so that a rank holds whole heads of all three. The
    forward counts heads from the projections' width, which under tensor parallelism is the rank's
    share of them."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.head_dim = config.n_embd // config.n_head
        self.q, self.k, self.v = (Linear(config.n_embd, config.n_embd) for _ in range(3))
        self.proj = Linear(config.n_embd, config.n_embd, std=_residual_std(config))
        self.register_load_state_dict_pre_hook(_split_fused_qkv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        q, k, v = (p(x).view(batch, time, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, time, -1))


def _split_fused_qkv(_: nn.Module, state: dict[str, torch.Tensor], prefix: str, *__: object) -> None:
    """A checkpoint written before the projections were split (one `qkv` of 3 x width rows) loads into
    q, k and v: its rows are queries, then keys, then values."""
    for kind in ("weight", "bias"):
        fused = state.pop(f"{prefix}qkv.{kind}", None)
        if fused is not None:
            for name, part in zip("qkv", fused.chunk(3), strict=True):
                state[f"{prefix}{name}.{kind}"] = part


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = Linear(config.n_embd, 4 * config.n_embd)
        self.proj = Linear(4 * config.n_embd, config.n_embd, std=_residual_std(config))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embeddings(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.wte = Embedding(config.vocab_size, config.n_embd)
        self.wpe = Embedding(config.block_size, config.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(positions)


class Head(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    """Token ids [B, T] (T <= block_size) -> next-token logits [B, T, vocab]."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.embed = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.head = Head(config)
        # tied as GPT-2 ties them: the tensor and its values are the embedding's (lm_head's own draw is dropped)
        self.head.lm_head.weight = self.embed.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def pipeline_units(self) -> list[PipelineUnit]:
        """`embed`, each block, `head`: the chain forward runs."""
        return [call_unit("embed"), *(call_unit(f"blocks.{i}") for i in range(len(self.blocks))), call_unit("head")]

    def tensor_parallel_plan(
        self, degree: int, sequence_parallel: bool = False, loss_parallel: bool = False
    ) -> dict[str, str]:
        """Megatron-LM's split of a block (Shoeybi et al. 2019), as torchtitan applies it: the
        attention's q, k, v and the MLP's first layer by output columns (each rank whole heads, a share
        of the hidden units), the two projections back by input rows, so a block costs one all-reduce
        forward and one backward for each of its halves (the attention's input entering once for q, k
        and v). Embeddings, norms and the head (256 bytes of vocabulary) stay whole on every rank.

        With `sequence_parallel` (Korthikanti et al. 2022), the tokens between the split pairs are split
        too: the embeddings' output and the residual stream hold the rank's share of the sequence, the
        norms run on it, each half gathers its input (all-gather) and sums its output into the rank's share
        (reduce-scatter), and the head gathers the sequence back.

        With `loss_parallel`, the head is split by vocabulary and keeps its logits split for the loss, and the
        token embedding tied to it is split the same way (torchtitan's plan)."""
        vocabulary = {"embed.wte": "vocab-embedding", "head.lm_head": "vocab-head"} if loss_parallel else {}
        if self.config.n_head % degree:
            raise UsageError(
                f"--tp {degree} splits attention by heads and gpt has {self.config.n_head}; "
                "choose a --tp that divides the head count"
            )
        if not sequence_parallel:
            # q, k and v share the attention's input: one all-reduce completes its gradient, not three.
            block = {"attn": "replicated-input", "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise"}
            block |= {"attn.proj": "rowwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}
            return {f"blocks.*.{name}": style for name, style in block.items()} | vocabulary
        block = {"ln_1": "sequence-norm", "ln_2": "sequence-norm", "attn": "sequence-input", "mlp": "sequence-input"}
        block |= {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise-to-sequence"}
        block |= {"mlp.fc": "colwise", "mlp.proj": "rowwise-to-sequence"}
        return {
            "embed": "sequence-output",
            **{f"blocks.*.{name}": style for name, style in block.items()},
            "head": "sequence-input",
        } | vocabulary

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, the tied embedding counted once; without the position embeddings when
        `non_embedding` (the N of the 6N + 12·L·H·Q·T FLOPs-per-token estimate: the token
        embedding stays in, as the output projection it doubles as is a real matmul)."""
        total = sum(p.numel() for p in self.parameters())
        return total - self.embed.wpe.weight.numel() if non_embedding else total

    def flops_per_token(self, seq_len: int) -> float:
        """nanoGPT's `estimate_mfu` / PaLM appendix B: 6N + 12·L·H·Q·T per token, forward and backward."""
        c = self.config
        return 6 * self.num_params(non_embedding=True) + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * seq_len
