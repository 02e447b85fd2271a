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
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from common import Meter, SmallCNN, arguments, synthetic_cifar


class Augmented(Dataset):
    """Stands for decoded images with a CPU augmentation per sample (about 0.15 ms each)."""

    def __init__(self, samples: int):
        self.images, self.labels = synthetic_cifar(samples)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        for _ in range(4):          # blur passes standing for the augmentation
            image = torch.nn.functional.avg_pool2d(image[None], 3, 1, 1)[0] * 1.01
        return image, self.labels[i]


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = Augmented(4096)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
workers = {} if args.fix else dict(num_workers=4, persistent_workers=True)
loader = DataLoader(dataset, batch_size=64, sampler=sampler, drop_last=True, **workers)

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
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()        # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
