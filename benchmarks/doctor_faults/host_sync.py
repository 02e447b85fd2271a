"""Per-step logging through collectives: every step the gradient norm of each of the model's 26 parameter
tensors (a debugging aid left in), the loss and the accuracy are each averaged over the ranks with their
own all_reduce and read on the host (`.item()`) so rank 0 can log them. Each read is a host-device sync
on a GPU; on these CPU ranks the cost is the 28 extra collectives, each a meeting of both ranks, every
step. Fix (`--fix`): keep the values on the device, add them up, and all_reduce them together (one stacked
tensor) every 50 steps.

    paratrain launch -n 2 benchmarks/doctor_faults/host_sync.py [--fix] [--steps N] [--seconds S]
"""

import gc
import itertools

import torch
import torch.distributed as dist
from common import Meter, arguments, synthetic_cifar
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

args = arguments(__doc__).parse_args()
dist.init_process_group("gloo")
log_every = 50 if args.fix else 1

dataset = TensorDataset(*synthetic_cifar(4096))
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)


def block(channels_in: int, channels_out: int, pool: bool) -> list[nn.Module]:
    return [
        nn.Conv2d(channels_in, channels_out, 3, padding=1),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(),
        *([nn.MaxPool2d(2)] if pool else []),
    ]


torch.manual_seed(0)
# Six conv blocks with batch norm: 24 parameter tensors, and 2 in the head.
model = DDP(
    nn.Sequential(
        *block(3, 8, False),
        *block(8, 16, True),
        *block(16, 16, False),
        *block(16, 32, True),
        *block(32, 32, False),
        *block(32, 32, True),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def metrics(logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    norms = [p.grad.norm() for p in model.parameters()]  # noqa: F821 (the script's global, deleted at its end)
    return torch.stack([loss.detach(), (logits.argmax(1) == labels).float().mean(), *norms])


meter = Meter(args)
step, running = 0, None
for epoch in itertools.count():
    sampler.set_epoch(epoch)
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = nn.functional.cross_entropy(logits, labels)
        loss.backward()
        values = metrics(logits, labels, loss)
        optimizer.step()
        step += 1
        if args.fix:
            running = values if running is None else running + values  # stays on the device: no sync
            if step % log_every == 0:
                dist.all_reduce(running)
                logged = (running / log_every / dist.get_world_size()).tolist()
                running = None
        else:
            logged = []
            for value in values:  # one collective and one host read per value
                dist.all_reduce(value)
                logged.append(value.item() / dist.get_world_size())
        if dist.get_rank() == 0 and step % log_every == 0:
            print(
                f"step {step}: loss {logged[0]:.4f}, accuracy {logged[1]:.3f}, largest gradient norm "
                f"{max(logged[2:]):.3f}"
            )
        if meter.step(len(images)):
            break
    if meter.end_epoch():
        break
meter.report()
del model, optimizer
gc.collect()  # DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit
dist.destroy_process_group()
