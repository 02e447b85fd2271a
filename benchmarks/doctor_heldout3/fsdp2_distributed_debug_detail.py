"""FSDP2 (fully_shard, gloo CPU mesh) training left with TORCH_DISTRIBUTED_DEBUG=DETAIL from a hang hunt.

Mistake: while chasing a collective mismatch the user put `os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"`
at the top of the training script and never took it out. With DETAIL, every process group is wrapped in
a ProcessGroupWrapper that, before *each* collective, runs a monitored barrier and all-gathers a
fingerprint of the op type and tensor shapes over a helper gloo group to check that all ranks agree. FSDP2
issues an all-gather per unit in forward, another in backward and a reduce-scatter per unit, so every
step pays about 26 extra consistency checks (several round trips each) on top of the real collectives.
Source: https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications (DETAIL
wraps every process group so that each collective is preceded by consistency and synchronization checks,
at a cost in performance; meant for debugging only) and https://github.com/pytorch/pytorch/issues/70667
(users setting TORCH_DISTRIBUTED_DEBUG=DETAIL inside the training script, as here).
Fix (--fix): do not set TORCH_DISTRIBUTED_DEBUG (the default, OFF); same model, same sharding, same data.
Expected diagnosis: collective time far above what the FSDP2 all-gathers/reduce-scatters need (each
collective preceded by extra barrier/all-gather round trips on a second gloo group), caused by
TORCH_DISTRIBUTED_DEBUG=DETAIL set at the top of the script; unset it.
"""

import os
import sys

if "--fix" not in sys.argv:
    # TODO remove once the desync is found
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"

import gc
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, BLOCKS, CLASSES = 64, 192, 8, 10


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList([ResidualBlock() for _ in range(BLOCKS)])
        self.head = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES))

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x, y = synthetic_tabular(2 * 24 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = ResMLP()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        correct = total = 0
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train accuracy {correct / max(total, 1):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
