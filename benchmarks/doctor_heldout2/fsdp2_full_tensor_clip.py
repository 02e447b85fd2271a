"""FSDP2 (fully_shard) with hand-written gradient clipping that calls full_tensor() on every gradient.

Mistake: after moving from DDP to FSDP2 the user's global-norm clipping helper (written for plain tensors)
broke on DTensor gradients, and was "fixed" by materialising each gradient with `p.grad.full_tensor()`
before taking its norm. Every step then all-gathers the whole model's gradients, one collective per
parameter (latency-bound on gloo), plus a DTensor dispatch per parameter, just to compute one number.
Source: https://github.com/NVIDIA-NeMo/Automodel/pull/2875 ("one `full_tensor()` collective per
parameter" replaced by one reduction per mesh dimension) and https://github.com/pytorch/pytorch/pull/128317
(DTensor gradient clipping taking 93 ms per step instead of 4 ms).
Fix (--fix): torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM), which is DTensor-aware: local
shard norms and a single reduction. Same clipping (same global norm), same model and data.
Expected diagnosis: communication-bound by many small all-gathers after backward, outside forward/backward
(in clip_grad_norm_by_hand: full_tensor() per gradient); use the DTensor-aware clip_grad_norm_.
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

DIM, HIDDEN, BLOCKS, CLASSES, MAX_NORM = 128, 256, 12, 32, 1.0


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up, self.down = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(64, DIM)
        self.blocks = nn.ModuleList(ResidualBlock() for _ in range(BLOCKS))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def clip_grad_norm_by_hand(parameters, max_norm: float) -> torch.Tensor:
    """The user's helper from the DDP days, patched for DTensor gradients with full_tensor()."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.zeros(())
    for grad in grads:
        total += grad.full_tensor().pow(2).sum()
    total_norm = total.sqrt()
    scale = min(1.0, max_norm / (float(total_norm) + 1e-6))
    for grad in grads:
        grad.mul_(scale)
    return total_norm


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = ResMLP()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    teacher = torch.randn(64, CLASSES, generator=torch.Generator().manual_seed(1))
    steps_per_epoch = 24
    meter, epoch = Meter(args), 0
    while True:
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(steps_per_epoch):
            x = torch.randn(args.batch_size, 64, generator=g)
            loss = F.cross_entropy(model(x), (x @ teacher).argmax(dim=1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.fix:
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            else:
                clip_grad_norm_by_hand(list(model.parameters()), MAX_NORM)
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
