"""Gradient accumulation without `no_sync()`: 4 micro-batches per optimizer step, but DDP all-reduces the
gradients after every backward, 4 times per step where once would do (the model's 4.2 M parameter
classifier makes each all-reduce cost). Fix (`--fix`): `model.no_sync()` around the first 3 micro-batches.

    paratrain launch -n 2 benchmarks/doctor_faults/no_sync.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools
from contextlib import nullcontext

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUMULATE = 4

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = TensorDataset(*synthetic_cifar(1024))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=8, sampler=sampler, drop_last=True)

torch.manual_seed(0)
net = SmallCNN()
net.classifier = nn.Sequential(nn.Linear(64 * 4 * 4, 4096), nn.ReLU(), nn.Linear(4096, 10))  # a wide head
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
meter = Meter(args)
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for i, (images, labels) in enumerate(loader):
        last = (i + 1) % ACCUMULATE == 0
        with nullcontext() if last or not args.fix else model.no_sync():
            loss = nn.functional.cross_entropy(model(images), labels) / ACCUMULATE
            loss.backward()
        if not last:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if meter.step(len(images) * ACCUMULATE):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
