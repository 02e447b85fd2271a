"""A plain DDP script that lets paratrain set its batch: `paratrain launch --batch-schedule`.

ddp_mlp.py's training, with one change: each optimizer step runs the micro-steps that
`paratrain.batch_schedule(...)` hands it, dividing each loss by `schedule.accum`, and tells the
schedule when the step is done. Under torchrun or plain `python` nothing sets a schedule, and it
trains at --grad-accum micro-steps a step throughout. `--wrap fsdp` shards the same model with FSDP2's
`fully_shard` over all ranks, `--wrap hsdp` over pairs of ranks, replicated across the pairs (HSDP); the
loop is the same.

    paratrain launch -n 2 --batch-schedule adaptive --max-global-batch 1024 docs/examples/ddp_schedule.py
    paratrain launch -n 2 --batch-schedule warmup --max-global-batch 256 docs/examples/ddp_schedule.py
    paratrain launch -n 2 --batch-schedule adaptive --max-global-batch 1024 docs/examples/ddp_schedule.py --wrap fsdp
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import paratrain

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--samples", type=int, default=8192, help="training samples (all ranks together)")
parser.add_argument("--batch-size", type=int, default=16, help="samples a rank a micro-step")
parser.add_argument("--grad-accum", type=int, default=1, help="micro-steps a step to start at")
parser.add_argument("--lr", type=float, default=0.01, help="the LR at the starting batch")
parser.add_argument("--log-every", type=int, default=10, help="steps between the schedule's readings")
parser.add_argument("--wrap", choices=["ddp", "fsdp", "hsdp"], default="ddp", help="DDP, FSDP2, or FSDP2 over pairs")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(args.samples, 256, generator=generator)
labels = torch.randint(0, 10, (args.samples,), generator=generator)
mine = slice(rank * args.samples // world, (rank + 1) * args.samples // world)  # this rank's shard
inputs, labels = inputs[mine], labels[mine]

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 10),
)
if args.wrap == "ddp":
    model = DDP(model)
else:  # each linear layer its own FSDP unit, the rest with the root
    shape, names = ((world,), ("shard",)) if args.wrap == "fsdp" else ((world // 2, 2), ("replicate", "shard"))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    model = fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
schedule = paratrain.batch_schedule(
    model, optimizer, batch_size=args.batch_size, grad_accum=args.grad_accum, samples_per_epoch=args.samples,
    log_every=args.log_every,
)
for epoch in range(args.epochs):
    started = time.perf_counter()
    order = iter(torch.randperm(len(inputs), generator=generator).split(args.batch_size))
    steps = seen = 0
    while len(inputs) - seen >= schedule.accum * args.batch_size:  # whole steps only
        for _ in schedule.micro_steps():
            batch = next(order)
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            (loss / schedule.accum).backward()
            seen += len(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step_done()
        steps += 1
    paratrain.report(
        step=epoch,
        samples=seen * world,
        epoch_time_s=time.perf_counter() - started,
        train_loss=loss.item(),
        steps=steps,
        global_batch_size=schedule.global_batch,
        lr=optimizer.param_groups[0]["lr"],
    )
dist.destroy_process_group()
