"""Per-step loss logging: every step all_reduces the loss and reads it (`.item()`) so rank 0 can print the
mean over ranks. On a GPU each read is a host-device sync; on these CPU ranks the cost is the extra
collective, which makes both ranks meet once more per (short) step. Fix (`--fix`): add the losses up on
the device and all_reduce and print them every 50 steps.

    paratrain launch -n 2 benchmarks/doctor_faults/host_sync.py [--fix] [--steps N] [--seconds S]
"""
import itertools

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from common import Meter, arguments, synthetic_cifar

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
log_every = 50 if args.fix else 1

dataset = TensorDataset(*synthetic_cifar(8192))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
meter = Meter(args)
step, running = 0, torch.zeros(1)
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        step += 1
        running += loss.detach()            # stays on the device: no sync
        if step % log_every == 0:
            dist.all_reduce(running)
            if dist.get_rank() == 0:
                print(f"step {step}: loss {running.item() / log_every / dist.get_world_size():.4f}")
            running.zero_()
        if meter.step(len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
dist.destroy_process_group()
