"""A torchrun-style DDP script with planted problems, chosen by argv[1] (comma-separated):
straggler (rank 1 works 3x as long per step), rank0-eval (rank 0 evaluates alone at the end),
fail (rank 1 raises after its last step, as a run that fails late does);
argv[2]: optimizer steps."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import paratrain


def spin(seconds):
    """Busy work of `seconds` of CPU time (not wall time: on a loaded machine every phase stretches alike)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
modes = sys.argv[1].split(",")
started = time.perf_counter()
for _ in range(int(sys.argv[2])):
    spin(0.01 + (0.02 if "straggler" in modes and rank == 1 else 0.0))  # the step's "compute"
    model(torch.randn(8, 16)).sum().backward()  # DDP's all-reduce: ranks meet
    opt.step()
    opt.zero_grad()
if "fail" in modes and rank == 1:
    raise RuntimeError("planted failure after the last step")
if "rank0-eval" in modes and rank == 0:
    spin(4.0)  # evaluation under `if rank == 0:` while the others wait at the barrier
dist.barrier()
paratrain.report(samples_per_s=int(sys.argv[2]) * 8 * dist.get_world_size() / (time.perf_counter() - started))
del model, opt  # DDP before its process group: torch 2.13 can abort at exit otherwise (docs/launch.md)
dist.destroy_process_group()
