"""Exposed communication: a wide MLP (4.2 M parameters, 17 MB of gradients) trained with 32 samples per
rank per step, so every step all-reduces 17 MB for a few milliseconds of compute. Fix (`--fix`): gradient
accumulation over 8 micro-batches (`--factor K`: K), `model.no_sync()` on all but the last, so one all-reduce
per 256 samples (the doctor's remedy: the fewest micro-batches, up to 8, that bring the all-reduce under 10 % of
the step).

    paratrain launch -n 2 benchmarks/doctor_faults/exposed_comm.py [--fix] [--steps N] [--seconds S]
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
accumulate = (args.factor or 8) if args.fix else 1

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(
    nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * accumulate, momentum=0.9)  # LR follows the batch
meter = Meter(args)
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for i, (images, labels) in enumerate(loader):
        last = (i + 1) % accumulate == 0
        with nullcontext() if last else model.no_sync():  # gradients are all-reduced on the last only
            loss = nn.functional.cross_entropy(model(images), labels) / accumulate
            loss.backward()
        if not last:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if meter.step(len(images) * accumulate):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
