"""DDP's gradient_as_bucket_view=True with zero_grad(set_to_none=True) against set_to_none=False.

Checks, right after backward, whether the gradients are views into DDP's buckets (the memory
saving), and times a step of each variant (alternating, medians). One rank, gloo, one thread:
    .venv/bin/python benchmarks/grad_bucket_view.py --repeats 12
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29556")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    x = torch.randn(16, 1024)
    variants = {}
    for set_to_none in (True, False):
        torch.manual_seed(0)
        module = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])  # 8.4 M parameters
        model = DistributedDataParallel(module, gradient_as_bucket_view=True)
        variants[set_to_none] = (module, model, torch.optim.SGD(model.parameters(), lr=1e-3), [], [])
    for _ in range(args.repeats):
        for set_to_none, (module, model, opt, times, views) in variants.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                model(x).square().mean().backward()
                views.append(all(p.grad._base is not None for p in module.parameters()))
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
            times.append((time.perf_counter() - start) / args.steps)
    for set_to_none, (_, _, _, times, views) in variants.items():
        print(
            f"zero_grad(set_to_none={set_to_none}): median step {statistics.median(times[2:]) * 1e3:.1f} ms; "
            f"gradients were bucket views after backward in {sum(views[1:])} of {len(views) - 1} steps after the first"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
