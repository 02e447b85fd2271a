"""A torch.compile'd model that reads a Python int attribute the training loop changes every epoch.

Mistake: the language model anneals its embedding-noise regulariser from `self.epoch`, a plain int
attribute that the loop sets at the start of each epoch (`net.set_epoch(epoch)` stores `self.epoch`).
torch.compile treats integer attributes of an nn.Module as static constants and guards on them, so at
every epoch the guard fails and Dynamo, AOTAutograd and Inductor rebuild the forward and backward graphs
(seconds of compilation at each epoch start, on every rank).
Source: https://github.com/pytorch/pytorch/issues/128319 ("Recompilation on a counter-like attribute of nn
module"), https://github.com/pytorch/pytorch/issues/115711 ("nn.Module int/float attributes caused
re-compile"); the recompile warning itself hints "torch.compile considers integer attributes of the
nn.Module to be static ... convert this integer into a tensor".
Fix (--fix): keep the annealed noise level in a tensor buffer updated in place (`noise_std.fill_(...)`), so
the compiled graph takes it as an input and never recompiles; same schedule, same model.
Expected diagnosis: repeated torch.compile recompilation (one per epoch, a long stall at each epoch start)
caused by the guard on the int attribute `NoisyLM.epoch` read in NoisyLM.forward; make it a tensor (or set
torch._dynamo.config.allow_unspec_int_on_nn_module).
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

VOCAB, DIM, HEADS, LAYERS = 512, 128, 4, 2


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


class NoisyLM(nn.Module):
    """A tiny decoder LM with Gaussian embedding noise whose strength decays with the epoch."""

    def __init__(self, tensor_schedule: bool):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)
        self.tensor_schedule = tensor_schedule
        self.epoch = 0
        self.register_buffer("noise_std", torch.tensor(0.1), persistent=False)

    def set_epoch(self, epoch: int):
        if self.tensor_schedule:
            self.noise_std.fill_(0.1 * 0.7**epoch)
        else:
            self.epoch = epoch

    def forward(self, idx):
        x = self.emb(idx)
        if self.training:
            std = self.noise_std if self.tensor_schedule else 0.1 * 0.7**self.epoch
            x = x + torch.randn_like(x) * std
        return self.head(self.blocks(x))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = NoisyLM(tensor_schedule=args.fix)
    model = DDP(torch.compile(net), broadcast_buffers=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 80
    meter, epoch = Meter(args), 0
    while True:
        net.set_epoch(epoch)
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        epoch += 1
        for _ in range(steps_per_epoch):
            starts = torch.randint(0, len(corpus) - args.seq_len - 1, (args.batch_size, 1), generator=g)
            tokens = corpus[starts + torch.arange(args.seq_len + 1)]
            loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(args.batch_size):
                break
        if meter.end_epoch() and (epoch >= 3 or args.steps):  # at least two epochs after the first
            break
    meter.report()
    del model, net, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
