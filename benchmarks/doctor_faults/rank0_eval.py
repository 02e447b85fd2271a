"""Rank 0 evaluates alone: after every epoch rank 0 scores the whole held-out set while the other rank
waits at the next collective. Fix (`--fix`): every rank scores its share of the held-out set (a
DistributedSampler over it) and an all_reduce adds up the counts.

    paratrain launch -n 2 benchmarks/doctor_faults/rank0_eval.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@torch.no_grad()
def correct_and_seen(model: torch.nn.Module, loader: DataLoader) -> torch.Tensor:
    model.eval()
    counts = torch.zeros(2)
    for images, labels in loader:
        counts += torch.tensor([(model(images).argmax(1) == labels).sum().item(), len(labels)])
    model.train()
    return counts


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()

dataset = TensorDataset(*synthetic_cifar(2048))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
held_out = TensorDataset(*synthetic_cifar(8192, seed=1))
shard = DistributedSampler(held_out, shuffle=False) if args.fix else None
eval_loader = DataLoader(held_out, batch_size=256, sampler=shard)

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
    if args.fix:
        counts = correct_and_seen(model.module, eval_loader)
        dist.all_reduce(counts)
    elif rank == 0:
        counts = correct_and_seen(model.module, eval_loader)
    if rank == 0:
        print(f"epoch {epoch}: held-out accuracy {counts[0] / counts[1]:.3f}", flush=True)
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
