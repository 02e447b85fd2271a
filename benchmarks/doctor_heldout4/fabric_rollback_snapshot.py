"""Lightning Fabric (ddp, cpu) MLP whose loop deep-copies the model and optimizer state after every step.

Mistake: to survive the occasional loss spike, the user keeps a last-known-good copy of the training state
and restores it when a loss comes out non-finite. The copy is taken with
`copy.deepcopy(model.state_dict())` and `copy.deepcopy(optimizer.state_dict())` after *every* optimizer
step: the model's 164 parameter tensors and AdamW's 492 state tensors (moments and step counters) are each
deep-copied (Python-level deepcopy machinery, a fresh allocation and a copy per tensor, ~660 tensors and
~8 MB) per step, only to be thrown away at the next step (the rollback never happens).
Source: https://github.com/pytorch/pytorch/issues/34765 (keeping the best/last state in memory with
copy.deepcopy of state_dict(); "A typical pattern is to save the best state_dict to a file"),
https://github.com/OpenNMT/OpenNMT-py/pull/1623 ("do not deepcopy ... Deepcopy isn't mandatory here ...
more efficient in term of speed and memory").
Fix (--fix): no per-step deep copy; the same non-finite-loss guard skips the update instead (it never
triggers, so the training is identical).
Expected diagnosis: a large share of every step is spent outside forward/backward in memory allocation and
copying (aten::copy_/clone, page faults, Python deepcopy) from copy.deepcopy of the model and optimizer
state_dict right after optimizer.step in main's loop; drop the per-step snapshot (or take it rarely / on
disk).
"""

import copy
import gc
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, BLOCKS, CLASSES = 64, 128, 40, 10


def synthetic_features(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    return x, (x @ w).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    fabric = Fabric(
        accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    )
    fabric.launch()
    x, y = synthetic_features(2 * 30 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, WIDTH),
        *[nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(BLOCKS)],
        nn.Linear(WIDTH, CLASSES),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    last_good = None
    meter, epoch = Meter(args), 0
    while True:
        total_loss = steps = 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss)
            value = loss.item()
            if not math.isfinite(value):
                if last_good is not None:  # roll back to the last good state
                    model.load_state_dict(last_good[0])
                    optimizer.load_state_dict(last_good[1])
                continue
            optimizer.step()
            if not args.fix:
                last_good = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
            total_loss += value
            steps += 1
            if meter.step(len(yb)):
                break
        fabric.print(f"epoch {epoch} train loss {total_loss / max(steps, 1):.4f}")
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer, last_good
    gc.collect()


if __name__ == "__main__":
    main()
