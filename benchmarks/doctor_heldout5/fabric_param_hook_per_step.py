"""Lightning Fabric (ddp, cpu) MLP whose loop registers a gradient-clipping hook on every parameter at every step.

Mistake: the user clips gradient values with tensor hooks, `p.register_hook(lambda g: g.clamp(-1, 1))`, a
recipe usually written once after building the model, but here placed inside the training loop (next to
the backward call it is meant for). Hooks registered with Tensor.register_hook stay on the parameter until
their handle is removed, so after k steps every parameter carries k identical hooks and every backward
calls all of them: k Python calls and k clamp kernels per parameter, per step. The gradients are the same
(clamping is idempotent), only the backward gets slower step after step.
Source: https://github.com/pytorch/pytorch/issues/191191 ("registers a new warn hook on every call ->
unbounded hook list growth, backward slows down linearly"; "training gets linearly slower, resets on
restart"), https://github.com/mindspore-ai/hyper-parallel/issues/694 (register_hook accumulating a new hook
at every forward, "training speed decreases significantly as the number of steps increases"),
https://github.com/allenai/allennlp/pull/113 (gradient clipping in the backward pass with a hook, registered
once).
Fix (--fix): register the hooks once, before the loop (same clipping, same gradients).
Expected diagnosis: backward time grows linearly with the step count while forward and the optimizer stay
flat; the growth is in the parameters' gradient hooks (an ever-growing number of Python hook calls and
clamp ops per AccumulateGrad) because p.register_hook(...) is called for every parameter inside main's
loop; register the hooks once.
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

FEATURES, WIDTH, CLASSES, GRAD_CLIP = 64, 128, 10, 1.0


def synthetic_features(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    return x, (x @ w).argmax(1)


def clip_gradients(model: nn.Module):
    for p in model.parameters():
        p.register_hook(lambda g: g.clamp(-GRAD_CLIP, GRAD_CLIP))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    fabric = Fabric(
        accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    )
    fabric.launch()
    x, y = synthetic_features(2 * 40 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, WIDTH),
        nn.LayerNorm(WIDTH),
        nn.GELU(),
        nn.Linear(WIDTH, WIDTH),
        nn.LayerNorm(WIDTH),
        nn.GELU(),
        nn.Linear(WIDTH, CLASSES),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    if args.fix:
        clip_gradients(model)
    meter, epoch = Meter(args), 0
    while True:
        total_loss = steps = 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            if not args.fix:
                clip_gradients(model)  # clip this step's gradients
            fabric.backward(loss)
            optimizer.step()
            total_loss += loss.item()
            steps += 1
            if meter.step(len(yb)):
                break
        fabric.print(f"epoch {epoch} train loss {total_loss / max(steps, 1):.4f}")
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()


if __name__ == "__main__":
    main()
