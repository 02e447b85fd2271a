"""Inter-model parallelism: the same 8-trial sweep with -j 2 and with -j 1, side by side.

Each trial trains the tutorial CNN on the bundled CIFAR-10 subset (5,000 images) for 2 epochs at
one of 8 learning rates. Runs alternate (-j 2, -j 1, -j 2, ...) because this machine is shared and
noisy; the report quotes medians. Two walls per sweep: the command's (what the user waits for,
including imports, plots and the report) and the trials' (first trial launched to last trial
done). Per-trial overhead is launch to first training step, from each trial's metrics.jsonl.

    .venv/bin/python benchmarks/sweep_parallel.py --repeats 3
    .venv/bin/python benchmarks/sweep_parallel.py --repeats 3 --threads-per-worker 1   # 1 core per trial in both
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
SPACE = {
    "algorithm": "grid",
    "parameters": {"lr": {"type": "float", "min": 0.005, "max": 0.08, "scalingType": "loguniform"}},
    "spec": {"metric": "val_accuracy", "objective": "maximize", "gridSize": 8},
}


def run(jobs: int, args: argparse.Namespace, scratch: Path) -> dict:
    out = scratch / f"j{jobs}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        str(BIN / "paratrain"),
        "sweep",
        str(scratch / "space.json"),
        "-j",
        str(jobs),
        "--out",
        str(out),
        "--workload",
        "cifar10-cnn",
        "--epochs",
        str(args.epochs),
        "--batch-size",
        "64",
        "--pruner",
        "none",
        "--quiet",
    ]
    if args.threads_per_worker:
        cmd += ["--threads-per-worker", str(args.threads_per_worker)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    command_s = time.perf_counter() - started
    trials = json.loads((out / "sweep.json").read_text())["trials"]
    assert len(trials) == 8 and all(t["state"] == "COMPLETE" for t in trials), [t["reason"] for t in trials]
    overheads = sorted(t["launch_overhead_s"] for t in trials)
    return {
        "command_s": command_s,
        "trials_s": max(t["ended_at"] for t in trials) - min(t["started_at"] for t in trials),
        "overheads": overheads,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--threads-per-worker", type=int, help="pin every trial to this many threads (default: all its cores)"
    )
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="paratrain-sweep-bench-"))
    (scratch / "space.json").write_text(json.dumps(SPACE))
    results: dict[int, list[dict]] = {2: [], 1: []}
    try:
        for repeat in range(args.repeats):
            for jobs in (2, 1):
                r = run(jobs, args, scratch)
                results[jobs].append(r)
                print(
                    f"repeat {repeat + 1} -j {jobs}: command {r['command_s']:.1f} s, trials {r['trials_s']:.1f} s, "
                    f"overhead per trial median {statistics.median(r['overheads']):.2f} s "
                    f"(first {r['overheads'][-1]:.2f} s: the fork server importing torch once)",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {j: {k: statistics.median(r[k] for r in results[j]) for k in ("command_s", "trials_s")} for j in results}
    overheads = [o for j in results for r in results[j] for o in r["overheads"]]
    print(f"\nmedians over {args.repeats} alternating runs of 8 trials:")
    for j in (1, 2):
        print(f"  -j {j}: command {med[j]['command_s']:.1f} s, trials {med[j]['trials_s']:.1f} s")
    print(
        f"  wall ratio -j 2 / -j 1: trials {med[2]['trials_s'] / med[1]['trials_s']:.3f}, "
        f"command {med[2]['command_s'] / med[1]['command_s']:.3f}  (target <= 0.56)"
    )
    print(
        f"  launch to first step per trial: median {statistics.median(overheads):.2f} s, "
        f"mean {statistics.mean(overheads):.2f} s, max {max(overheads):.2f} s  (target <= 2 s)"
    )


if __name__ == "__main__":
    main()
