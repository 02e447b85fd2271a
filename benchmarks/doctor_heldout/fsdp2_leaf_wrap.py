"""FSDP2 applied to every leaf module (each Linear and LayerNorm its own FSDP unit) instead of per block.

Mistake: the user shards a residual-MLP model with `fully_shard` on every module that owns parameters, the
equivalent of FSDP1's size_based_auto_wrap_policy with a tiny min_num_params. Each of the 26 units then
all-gathers its few parameters before forward, all-gathers again in backward (reshard_after_forward) and
reduce-scatters its gradients: ~80 small collectives per step instead of ~25, each paying gloo's latency and
FSDP's per-unit hook, copy-in and copy-out overhead, where one unit per block would do.
Source: https://github.com/Lightning-AI/pytorch-lightning/issues/16991 (docs suggesting
size_based_auto_wrap_policy(min_num_params=1e3) "leads to user error and confusion") and
https://github.com/facebookresearch/fairscale/issues/971 (fewer, larger FSDP units are faster when memory
allows); the FSDP2 docs recommend fully_shard on each transformer block, then on the root.
Fix (--fix): fully_shard each ResidualBlock (and the root), the standard per-block granularity; same model,
same data, same optimizer.
Expected diagnosis: communication-bound by many small collectives (FSDP all-gather / reduce-scatter per
leaf module, latency rather than bandwidth) and FSDP per-unit overhead; the fully_shard loop over
model.modules() in main() wraps too finely; wrap per block.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

DIM, DEPTH, CLASSES = 256, 8, 10


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(64, DIM)
        self.blocks = nn.ModuleList(ResidualBlock() for _ in range(DEPTH))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = ResMLP()
    if args.fix:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
    else:
        for module in model.modules():
            if module is not model and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    teacher = torch.randn(64, CLASSES, generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 24
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(steps_per_epoch):
            x = torch.randn(args.batch_size, 64, generator=g)
            y = (x @ teacher).argmax(dim=1)
            loss = F.cross_entropy(model(x), y)
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
