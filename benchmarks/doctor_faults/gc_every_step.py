"""Garbage collection every step: the loop calls gc.collect() after each step "to free memory", in a process
that holds a large Python index of its dataset (a dict of metadata per sample, as a user's annotation file
gives). Each full collection walks every one of those objects. Fix (`--fix`): no gc.collect() in the loop
(Python collects on its own; gc.freeze() after building the index keeps those objects out of it).

    paratrain launch -n 2 benchmarks/doctor_faults/gc_every_step.py [--fix] [--steps N] [--seconds S]
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

dataset = TensorDataset(*synthetic_cifar(4096))
# The annotation index: a few dicts per sample, as a COCO-style file gives once it is parsed.
index = [{"id": i, "boxes": [[i, i + 1, i + 2, i + 3]], "tags": {"split": "train"}} for i in range(400_000)]
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(SmallCNN())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
meter = Meter(args)
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if not args.fix:
            gc.collect()
        if meter.step(len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
