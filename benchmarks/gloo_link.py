"""The link the plan prices torch.distributed's own collectives with on CPU ranks (plan/links.py, `gloo_link`):
gloo's all-reduce between two ranks of this host, one core each (pinned as paratrain pins them), over the
loopback. FSDP's gathers and reduce-scatters, tensor parallelism's all-reduces and the pipeline's sends run
on gloo; only DDP's (and ZeRO-1's) gradient average takes paratrain's shared-memory path.

Per size, the median of 20 all-reduces (after 3 warm-up calls, a barrier before each). The line
t = alpha + bytes / beta: alpha the smallest message's time (4 KiB: its bytes take microseconds), beta the
slope from 1 MiB to 16 MiB (a least-squares line over all sizes lets the large messages set alpha, which
then comes out half the small messages' time). beta is the all-reduce's algorithm bandwidth; on 2 ranks the
ring's bus factor 2(n-1)/n is 1, so it is also the per-link bandwidth.

    .venv/bin/python benchmarks/gloo_link.py [--collective all_gather|reduce_scatter]

`--collective` times FSDP's own instead, on the same sizes (the whole tensor; each rank holds half):
`all_gather_into_tensor` and `reduce_scatter_tensor`, as FSDP2 calls them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [2**k for k in range(12, 25, 2)]  # 4 KiB ... 16 MiB


def _call(collective: str, size: int):
    """One collective over `size` bytes in all, as a function of no arguments."""
    whole = torch.ones(size // 4)
    half = torch.ones(size // 8)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(whole, half)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(half, whole)
    return lambda: dist.all_reduce(whole)


def _rank(rank: int, store: str, queue, collective: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank]])
    torch.set_num_threads(1)
    medians = []
    for size in SIZES:
        call = _call(collective, size)
        for _ in range(3):
            call()
        times = []
        for _ in range(20):
            dist.barrier()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    if rank == 0:
        queue.put(medians)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collective", choices=("all_reduce", "all_gather", "reduce_scatter"), default="all_reduce")
    collective = parser.parse_args().collective
    queue = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(f"{tmp}/store", queue, collective), nprocs=2)
    medians = queue.get()
    alpha = medians[0]
    first = SIZES.index(2**20)
    beta = (SIZES[-1] - SIZES[first]) / (medians[-1] - medians[first])
    print(f"| message | median {collective} | algorithm bandwidth |")
    print("|---|---|---|")
    for size, t in zip(SIZES, medians):
        print(f"| {size / 2**10:,.0f} KiB | {t * 1e3:.3f} ms | {size / t / 1e9:.2f} GB/s |")
    print(f"\nalpha {alpha * 1e3:.3f} ms, beta {beta / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
