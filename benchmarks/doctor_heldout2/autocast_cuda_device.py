"""bf16 autocast written for CUDA, run on CPU: torch.autocast("cuda", ...) silently disables itself.

Mistake: the training step was written on a GPU box as `with torch.autocast("cuda", dtype=torch.bfloat16):`
and the same script is now trained on CPU nodes. With no CUDA, autocast warns once ("User provided
device_type of 'cuda', but CUDA is not available. Disabling") and every matmul runs in float32: the job
pays full fp32 cost while its author believes it is training in bf16.
Source: https://github.com/nomadkaraoke/python-audio-separator/pull/117 (autocast("cuda") enabled for a
1.5-2x speed-up; the maintainer measured the same time and got "User provided device_type of 'cuda', but
CUDA is not available. Disabling"), and the same warning per step in
https://github.com/pytorch/pytorch/pull/67676.
Fix (--fix): torch.autocast(device_type="cpu", dtype=torch.bfloat16), i.e. the device the tensors are on
(what the author meant); model, data, optimizer unchanged.
Expected diagnosis: compute-bound in float32 matmuls although the step is meant to be bf16: autocast
with device_type="cuda" on a CPU-only run is disabled (train_step); use device_type="cpu".
"""

import gc
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS = 2048, 384, 6, 3


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


def train_step(model, optimizer, tokens, amp_device: str) -> None:
    with torch.autocast(amp_device, dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("once", message=".*CUDA is not available.*")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    amp_device = "cpu" if args.fix else "cuda"  # the GPU script's autocast line, unchanged
    torch.manual_seed(0)
    model = DDP(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 8
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(steps_per_epoch):
            starts = torch.randint(0, len(corpus) - args.seq_len - 1, (args.batch_size, 1), generator=g)
            train_step(model, optimizer, corpus[starts + torch.arange(args.seq_len + 1)], amp_device)
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
