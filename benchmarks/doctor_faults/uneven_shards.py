"""Uneven shards: the data is split by hand and rank 1 got twice as many samples as rank 0 (say, two of the
three files). DDP's `join()` keeps the run from hanging when rank 0 runs out, but from then on rank 1 trains
alone while rank 0 only shadows its all-reduces. Fix (`--fix`): a DistributedSampler gives every rank an
equal share.

    paratrain launch -n 2 benchmarks/doctor_faults/uneven_shards.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, SubsetRandomSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()

dataset = TensorDataset(*synthetic_cifar(3072))
if args.fix:
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
else:
    third = len(dataset) // 3
    mine = range(third) if rank == 0 else range(third, len(dataset))  # rank 1 holds files 2 and 3
    sampler = SubsetRandomSampler(mine, generator=torch.Generator().manual_seed(rank))
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(SmallCNN())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
meter = Meter(args)
for epoch in itertools.count():
    if args.fix:
        sampler.set_epoch(epoch)
    with model.join():  # lets a rank that ran out of batches wait for the others instead of hanging
        for images, labels in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            if meter.step(len(images)):
                break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
