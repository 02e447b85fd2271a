"""`find_unused_parameters=True` where no parameter is unused: a deep stack of 256 small linear layers, so that
what the flag adds to every step (DDP searches the autograd graph for unused parameters after each forward,
marks the used ones in backward and all-reduces that map) is as large a share as it gets. At 192 samples per
rank: at 96 the all-reduce of the 514 parameter tensors was near a fifth of the step (25 % with the flag, whose
map all-reduce adds to it; 17 % without), a second problem in a catalogue of single faults; at 8 the step is all
per-call overhead, and the doctor rightly names the small batch first. Here the flag costs about 4 ms of a 37 ms
step (1.13x in the catalogue): the graph search 0.6 ms, which the probe times, the rest spread over the
all-reduce (its used-parameter map), forward and backward, which no single run separates. Fix (`--fix`):
`find_unused_parameters=False` (the default).

    paratrain launch -n 2 benchmarks/doctor_faults/find_unused.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class DeepLinearNet(nn.Module):
    """A conv stem, then a deep linear network: 256 small linear layers without activations between them
    (each factor of the product is a module and two parameters, so 512 parameters for DDP to look for)."""

    def __init__(self, depth: int = 256, width: int = 32):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 2 * 2, width),
        )
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=192, sampler=sampler, drop_last=True)

torch.manual_seed(0)
# "in case some parameter gets no gradient": copied from a model that had a branch, this one has none
model = DDP(DeepLinearNet(), find_unused_parameters=not args.fix)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
meter = Meter(args)
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
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
