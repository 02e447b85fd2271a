"""Collectives inside forward: synchronised batch norm. torch's nn.SyncBatchNorm runs on GPUs only, so for
CPU ranks the user wrote their own, as forum answers show: each BatchNorm all-reduces its batch mean and
variance across ranks with torch.distributed.nn.functional.all_reduce (differentiable: one all-reduce in
forward, one in backward), though each rank has 32 samples a step, plenty for its own statistics. Six such
layers put 24 small all-reduces a step on the critical path. Fix (`--fix`): plain BatchNorm2d (per-rank
statistics).

    paratrain launch -n 2 benchmarks/doctor_faults/forward_collectives.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, arguments, synthetic_cifar
from torch import nn
from torch.distributed.nn.functional import all_reduce
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class SyncBN(nn.BatchNorm2d):
    """Batch norm with statistics over every rank's batch (nn.SyncBatchNorm's idea, on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        mean = all_reduce(x.mean(dim=(0, 2, 3))) / world
        var = all_reduce((x * x).mean(dim=(0, 2, 3))) / world - mean * mean
        with torch.no_grad():
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
        x = (x - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + self.eps)
        return x * self.weight[None, :, None, None] + self.bias[None, :, None, None]


def block(cin: int, cout: int, fix: bool) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), (nn.BatchNorm2d if fix else SyncBN)(cout), nn.ReLU())


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
f = args.fix
net = nn.Sequential(
    block(3, 16, f),
    block(16, 16, f),
    nn.MaxPool2d(2),
    block(16, 32, f),
    block(32, 32, f),
    nn.MaxPool2d(2),
    block(32, 64, f),
    block(64, 64, f),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(64, 10),
)
model = DDP(net)
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
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
