"""Activation checkpointing applied twice to every block of a LoRA fine-tune (model's own + a wrapper).

Mistake: the model class has Hugging Face-style built-in gradient checkpointing
(`gradient_checkpointing_enable()`, a reentrant torch.utils.checkpoint call around each block), and the
training script, copied from an FSDP recipe, also applies torch's `apply_activation_checkpointing` with
`checkpoint_wrapper` (non-reentrant) to the same blocks. Each block is then checkpointed inside another
checkpoint: in backward the outer wrapper recomputes the block (whose inner checkpoint saves nothing) and
the inner checkpoint recomputes it again, so every block's forward runs three times per step instead of
two. The base weights are frozen (LoRA on the attention's qkv projection only), so backward is cheap and
the extra forward is a large share of a step.
Source: https://github.com/meta-llama/llama-cookbook/issues/740 ("two forward recomputations exist in a
single backward when using FSDP with activation checkpointing ... when I delete
model.gradient_checkpointing_enable()" the duplicate goes away), https://github.com/pytorch/pytorch/issues/105635
and https://github.com/huggingface/transformers/issues/30404 (the same double checkpointing under FSDP).
Fix (--fix): checkpoint once: keep the model's built-in checkpointing and drop the extra
apply_activation_checkpointing; memory profile, model, data and LoRA training unchanged.
Expected diagnosis: backward much longer than forward because every block is recomputed twice:
activation checkpointing nested (apply_activation_checkpointing in main() on top of
gradient_checkpointing_enable()); checkpoint once.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS, RANK = 1024, 192, 4, 4, 8


class LoRALinear(nn.Module):
    """A frozen pretrained Linear plus a trainable low-rank update."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.base = nn.Linear(n_in, n_out).requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(n_in, RANK) * 0.01)
        self.lora_b = nn.Parameter(torch.zeros(RANK, n_out))

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a) @ self.lora_b


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = LoRALinear(DIM, 3 * DIM), nn.Linear(DIM, DIM).requires_grad_(False)
        self.up = nn.Linear(DIM, 4 * DIM).requires_grad_(False)
        self.down = nn.Linear(4 * DIM, DIM).requires_grad_(False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.out(att)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        """As in Hugging Face models: reentrant checkpoint per block, inputs made to require grad."""
        self.gradient_checkpointing = True
        self.emb.register_forward_hook(lambda module, args, output: output.requires_grad_(True))

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True) if self.gradient_checkpointing else block(x)
        return self.head(x)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = TinyLM()
    model.emb.requires_grad_(False)
    model.head.requires_grad_(False)
    model.gradient_checkpointing_enable()
    if not args.fix:  # the FSDP recipe's line, kept after moving to this model
        apply_activation_checkpointing(model, check_fn=lambda module: isinstance(module, Block))
    model = DDP(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 8
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(steps_per_epoch):
            starts = torch.randint(0, len(corpus) - args.seq_len - 1, (args.batch_size, 1), generator=g)
            tokens = corpus[starts + torch.arange(args.seq_len + 1)]
            loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(args.batch_size):
                break
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
