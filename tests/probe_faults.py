"""A plain torchrun-style DDP script (no paratrain import) with one planted fault, chosen by argv[1]:
healthy, data, threads, straggler, rank0-eval, eval, checkpoint, no-sync, collective, uneven,
find-unused, comm, small-batch, host-sync, loader-workers, broken-loader, buckets, model-collective, recompute,
json-log, anomaly, frozen, profiled, fsdp-leaf (FSDP2 on every Linear of a 22-layer MLP), epoch-reload, per-loss
(FSDP2, a backward per term of the loss); and two
healthy ones wrapped
otherwise: fsdp (FSDP2's
fully_shard instead of DDP) and bare (no wrapper, one rank). tests/test_doctor_probe.py launches it and checks the
doctor's top finding."""

import contextlib
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

fault = sys.argv[1]
STEPS = 24


class Images(Dataset):
    def __init__(self, n, slow=False):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.slow = (
            torch.randn(n, 3, 16, 16, generator=g),
            torch.randint(0, 10, (n,), generator=g),
            slow,
        )

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.slow:
            time.sleep(0.003)  # reading a sample from a slow disk
        return self.x[i], self.y[i]


class Generated(Dataset):
    """Large samples made on the fly: cheap to prepare, costly to ship from a worker process."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 128, 128), float(i % 7)), i % 10


def spin(seconds):
    """CPU work of `seconds` of this thread's CPU time, whatever else runs on the machine."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
if fault == "threads":
    torch.set_num_threads(4)  # on a rank that launch gave one core
if fault == "anomaly":  # left on after debugging a NaN: every operator records its stack
    torch.autograd.set_detect_anomaly(True)
if fault == "comm":
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(768, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
elif fault == "anomaly":  # many small layers: what anomaly mode adds to each operator is most of their time
    net = nn.Sequential(
        nn.Flatten(),
        nn.Linear(768, 64),
        *(m for _ in range(24) for m in (nn.Linear(64, 64), nn.Tanh())),
        nn.Linear(64, 10),
    )
elif fault == "find-unused":
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        *[nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU()) for _ in range(60)],
        nn.Flatten(),
        nn.Linear(8 * 16 * 16, 10),
    )
elif fault == "threads":  # the catalogue's CNN at 32x32: its backward really runs on the 4 threads
    net = nn.Sequential(
        nn.Upsample(scale_factor=2),
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 16, 10),
    )
elif fault in ("buckets", "fsdp-leaf"):  # 44 gradients, each in a bucket of its own under bucket_cap_mb=0.001
    net = nn.Sequential(
        nn.Flatten(),
        nn.Linear(768, 64),
        *(m for _ in range(20) for m in (nn.Linear(64, 64), nn.ReLU())),
        nn.Linear(64, 10),
    )
elif fault == "model-collective":  # a batch norm synchronised by hand: two all-reduces in forward, two in backward
    from torch.distributed.nn.functional import all_reduce

    class SyncedNorm(nn.BatchNorm2d):
        def forward(self, x):
            mean = all_reduce(x.mean(dim=(0, 2, 3))) / world
            var = all_reduce((x * x).mean(dim=(0, 2, 3))) / world - mean * mean
            x = (x - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + self.eps)
            return x * self.weight[None, :, None, None] + self.bias[None, :, None, None]

    net = nn.Sequential(
        *(m for c in (3, 16, 16, 16) for m in (nn.Conv2d(c, 16, 3, padding=1), SyncedNorm(16), nn.ReLU())),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
elif fault == "recompute":  # every block checkpointed, in a run nowhere near its memory limit

    class Checkpointed(nn.Module):  # convolutions: much work per parameter, so the all-reduce stays small
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.GELU(), nn.Conv2d(32, 32, 3, padding=1))
                for _ in range(4)
            )
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

        def forward(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            return self.head(x)

    net = Checkpointed()
elif fault == "small-batch":  # little work per sample: a step's fixed costs dominate at 2 samples
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)
    )
else:
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    if fault == "loader-workers":
        net = nn.Sequential(nn.AvgPool2d(8), *net)  # its 128x128 samples down to the usual 16x16
if fault in ("fsdp", "fsdp-leaf", "per-loss"):  # FSDP2 on a CPU mesh: each conv and the head sharded, then the root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in net:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    model = fully_shard(net, mesh=mesh)
elif fault == "bare":
    model = net
