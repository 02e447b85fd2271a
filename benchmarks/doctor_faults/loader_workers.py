"""Loader workers beyond the cores: the script asks for 4 DataLoader worker processes per rank ("workers
make loading faster"), but launch gave each rank one core, which its torch thread already keeps busy, so
the workers take turns with it: their time slices stall the rank's forward and backward, and it waits for
and receives their batches. Fix (`--fix`): no worker processes (`num_workers=0`): each batch is prepared
in the rank's own process.

    paratrain launch -n 2 benchmarks/doctor_faults/loader_workers.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class FullSize(Dataset):
    """Stands for decoded images at 4x the resolution the model trains at (128x128, 192 KiB a sample):
    cheap to prepare, but a worker's batch (6 MiB) must be copied into shared memory and received."""

    def __init__(self, samples: int):
        self.images, self.labels = synthetic_cifar(samples)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i].repeat_interleave(4, 1).repeat_interleave(4, 2), self.labels[i]


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = FullSize(4096)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
workers = {} if args.fix else dict(num_workers=4, persistent_workers=True)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True, **workers)

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.AvgPool2d(4), SmallCNN()))  # down to 32x32 first
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
