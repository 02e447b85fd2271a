"""Duplicate data: the DataLoader shuffles the whole dataset on every rank (no DistributedSampler), so each
rank trains on every sample and the 2 ranks do the epoch's work twice. Fix (`--fix`): a DistributedSampler
gives each rank its own half.

THROUGHPUT counts distinct samples per second: with the fault, every rank trains on the same samples, so a
step of 2 ranks advances the epoch by one rank's batch.

    paratrain launch -n 2 benchmarks/doctor_faults/duplicate_data.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
world = dist.get_world_size()

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0) if args.fix else None
loader = DataLoader(dataset, batch_size=32, sampler=sampler, shuffle=sampler is None, drop_last=True)

torch.manual_seed(0)
model = DDP(SmallCNN())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
meter = Meter(args)
for epoch in itertools.count():
    if sampler is not None:
        sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if meter.step(len(images) if args.fix else len(images) / world):  # distinct samples only
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
