"""Decoding on full cores: the Dataset keeps its images as JPEG bytes and decodes one with Pillow in every
__getitem__ (the usual ImageFolder pattern), on a machine whose cores all train: 2 ranks on 2 cores, no
core to spare for DataLoader workers. Fix (`--fix`): decode once, before training, and keep the tensors
in memory (CIFAR-sized images fit).

    paratrain launch -n 2 benchmarks/doctor_faults/decode_full_cores.py [--fix] [--steps N] [--seconds S]
"""

import gc
import io
import itertools

import numpy as np
import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset


def to_tensor(jpeg: bytes) -> torch.Tensor:
    pixels = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.float32)
    return torch.from_numpy(pixels).permute(2, 0, 1).div(255).sub(0.5).div(0.25)


class JpegImages(Dataset):
    """Images stored as JPEG bytes, decoded at every access."""

    def __init__(self, jpegs: list[bytes], labels: torch.Tensor):
        self.jpegs, self.labels = jpegs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return to_tensor(self.jpegs[i]), self.labels[i]


def encode(image: torch.Tensor) -> bytes:
    pixels = (image * 64 + 128).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).resize((160, 160)).save(out, format="JPEG", quality=90)
    return out.getvalue()


args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

images, labels = synthetic_cifar(2048)
jpegs = [encode(image) for image in images]
if args.fix:
    dataset = TensorDataset(torch.stack([to_tensor(j) for j in jpegs]), labels)
else:
    dataset = JpegImages(jpegs, labels)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.AvgPool2d(5), SmallCNN()))
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
