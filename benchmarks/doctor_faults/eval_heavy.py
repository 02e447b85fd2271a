"""Heavy evaluation: after every epoch all ranks score a held-out set 4 times the size of the training set,
so the run spends more time evaluating than training. Fix (`--fix`): score a fixed 1/8 subset of it.

    paratrain launch -n 2 benchmarks/doctor_faults/eval_heavy.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = TensorDataset(*synthetic_cifar(2048))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
held_out = TensorDataset(*synthetic_cifar(4 * len(dataset), seed=1))
if args.fix:
    held_out = Subset(held_out, range(len(held_out) // 8))  # the same subset every epoch
eval_loader = DataLoader(held_out, batch_size=256, sampler=DistributedSampler(held_out, shuffle=False))

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
        if meter.step(len(images)):
            break
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for images, labels in eval_loader:
            counts += torch.tensor([(model.module(images).argmax(1) == labels).sum().item(), len(labels)])
    model.train()
    dist.all_reduce(counts)
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: held-out accuracy {counts[0] / counts[1]:.3f}", flush=True)
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