else:
    model = nn.parallel.DistributedDataParallel(
        net, find_unused_parameters=fault == "find-unused", bucket_cap_mb=0.001 if fault == "buckets" else None
    )
# frozen: the convolutions were meant to be frozen, but only the head went to the optimizer
opt = torch.optim.SGD(net[-1].parameters() if fault == "frozen" else model.parameters(), lr=0.01)
batch = 2 if fault == "small-batch" else 32
train = Images((2 * STEPS * batch * world) if fault != "uneven" else 2 * STEPS * batch, slow=fault == "data")
if fault == "uneven":  # rank 1 gets twice rank 0's samples; join() keeps DDP from hanging
    share = [range(0, STEPS * batch * 2 // 3), range(STEPS * batch * 2 // 3, 2 * STEPS * batch)][rank]
    loader = DataLoader(torch.utils.data.Subset(train, list(share)), batch_size=batch)
elif fault == "loader-workers":  # 4 workers a rank on the one core launch gave it
    train = Generated(len(train))
    loader = DataLoader(train, batch_size=batch, sampler=DistributedSampler(train), num_workers=4)
else:
    loader = DataLoader(train, batch_size=batch, sampler=DistributedSampler(train))
held_out = Images(256)
history = []
accumulate = 4 if fault == "no-sync" else 1
iterator = iter(loader)
if fault == "epoch-reload":  # the dataset and its loader built again every epoch, as a "reload" each epoch does

    def reloaded():
        for _ in range(4):
            fresh = Images(len(train) // 4)
            spin(0.15)  # building it: reading an index, decoding labels
            yield from DataLoader(fresh, batch_size=batch, sampler=DistributedSampler(fresh))

    iterator = reloaded()
if fault == "broken-loader":
    iterator._num_workers = "several"  # an iterator the probe cannot read: it must step aside
# join() only where the shards are uneven: under it every DDP forward is a collective, so a rank
# evaluating alone through the DDP model would wait for ranks that are not evaluating.
# profiled: torch.profiler left on around the whole loop, as after a profiling session
profiler = torch.profiler.profile() if fault == "profiled" else contextlib.nullcontext()
with model.join() if fault == "uneven" else contextlib.nullcontext(), profiler:
    for i, (x, y) in enumerate(iterator):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y) / accumulate
        if fault == "per-loss":  # three terms of one loss, a backward each: the graph walked (and gathered) 3 times
            for term in (loss, 0.01 * logits.pow(2).mean(), 0.01 * logits.abs().mean()):
                term.backward(retain_graph=True)
        else:
            loss.backward()  # with accumulation and no no_sync(): an all-reduce every micro-step
        if fault == "straggler" and rank == 1:
            spin(0.02)
        if (i + 1) % accumulate:
            continue
        opt.step()
        opt.zero_grad()
        if fault == "json-log":  # every step, the whole run's history written out as JSON
            history.append({"step": i, "loss": [float(v) for v in range(3000)], "lr": 0.01})
            json.dumps(history)
        if fault == "host-sync":
            logged = [loss.item(), loss.detach().tolist(), x.mean().item()]  # three host reads a step
        if fault == "collective":
            for _ in range(100):  # a global loss for every one of many logged values
                dist.all_reduce(loss.detach().clone())
        if fault == "checkpoint" and rank == 0:
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "pad": torch.zeros(2_000_000)},
                os.path.join(os.environ.get("TMPDIR", "/tmp"), f"probe-fault-{os.getpid()}.pt"),
            )
        if fault in ("rank0-eval", "eval") and (i + 1) % 8 == 0 and (rank == 0 or fault == "eval"):
            model.eval()
            with torch.no_grad():
                for _ in range(4):
                    for x, _ in DataLoader(held_out, batch_size=64):
                        model(x)
            model.train()
        if fault == "rank0-eval" and (i + 1) % 8 == 0:
            dist.barrier()
if fault == "checkpoint" and rank == 0:
    os.remove(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"probe-fault-{os.getpid()}.pt"))
print(f"rank {rank} done")
# DDP (in reference cycles) freed before its process group: torch 2.13 can abort at exit otherwise
del model, opt, loss, iterator
gc.collect()
dist.destroy_process_group()
