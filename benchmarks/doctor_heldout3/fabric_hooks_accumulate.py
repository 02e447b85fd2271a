"""Lightning Fabric (ddp, cpu) training that registers a new forward hook on every step and never removes it.

Mistake: to watch for dying ReLUs the user records the fraction of active units of the last hidden layer
with a forward hook, logged every 50 steps. The `register_forward_hook(...)` call sits inside the training
loop (next to the logging code) and its handle is dropped, so one more hook is attached at every step:
after N steps each forward runs N identical hooks, each computing the same statistic over the activation.
The step gets slower and slower through the run (and the hooks' closures pile up in memory).
Source: https://github.com/huggingface/peft/pull/2761 ("forward hooks would accumulate ... since one hook
per forward step was being registered ... only the last hook was removed, resulting in hooks
accumulating") and https://github.com/Lightning-AI/pytorch-lightning/pull/2298 (hook handles not removed).
Fix (--fix): register the hook once before the loop (keeping its handle); the logged statistic is the same.
Expected diagnosis: per-step time growing linearly over the run, the extra time in forward spent in
Python forward hooks (hundreds of copies of active_fraction's hook on the last ReLU), because
register_forward_hook is called inside the training loop in main; register it once.
"""

import gc
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

FEATURES, WIDTH, CLASSES = 128, 256, 10


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 64, generator=g), torch.randn(64, CLASSES, generator=g)
    return x, (torch.relu(x @ w1) @ w2).argmax(1)


def active_fraction(store: dict, name: str):
    def hook(module, inputs, output):
        store[name] = (output > 0).float().mean()

    return hook


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    fabric = Fabric(
        accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    )
    fabric.launch()
    x, y = synthetic_tabular(2 * 100 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, CLASSES),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    last_relu = model.module[5]
    activity = {}
    if args.fix:
        handle = last_relu.register_forward_hook(active_fraction(activity, "relu5"))
    meter, epoch, step = Meter(args), 0, 0
    while True:
        for xb, yb in loader:
            if not args.fix:
                last_relu.register_forward_hook(active_fraction(activity, "relu5"))
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss)
            optimizer.step()
            if step % 50 == 0:
                fabric.log("active_fraction/relu5", float(activity["relu5"]), step=step)
            step += 1
            if meter.step(len(yb)):
                break
        fabric.print(f"epoch {epoch} step {step} active fraction {float(activity['relu5']):.3f} loss {loss.item():.3f}")
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    if args.fix:
        handle.remove()
    del model, optimizer
    gc.collect()


if __name__ == "__main__":
    main()
