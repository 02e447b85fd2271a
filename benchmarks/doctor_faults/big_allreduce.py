"""A large model's all-reduce: a CNN with a wide fully connected head (8.4 M parameters, 34 MB of gradients)
trained at 32 samples a rank. Its convolutions keep the step busy, yet the head's gradients are the last to
be ready and their all-reduce is still running when backward ends: about a quarter of every step.
Fix (`--fix`): accumulate 4 micro-batches per optimizer step, `model.no_sync()` on the first 3, so one
all-reduce per 128 samples a rank (the LR unchanged per sample: the loss is averaged over the micro-batches).

    paratrain launch -n 2 benchmarks/doctor_faults/big_allreduce.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools
from contextlib import nullcontext

import torch
import torch.distributed as dist
from common import Meter, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
accumulate = 4 if args.fix else 1

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(
    nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128 * 8 * 8, 1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    )
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
meter = Meter(args)
micro = 0
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        micro += 1
        last = micro % accumulate == 0
        with nullcontext() if last else model.no_sync():
            loss = torch.nn.functional.cross_entropy(model(images), labels) / accumulate
            loss.backward()
        if not last:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if meter.step(accumulate * len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
