"""Small per-device batch: 2 samples per rank per step, so the fixed costs of a step (the gradient
all-reduce, the optimizer step, Python and the DataLoader's per-batch work) dominate the little compute.
Fix (`--fix`): 32 samples per rank (`--factor K`: 2K), the learning rate scaled linearly with the batch.

    paratrain launch -n 2 benchmarks/doctor_faults/small_batch.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
batch_size = 2 * (args.factor or 16) if args.fix else 2
lr = 0.05 * batch_size / 32  # linear scaling: the LR follows the batch

dataset = TensorDataset(*synthetic_cifar(2048))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(SmallCNN())
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
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
