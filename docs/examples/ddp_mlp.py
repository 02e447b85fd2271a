"""A plain torchrun-style DDP script: what `paratrain launch` and `paratrain scale --script` run.

It knows nothing of paratrain but `paratrain.report(...)`: it reads RANK/WORLD_SIZE through
init_process_group like any torchrun script, trains an MLP on a fixed synthetic dataset split
across the ranks, and reports the epoch's samples (all ranks) and time once per epoch.

    paratrain launch -n 2 docs/examples/ddp_mlp.py --epochs 4
    paratrain scale --script docs/examples/ddp_mlp.py --workers 1,2 --out runs/mlp -- --epochs 4
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import paratrain

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--samples", type=int, default=8192, help="training samples (all ranks together)")
parser.add_argument("--batch-size", type=int, default=64, help="per rank (weak scaling) or global (strong)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# Under `paratrain scale --mode strong` the global batch stays fixed and is split over the ranks.
strong = os.environ.get("PARATRAIN_SCALE_MODE") == "strong"
batch = args.batch_size // world if strong else args.batch_size

generator = torch.Generator().manual_seed(0)
inputs = torch.randn(args.samples, 256, generator=generator)
labels = torch.randint(0, 10, (args.samples,), generator=generator)
mine = slice(rank * args.samples // world, (rank + 1) * args.samples // world)   # this rank's shard
inputs, labels = inputs[mine], labels[mine]

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for epoch in range(args.epochs):
    started = time.perf_counter()
    order = torch.randperm(len(inputs), generator=generator)
    for i in range(0, len(inputs) - batch + 1, batch):
        step = order[i:i + batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs[step]), labels[step])
        loss.backward()
        optimizer.step()
    seen = (len(inputs) // batch) * batch * world
    paratrain.report(step=epoch, samples=seen, epoch_time_s=time.perf_counter() - started, train_loss=loss.item())
dist.destroy_process_group()
