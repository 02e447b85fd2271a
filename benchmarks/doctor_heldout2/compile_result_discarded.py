"""torch.compile called on the model, but its return value is thrown away: the run trains in eager mode.

Mistake: the training script has a `--compile` switch implemented as `torch.compile(model)` on a line of
its own (as if it compiled in place, like `model.compile()` does). torch.compile returns a new
OptimizedModule and leaves `model` untouched, so the DDP-wrapped model that is trained is the eager one:
the job pays every unfused RMSNorm/SwiGLU element-wise kernel while its logs say "compiling".
Source: https://github.com/ostris/ai-toolkit/issues/729 ("`torch.compile()` doesn't modify in-place ...
use result of torch.compile()") and https://github.com/google-research/timesfm/issues/457
("`torch.compile(self)` is a no-op - compiling `forward` directly gives 1.48x").
Fix (--fix): model.compile() (in place), so the model DDP wraps is the compiled one; model, data and
optimizer unchanged. Both variants train at least three epochs so that the one-off compilation falls in
the first, unmeasured epoch.
Expected diagnosis: forward/backward dominated by many small element-wise kernels (memory-bound, per-op
overhead) although compilation was requested: the torch.compile(model) result is discarded in main();
use model.compile() or model = torch.compile(model).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, LAYERS = 256, 48, 4


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    """A token-mixing-free gated block: RMSNorm, tanh-gated projection, SwiGLU MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(), RMSNorm()
        self.mix = nn.Linear(DIM, DIM, bias=False)
        self.gate, self.up = nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        x = x + 0.5 * torch.tanh(self.mix(self.norm1(x)))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class ByteLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.norm = RMSNorm()
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        return self.head(self.norm(self.blocks(self.emb(idx))))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ByteLM()
    if rank == 0:
        print("compiling the model", flush=True)
    if args.fix:
        model.compile()
    else:
        torch.compile(model)
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 10
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
        stop = meter.end_epoch()
        if stop and epoch >= 3:  # the first epoch (compilation) is never the only measured one
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
