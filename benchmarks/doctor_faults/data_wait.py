"""Data wait: the Dataset reads every image on its own (a wait on the disk, then a decode) in the training
process, so each step first waits for its batch. Fix (`--fix`): two DataLoader worker processes load the
next batches while the model trains on this one.

    paratrain launch -n 2 benchmarks/doctor_faults/data_wait.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools
import time

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ImageFiles(Dataset):
    """Stands for a folder of image files: 8-bit pixels read one sample at a time."""

    def __init__(self, samples: int):
        images, self.labels = synthetic_cifar(samples)
        self.pixels = (images * 64 + 128).clamp(0, 255).to(torch.uint8)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)  # the read: the process waits, its core idles
        image = self.pixels[i].float().div(255).sub(0.5).div(0.25)  # the decode and normalisation
        return image, self.labels[i]


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

dataset = ImageFiles(4096)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
workers = dict(num_workers=2, persistent_workers=True) if args.fix else {}
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True, **workers)

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
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
