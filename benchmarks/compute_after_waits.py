"""Does a rank's compute run slower when its steps are broken by waits? Two gloo ranks, each pinned to a core of
its own, train the catalogue's SmallCNN (32 samples) and time forward and backward alone, while between steps they
do one of: nothing but the step's all-reduce (`none`); 28 small all-reduces each read on the host, as
benchmarks/doctor_faults/host_sync.py does (`collectives28`); sleep 20 ms (`sleep20`); spin 20 ms (`spin20`); or
rank 1 spins 20 ms while rank 0 waits for it in the all-reduce (`barrier_skew`). The modes alternate in blocks.

On one day of the AVX2 VM (2026-11-30) host_sync.py's faulty run, which meets the other rank 28 times a step, ran
its convolutions twice as long as its fixed run did; the doctor, which prices the collectives' own time, missed
that part of the fix's gain. This measures whether the machine does that: compare each mode's median with `none`.

    .venv/bin/python benchmarks/compute_after_waits.py [--modes none,collectives28,sleep20,spin20,barrier_skew]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "doctor_faults"))
from common import SmallCNN

MODES = ("none", "collectives28", "sleep20", "spin20", "barrier_skew")


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def rank_loop(rank: int, port: int, modes: list[str], blocks: int, steps: int) -> None:
    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, x, y = SmallCNN(), torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    scalars = [torch.zeros(()) for _ in range(28)]
    compute: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(blocks):
        for mode in modes:
            for _ in range(steps):
                started = time.perf_counter()
                nn.functional.cross_entropy(model(x), y).backward()
                compute[mode].append(time.perf_counter() - started)
                if mode == "collectives28":
                    for s in scalars:
                        dist.all_reduce(s)
                        s.item()
                elif mode == "sleep20":
                    time.sleep(0.02)
                elif mode == "spin20" or (mode == "barrier_skew" and rank == 1):
                    spin(0.02)
                dist.all_reduce(scalars[0])  # the step's own meeting
    base = statistics.median(compute[modes[0]])
    for mode in modes:
        median = statistics.median(compute[mode])
        print(f"rank {rank} {mode:14s} forward+backward median {median * 1e3:6.1f} ms ({median / base:.3f}x)")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, the first the baseline: {MODES}")
    p.add_argument("--blocks", type=int, default=6, help="rounds over the modes")
    p.add_argument("--steps", type=int, default=20, help="steps per mode per round")
    p.add_argument("--port", type=int, default=29571)
    args = p.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    problem = (
        f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}"
        if unknown
        else "needs 2 cores, one for each rank"
        if len(os.sched_getaffinity(0)) < 2
        else "--blocks and --steps must be at least 1"
        if min(args.blocks, args.steps) < 1
        else None
    )
    if problem:
        print(f"compute_after_waits.py: {problem}", file=sys.stderr)
        sys.exit(2)
    mp.spawn(rank_loop, args=(args.port, modes, args.blocks, args.steps), nprocs=2)


if __name__ == "__main__":
    main()
