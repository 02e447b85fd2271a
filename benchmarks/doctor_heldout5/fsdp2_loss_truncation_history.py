"""FSDP2 (fully_shard, gloo CPU mesh) residual MLP trained with loss truncation against a quantile of every
per-sample loss seen so far.

Mistake: for robustness to noisy labels the user implements loss truncation: samples whose loss is above
the 90th percentile of the per-sample losses seen so far are dropped from the batch loss. The history is
a Python list extended with each batch's per-sample losses, `history.extend(per_sample.detach())`, which
stores one 0-d tensor per sample, and the cutoff is recomputed from scratch each step with
`np.quantile(history, 0.9)`: NumPy converts every stored tensor back to a number (a Python-level
`__array__`/item per element) and partitions the whole history. After k steps that is 32 k tensor
conversions per step, so the run gets slower step after step (and the list of tensors keeps growing).
Source: https://github.com/kohya-ss/sd-scripts/pull/189 (a loss statistic recomputed over the whole
stored list at every step; "I removed the call of sum()"), https://github.com/IBM/mi-prometheus/issues/111
("one more tensor each iteration"), https://github.com/facebookresearch/maskrcnn-benchmark/issues/531
(the trainer's statistics come from a bounded window of the last 20 values, the global one from a running
total).
Fix (--fix): a bounded window as loss truncation's reference implementation does: the last 4096
per-sample losses in a preallocated float tensor (a ring buffer) and torch.quantile over it; same
dropping rule, O(window) per step. The window only differs from the full history after 4096 samples, so
the two runs train identically at first and then pick slightly different cutoffs.
Expected diagnosis: host time per step grows linearly with the step count, outside forward/backward and
the FSDP2 collectives, in NumPy's conversion of a growing list of 0-d tensors (Tensor.__array__ / item,
np.quantile) in main's loop; keep the loss history bounded and as one float tensor/array.
"""

import gc
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, BLOCKS, CLASSES, QUANTILE, WARMUP, WINDOW = 64, 128, 3, 10, 0.9, 256, 4096


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList([ResidualBlock() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def synthetic_noisy_labels(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(1)
    flip = torch.rand(samples, generator=g) < 0.1
    return x, torch.where(flip, torch.randint(0, CLASSES, (samples,), generator=g), y)


class LossWindow:
    """The last WINDOW per-sample losses in a ring buffer."""

    def __init__(self):
        self.buffer, self.count = torch.empty(WINDOW), 0

    def extend(self, values: torch.Tensor) -> None:
        positions = torch.arange(self.count, self.count + len(values)) % WINDOW
        self.buffer[positions] = values
        self.count += len(values)

    def __len__(self):
        return min(self.count, WINDOW)

    def quantile(self, q: float) -> float:
        return torch.quantile(self.buffer[: len(self)], q).item()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x, y = synthetic_noisy_labels(2 * 40 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = ResidualMLP()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = LossWindow() if args.fix else []
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total_loss = kept = seen = 0
        for xb, yb in loader:
            per_sample = F.cross_entropy(model(xb), yb, reduction="none")
            if len(history) >= WARMUP:
                cutoff = history.quantile(QUANTILE) if args.fix else float(np.quantile(history, QUANTILE))
                keep = per_sample.detach() <= cutoff
            else:
                keep = torch.ones_like(per_sample, dtype=torch.bool)
            history.extend(per_sample.detach())
            loss = (per_sample * keep).sum() / keep.sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += per_sample.detach().sum().item()
            kept += int(keep.sum())
            seen += len(yb)
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(
                f"epoch {epoch} train loss {total_loss / max(seen, 1):.4f} kept {kept / max(seen, 1):.3f}", flush=True
            )
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer, history
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
