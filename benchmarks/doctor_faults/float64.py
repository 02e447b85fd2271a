"""Float64 by accident: the data arrive as float64 NumPy arrays (NumPy's default), and the script makes the
model match them (`model.double()`) instead of converting the data. Every layer, gradient and optimizer
update then runs in double precision. Fix (`--fix`): the data converted to float32 once, the model left
in float32.

    paratrain launch -n 2 benchmarks/doctor_faults/float64.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import numpy as np
import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")

images, labels = synthetic_cifar(4096)
images = np.asarray(images, dtype=np.float64)  # as a user's NumPy pipeline hands them over
inputs = torch.from_numpy(images.astype(np.float32) if args.fix else images)
dataset = TensorDataset(inputs, labels)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
net = SmallCNN()
model = DDP(net if args.fix else net.double())
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
