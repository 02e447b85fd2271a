"""Plain DDP wide MLP (~21 MB of gradients) trained at 8 samples per rank, one gradient all-reduce per 8 samples.

Mistake: a tabular classifier with two 2048-wide hidden layers (5.3 M parameters, 21 MB of fp32
gradients) is trained with DDP at a per-rank batch of 8 (the batch size carried over from a single-process
notebook). Every optimizer step all-reduces all 21 MB of gradients, but the backward pass over 8 samples
is much shorter than that exchange, so DDP cannot hide the communication behind it: backward takes about
three times as long with the gradient sync as without it, and the exposed all-reduce (ranks exchanging, and
waiting for each other in, gradient buckets) is the largest part of the step, followed by an optimizer step
over 5.3 M parameters, for 8 samples of compute.
Source: https://github.com/pytorch/pytorch/issues/43201 and https://github.com/ultralytics/yolov5/issues/790
("every training step ... DDP would activate an all_reduce ... K-1 steps of all_reduce wasted"; use
no_sync during accumulation), https://github.com/karpathy/nanochat/pull/33 (no_sync for all but the last
micro-step "reduces redundant gradient communication by roughly (N - 1) / N"),
https://github.com/pytorch/pytorch/issues/73600 (why DDP is sometimes slower than local training).
Fix (--fix): gradient accumulation over 8 micro-batches of 8 (same per-rank memory), the first 7 inside
`model.no_sync()`, loss divided by 8, one all-reduce and one optimizer step per 64 samples per rank, and
the learning rate scaled linearly with the effective batch (x8).
Expected diagnosis: communication-bound: the largest part of the step is the DDP gradient all-reduce
(21 MB per step) that backward over a batch of 8 cannot hide, ranks waiting in it; raise the samples per
all-reduce (gradient accumulation with no_sync, or a larger per-rank batch) and scale the learning rate.
"""

import contextlib
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

FEATURES, WIDTH, CLASSES, BASE_LR = 512, 2048, 10, 0.01


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 64, generator=g), torch.randn(64, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1 / FEATURES**0.5) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=8, help="micro-batches per optimizer step with --fix")
    args = parser.parse_args()
    accumulate = args.accumulate if args.fix else 1
    dist.init_process_group("gloo")
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
        nn.Linear(WIDTH, CLASSES),
    )
    model = DDP(net)
    # linear LR scaling with the samples per optimizer step
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * accumulate, momentum=0.9)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total_loss = seen = pending = 0
        optimizer.zero_grad(set_to_none=True)
        for i, (xb, yb) in enumerate(loader):
            last_micro = (i + 1) % accumulate == 0
            with contextlib.nullcontext() if last_micro else model.no_sync():
                loss = F.cross_entropy(model(xb), yb)
                (loss / accumulate).backward()
            total_loss += loss.item() * len(yb)
            seen += len(yb)
            pending += len(yb)
            if not last_micro:
                continue
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done, pending = meter.step(pending), 0
            if done:
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train loss {total_loss / max(seen, 1):.4f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
