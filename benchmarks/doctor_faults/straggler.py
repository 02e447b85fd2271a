"""Straggler: rank 1 also computes a monitoring statistic every step (the spectrum of the batch's feature
covariance), work rank 0 does not have, so rank 0 waits for it at every gradient all-reduce.
Fix (`--fix`): no extra work on one rank (compute such statistics rarely, or on every rank's share).

    paratrain launch -n 2 benchmarks/doctor_faults/straggler.py [--fix] [--steps N] [--seconds S]
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
rank = dist.get_rank()

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(SmallCNN())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
meter = Meter(args)
spectra = []  # rank 1's top eigenvalues, one row per step
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if rank == 1 and not args.fix:
            with torch.no_grad():  # the features' spectrum for a dashboard: rank 1 was "free to do it"
                features = model.module.features(images).flatten(1)  # (batch, 1024)
                covariance = torch.cov(features.T) + 1e-4 * torch.eye(features.shape[1])  # batch < 1024: singular
                spectra.append(torch.linalg.eigvalsh(covariance)[-8:])
        if meter.step(len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
