"""Heavy checkpointing: rank 0 saves the full model and optimizer state (34 MB) after every step, while the
other rank waits for it at the next gradient all-reduce. Fix (`--fix`): save every 100 steps.

    paratrain launch -n 2 benchmarks/doctor_faults/checkpoint_heavy.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools
import os
import tempfile

import torch
import torch.distributed as dist
from common import Meter, SmallCNN, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = arguments(__doc__)
parser.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "checkpoint_heavy"))
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
save_every = 100 if args.fix else 1

dataset = TensorDataset(*synthetic_cifar(2048))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)

torch.manual_seed(0)
net = SmallCNN()
net.classifier = nn.Sequential(nn.Linear(64 * 4 * 4, 4096), nn.ReLU(), nn.Linear(4096, 10))  # a wide head
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if rank == 0:
    os.makedirs(args.out_dir, exist_ok=True)
meter = Meter(args)
step = 0
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0 and step % save_every == 0:
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                os.path.join(args.out_dir, "ckpt.pt"),
            )
        if meter.step(len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
