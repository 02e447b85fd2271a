"""Activation checkpointing left in debug mode (torch.utils.checkpoint.checkpoint(..., debug=True)).

Mistake: a small decoder-only LM checkpoints every block (legitimately, for long sequences). While chasing a
"recomputed tensor metadata mismatch" error the user followed the error's tip and passed debug=True to
checkpoint(); the error went away but the flag stayed. In debug mode every checkpointed forward and every
recomputation runs under a TorchDispatchMode that records each operator with its Python stack trace, so
each step pays that bookkeeping on every op, forward and recompute.
Source: https://github.com/pytorch/pytorch/issues/163923 ("Enabling activation checkpoint debug makes
throughput gradually slow down to crawl"); the tip appears in checkpoint's error message (seen e.g. in
https://github.com/deepspeedai/DeepSpeed/pull/8148).
Fix (--fix): debug=False (the default); the checkpointing itself, the model and the data are unchanged.
Expected diagnosis: forward and backward (the recomputation) much slower than the model's arithmetic
needs, from per-operator Python overhead: checkpoint debug mode (debug=True in Block.forward's
checkpoint call); turn it off.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS = 512, 128, 4, 4


class Block(nn.Module):
    def __init__(self, debug: bool):
        super().__init__()
        self.debug = debug
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def _forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.out(att)
        return x + self.mlp(self.ln2(x))

    def forward(self, x):
        return checkpoint(self._forward, x, use_reentrant=False, debug=self.debug)


class TinyLM(nn.Module):
    def __init__(self, debug: bool):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(debug) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(TinyLM(debug=not args.fix))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 12
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(steps_per_epoch):
            starts = torch.randint(0, len(corpus) - args.seq_len - 1, (args.batch_size, 1), generator=g)
            idx = starts + torch.arange(args.seq_len + 1)
            tokens = corpus[idx]
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
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
