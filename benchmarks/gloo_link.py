"""The link the plan prices torch.distributed's own collectives with on CPU ranks (plan/links.py, `gloo_link`):
gloo's all-reduce between two ranks of this host, one core each (pinned as paratrain pins them), over the
loopback. FSDP's gathers and reduce-scatters, tensor parallelism's all-reduces and the pipeline's sends run
on gloo; only DDP's (and ZeRO-1's) gradient average takes paratrain's shared-memory path.

Per size, the median of 20 all-reduces (after 3 warm-up calls, a barrier before each). The line
t = alpha + bytes / beta: alpha the smallest message's time (4 KiB: its bytes take microseconds), beta the
slope from 1 MiB to 16 MiB (a least-squares line over all sizes lets the large messages set alpha, which
then comes out half the small messages' time). beta is the all-reduce's algorithm bandwidth; on 2 ranks the
ring's bus factor 2(n-1)/n is 1, so it is also the per-link bandwidth.

    .venv/bin/python benchmarks/gloo_link.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [2**k for k in range(12, 25, 2)]  # 4 KiB ... 16 MiB


def _rank(rank: int, store: str, queue) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank]])
    torch.set_num_threads(1)
    medians = []
    for size in SIZES:
        x = torch.ones(size // 4)
        for _ in range(3):
            dist.all_reduce(x)
        times = []
        for _ in range(20):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    if rank == 0:
        queue.put(medians)
    dist.destroy_process_group()


def main() -> None:
    queue = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(f"{tmp}/store", queue), nprocs=2)
    medians = queue.get()
    alpha = medians[0]
    first = SIZES.index(2**20)
    beta = (SIZES[-1] - SIZES[first]) / (medians[-1] - medians[first])
    print("| message | median all-reduce | algorithm bandwidth |")
    print("|---|---|---|")
    for size, t in zip(SIZES, medians):
        print(f"| {size / 2**10:,.0f} KiB | {t * 1e3:.3f} ms | {size / t / 1e9:.2f} GB/s |")
    print(f"\nalpha {alpha * 1e3:.3f} ms, beta {beta / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
