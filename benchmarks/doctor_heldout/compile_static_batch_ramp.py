"""Batch-size warm-up under torch.compile(fullgraph=True, dynamic=False): a full recompile every epoch.

Mistake: the user compiles the language model with fullgraph=True and dynamic=False ("static shapes are
fastest") and ramps the per-rank batch size up over the first epochs (a GPT-3-style batch-size warm-up).
dynamic=False turns off automatic dynamic shapes, so every new batch size is a guard failure ("tensor 'x'
size mismatch at index 0") and Dynamo, AOTAutograd and Inductor rebuild the forward and backward graphs at
the start of every epoch, on every rank.
Source: https://github.com/pytorch/pytorch/issues/139474 ("Recompilation exhausted with `size mismatch`",
a DDP training run recompiling for every new input size) and https://github.com/pytorch/pytorch/issues/94640
(GNN training with varying batch sizes hitting cache_size_limit); dynamic=False disables automatic
dynamic shapes (https://docs.pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html).
Fix (--fix): keep fullgraph=True, drop dynamic=False and mark the batch dimension dynamic
(torch._dynamo.mark_dynamic(inputs, 0)), so one graph serves every batch size; same model, same schedule.
Expected diagnosis: torch.compile recompilation at each epoch boundary (a long stall when the batch size
changes) caused by dynamic=False in the torch.compile call in main(); mark the batch dim dynamic.
Benchmark harness: each run uses an empty Inductor cache (a fresh job, as on a new cluster node); with a
warm cache from earlier identical runs each recompilation is cheaper (see README).
"""

import gc
import os
import sys
import tempfile
from pathlib import Path

# benchmark harness, not part of the user's script: every run starts with an empty Inductor cache
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-", dir=os.environ.get("PARATRAIN_RUN_DIR"))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS, SEQ, SEQUENCES_PER_EPOCH = 512, 128, 4, 2, 64, 480


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.out(att)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))


def batch_size(epoch: int) -> int:
    """Per-rank sequences per step: 4, 6, 8, 10, 12, then 12."""
    return min(12, 4 + 2 * epoch)


def main():
    args = arguments(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    if args.fix:
        net = torch.compile(TinyLM(), fullgraph=True)
    else:
        net = torch.compile(TinyLM(), fullgraph=True, dynamic=False)
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    meter, epoch = Meter(args), 0
    while True:
        bs = batch_size(epoch)
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        epoch += 1
        for _ in range(SEQUENCES_PER_EPOCH // bs):
            starts = torch.randint(0, len(corpus) - SEQ - 1, (bs, 1), generator=g)
            tokens = corpus[starts + torch.arange(SEQ + 1)]
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            if args.fix:
                torch._dynamo.mark_dynamic(inputs, 0)
            loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(bs):
                break
        if meter.end_epoch() and (epoch >= 3 or args.steps):  # at least two epochs after the first
            break
    meter.report()
    del model, net, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
