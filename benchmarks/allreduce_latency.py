"""How long two CPU ranks take to average a gradient: gloo's all-reduce against shared memory.

Two ranks, one core each (pinned after the process group exists, as paratrain does), average a
flat float32 tensor of the tutorial CNN's gradient size (248 KB) many times, in two patterns:
- back to back: the pure cost of one average when both ranks are already waiting;
- after compute: each rank first runs ~`--compute-ms` of matrix products (a training step's
  forward/backward), so the average starts when the slower rank arrives and gloo's I/O threads
  have been asleep. The time is measured from the *later* rank's arrival (both ranks' clock
  stamps are exchanged afterwards), so waiting for the slower rank is not counted.

    .venv/bin/python benchmarks/allreduce_latency.py --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paratrain.engine.shm_allreduce import open_shared_average


def _rank(rank: int, args: argparse.Namespace, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank]])
    torch.set_num_threads(1)
    shm = open_shared_average(rank, 2)
    grads = torch.randn(args.numel)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    reps = max(1, round(args.compute_ms / 0.6))  # ~0.6 ms per 256x256 matmul on one core here

    def gloo_average(t: torch.Tensor) -> None:
        dist.all_reduce(t.div_(2))

    results = {}
    for name, average in (("gloo", gloo_average), ("shm", shm.average_)):
        for pattern in ("back_to_back", "after_compute"):
            arrive, done = [], []
            for _ in range(args.steps):
                if pattern == "after_compute":
                    for _ in range(reps):
                        a @ b
                arrive.append(time.perf_counter())
                average(grads)
                done.append(time.perf_counter())
            # Both ranks' stamps, on one machine's monotonic clock: time from the later arrival.
            stamps = [None, None]
            dist.all_gather_object(stamps, (arrive, done))
            after_last = [max(stamps[0][0][i], stamps[1][0][i]) for i in range(args.steps)]
            spans = [1000 * (done[i] - after_last[i]) for i in range(args.steps)]
            results[f"{name}/{pattern}"] = {
                "median_ms": round(statistics.median(spans), 3),
                "mean_ms": round(statistics.fmean(spans), 3),
            }
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument(
        "--numel", type=int, default=62006, help="floats to average (the tutorial CNN has 62,006 parameters)"
    )
    p.add_argument("--compute-ms", type=float, default=10.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.start_processes(_rank, args=(args, os.path.join(tmp, "store"), out), nprocs=2, start_method="spawn")
        with open(out) as f:
            results = json.load(f)
    print(json.dumps({"numel": args.numel, "steps": args.steps, "compute_ms": args.compute_ms, **results}, indent=2))


if __name__ == "__main__":
    main()
