"""A nanoGPT-style model whose causal masks are registered buffers, so DDP broadcasts them every forward.

Mistake: the attention layers keep a full-context causal mask (block_size x block_size floats, 4 MiB per
layer) as a registered buffer, as nanoGPT's non-flash attention does. DistributedDataParallel's default
broadcast_buffers=True re-broadcasts every buffer from rank 0 at the start of every forward, so each step
ships ~32 MiB of constant masks through gloo before any compute starts.
Source: https://github.com/karpathy/nanoGPT/pull/151 ("speedup by avoiding ddp broadcasts of causal
mask"); also https://github.com/ultralytics/ultralytics/issues/24410 and
https://github.com/pytorch/pytorch/issues/83320 (time spent syncing buffers before each forward).
Fix (--fix): DDP(..., broadcast_buffers=False); the masks are constants, identical on every rank, so the
model and its training are unchanged.
Expected diagnosis: communication before the forward, not gradient all-reduce: DDP's buffer broadcast
(broadcast_buffers=True) of the large `mask` buffers registered in CausalSelfAttention.__init__; the fix
is broadcast_buffers=False (or not registering the constant mask as a buffer).
"""

import gc
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, BLOCK_SIZE, N_LAYER, N_EMBD, N_HEAD = 256, 1024, 8, 128, 4


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.proj = nn.Linear(N_EMBD, N_EMBD)
        self.register_buffer("mask", torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE)).view(1, 1, BLOCK_SIZE, BLOCK_SIZE))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(b, t, N_HEAD, c // N_HEAD).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, N_EMBD)
        self.pos = nn.Embedding(BLOCK_SIZE, N_EMBD)
        self.blocks = nn.Sequential(*[Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        return self.head(self.ln_f(self.blocks(x)))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (400_000,), generator=torch.Generator().manual_seed(1))
    model = DDP(GPT(), broadcast_buffers=not args.fix)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    steps_per_epoch = 12
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(epoch * world + rank)
        for _ in range(steps_per_epoch):
            starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=g)
            x = torch.stack([data[s : s + args.seq_len] for s in starts])
            y = torch.stack([data[s + 1 : s + 1 + args.seq_len] for s in starts])
            loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
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
