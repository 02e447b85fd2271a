"""Plain DDP tabular MLP whose rank 0 computes a per-layer gradient-health report in Python every step.

Mistake: to watch for vanishing/exploding gradients, the user has the logging rank (rank 0) build a report
on the first and the last layer's weight gradients after every backward: each gradient is copied to a Python
list with `.tolist()`, sorted, and its mean, RMS, 1st/50th/99th percentiles and fraction of exact zeros are
computed in pure Python for the training log. Only rank 0 does this; the two watched layers hold ~52 k
gradient values, and the report costs rank 0 well over half as much host time as the step's own
forward/backward. Rank 1 has already gone on to the next step and waits for rank 0 in the next backward's
gradient all-reduce: every step is as long as rank 0's step plus its report.
Fix (--fix): build the report every 50 steps (the log's own cadence) instead of every step; the training
is unchanged.
Expected diagnosis: a straggler, slow rank 0: rank 0 spends extra host (Python) time per step outside
forward/backward in `gradient_report` (called under `if rank == 0` after `loss.backward()` in main's loop),
and rank 1 spends that time waiting in the gradient all-reduce; compute the report rarely (or vectorised).
"""

import gc
import math
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

FEATURES, WIDTH, CLASSES, LOG_EVERY = 128, 384, 10, 50
WATCHED = ("0.weight", "6.weight")  # the input and the output layer: vanishing / exploding gradients show there


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def gradient_report(model: nn.Module) -> dict[str, dict[str, float]]:
    """Gradient statistics of the watched layers for the training log (mean, RMS, percentiles, share of zeros)."""
    report = {}
    for name, parameter in model.named_parameters():
        if name not in WATCHED:
            continue
        values = sorted(parameter.grad.detach().flatten().tolist())
        n = len(values)
        report[name] = {
            "mean": sum(values) / n,
            "rms": math.sqrt(sum(v * v for v in values) / n),
            "p01": values[n // 100],
            "p50": values[n // 2],
            "p99": values[(99 * n) // 100],
            "zeros": sum(v == 0.0 for v in values) / n,
        }
    return report


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = synthetic_tabular(2 * 40 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(FEATURES, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, 2 * FEATURES),
        nn.ReLU(),
        nn.Linear(2 * FEATURES, CLASSES),
    )
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch, step, report = Meter(args), 0, 0, None
    while True:
        sampler.set_epoch(epoch)
        total_loss = steps = 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            step += 1
            if rank == 0 and (not args.fix or step % LOG_EVERY == 0):
                report = gradient_report(net)  # gradient health for the log
            optimizer.step()
            total_loss += loss.item()
            steps += 1
            if meter.step(len(yb)):
                break
        if rank == 0:
            first = report["0.weight"] if report else {}
            print(
                f"epoch {epoch} loss {total_loss / max(steps, 1):.4f} "
                f"grad[0.weight] rms {first.get('rms', float('nan')):.2e} p99 {first.get('p99', float('nan')):.2e}",
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
