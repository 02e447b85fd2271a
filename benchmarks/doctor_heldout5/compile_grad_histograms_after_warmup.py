"""torch.compile'd DDP MLP whose loop switches on per-step weight and gradient histograms once the LR warmup is over.

Mistake (a look-alike of the accumulation faults: the slowdown is a one-time step change, nothing grows):
the user monitors the health of training with a hand-written "watch" (like wandb.watch(log="all")): for
every parameter it computes a 64-bin histogram, the 1st/50th/99th percentiles (torch.quantile, a full
sort), the norm and the max of both the weight and its gradient, and converts them to Python numbers for
the dashboard. It is enabled only after the learning-rate warmup ("gradients are noisy before"), and then
on *every* step. From step 200 on, each step does this extra host and sort work, so the throughput drops
once, to a lower constant level, a few seconds into the run.
Source: https://github.com/marin-community/marin/pull/925 (logging histograms of gradients and parameters
"adds some amount of overhead to training (pretty big for small models ...)"),
https://github.com/wandb/wandb/pull/1171 ("Change default histogram log frequency to once every 1000
steps"), https://github.com/mozilla/DeepSpeech/issues/306 ("Histogram summaries are expensive").
Fix (--fix): after the warmup, compute the watch statistics every 100 steps instead of every step.
Expected diagnosis: step time is flat, then jumps at a fixed step (about step 200) and stays flat at the
higher level: the extra time is outside the compiled forward/backward and the optimizer, in
torch.quantile/sort, histc and item() calls of watch_statistics(), called on every step after WARMUP_STEPS
in main's loop; compute the statistics every N steps (the slowdown does not grow with the step count).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, CLASSES, WARMUP_STEPS, WATCH_EVERY = 64, 256, 10, 200, 100
PERCENTILES = torch.tensor([0.01, 0.5, 0.99])


def watch_statistics(model: nn.Module) -> dict[str, float | list[float]]:
    stats = {}
    for name, p in model.named_parameters():
        for kind, t in (("weight", p.detach()), ("grad", p.grad)):
            flat = t.flatten()
            stats[f"{name}/{kind}/hist"] = torch.histc(flat, bins=64).tolist()
            stats[f"{name}/{kind}/pct"] = torch.quantile(flat, PERCENTILES).tolist()
            stats[f"{name}/{kind}/norm"] = flat.norm().item()
            stats[f"{name}/{kind}/max"] = flat.abs().max().item()
    return stats


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_tabular(2 * 40 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(FEATURES, WIDTH),
        nn.SiLU(),
        nn.LayerNorm(WIDTH),
        nn.Linear(WIDTH, WIDTH),
        nn.SiLU(),
        nn.Linear(WIDTH, CLASSES),
    )
    model = torch.compile(DDP(net))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
    meter, epoch, step, watched = Meter(args), 0, 0, {}
    while True:
        sampler.set_epoch(epoch)
        correct = total = 0
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if step >= WARMUP_STEPS and (not args.fix or step % WATCH_EVERY == 0):
                watched = watch_statistics(net)
            optimizer.step()
            scheduler.step()
            step += 1
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(
                f"epoch {epoch} step {step} train accuracy {correct / max(total, 1):.3f} watched {len(watched)}",
                flush=True,
            )
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
