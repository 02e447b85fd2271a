"""Tiny buckets: DDP(bucket_cap_mb=0.01), copied from a forum answer about overlap, puts every gradient in a
bucket of its own: a deep MLP's 50 gradients become 50 all-reduces a step, each paying the link's latency,
instead of 2. Fix (`--fix`): DDP's default buckets (25 MiB, the first 1 MiB).

    paratrain launch -n 2 benchmarks/doctor_faults/tiny_buckets.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
net = nn.Sequential(
    nn.Flatten(),
    nn.Linear(3 * 32 * 32, 128),
    nn.ReLU(),
    *(m for _ in range(24) for m in (nn.Linear(128, 128), nn.ReLU())),
)
net.append(nn.Linear(128, 10))
model = DDP(net, bucket_cap_mb=None if args.fix else 0.01)
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
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
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
