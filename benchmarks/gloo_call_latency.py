"""Why gloo's small collectives are noisy on this machine: the spread of single all-reduce calls.

Two ranks, one core each (pinned after the process group exists, as paratrain pins them), time
2,000 single gloo all-reduces at each size and print quantiles of the call time and the mean. A
mean that moves while the median stays says that a share of the calls is delayed by something
other than the message; commbench's typical call (the median) rests on this
(docs/synchronisation.md, "paratrain commbench").

    .venv/bin/python benchmarks/gloo_call_latency.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
SIZES = (1024, 16384, 262144)


def _rank(rank: int, store: str, calls: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank]])
    torch.set_num_threads(1)
    rows = {}
    for nbytes in SIZES:
        tensor = torch.ones(nbytes // 4)
        for _ in range(200):  # warm-up: connections, buffers, gloo's threads
            dist.all_reduce(tensor)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        times.sort()
        rows[nbytes] = [times[int(q * calls)] for q in QUANTILES] + [sum(times) / calls]
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        ranks = [ctx.Process(target=_rank, args=(r, f"{tmp}/store", args.calls, queue)) for r in range(2)]
        for p in ranks:
            p.start()
        rows = queue.get()
        for p in ranks:
            p.join()
    print(f"gloo all-reduce, 2 pinned ranks, {args.calls} calls a size: ms")
    print("| bytes | " + " | ".join(f"p{round(q * 100)}" for q in QUANTILES) + " | mean |")
    print("|---" * (len(QUANTILES) + 2) + "|")
    for nbytes, values in rows.items():
        print(f"| {nbytes:,} | " + " | ".join(f"{v * 1e3:.2f}" for v in values) + " |")


if __name__ == "__main__":
    main()
