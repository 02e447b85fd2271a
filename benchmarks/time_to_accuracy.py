"""Time to accuracy: the seed article's best setting against `paratrain recommend` on 2 workers
(docs/batch-size.md).

1. The reference: cifar10-cnn with batch 8, LR 0.001, 10 epochs, one process (the Comet article's
   best generalising setting), on every core.
2. `paratrain recommend --workers 2` measures find-batch, noise-scale and lr-find and prints its
   `paratrain train` command; that command runs with the same --epochs.
3. The table: each run's global batch, LR, final test accuracy, wall time, and the training time at
   which it first reached the reference's final test accuracy (from the per-epoch evaluations in
   metrics.jsonl), plus what the measurements themselves cost.

    .venv/bin/python benchmarks/time_to_accuracy.py --out /tmp/tta -- --data-dir ../shared/datasets/cifar10-jpg.tar.gz

A tiny budget to check that it runs (bundled subset, 1 epoch, short measurements):

    .venv/bin/python benchmarks/time_to_accuracy.py --out /tmp/tta-tiny --epochs 1 --noise-steps 20 \\
        --lr-steps 20 --max-batch 64 -- --limit-train 1000
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARATRAIN = str(Path(sys.executable).parent / "paratrain")


def run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    print("$ " + shlex.join(cmd), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {done.stderr.strip()}")
    return done, time.perf_counter() - started


def time_to_reach(run_dir: Path, target: float) -> float | None:
    """Training seconds (from the ranks' start) at the end of the first epoch whose test accuracy >= target."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    ends = {e["epoch"]: e["time_end"] for e in events if e["event"] == "epoch"}
    for e in events:
        if e["event"] == "eval" and e["split"] == "test" and e["accuracy"] >= target:
            return ends[e["epoch"]]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--noise-steps", type=int, default=200)
    parser.add_argument("--lr-steps", type=int, default=100)
    parser.add_argument(
        "--max-batch", type=int, default=1024, help="find-batch's largest probe (the CNN fits any batch)"
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    common = ["--workload", "cifar10-cnn", "--device", "cpu", "--epochs", str(args.epochs), *extra]

    reference_dir = args.out / "reference"
    reference_cmd = [
        PARATRAIN,
        "train",
        *common,
        "--workers",
        "1",
        "--batch-size",
        "8",
        "--lr",
        "0.001",
        "--lr-scaling",
        "none",
        "--run-dir",
        str(reference_dir),
        "--quiet",
        "--json",
    ]
    reference = json.loads(run(reference_cmd)[0].stdout)

    recommend_cmd = [
        PARATRAIN,
        "recommend",
        "--workers",
        str(args.workers),
        "--out",
        str(args.out / "recommend"),
        "--noise-steps",
        str(args.noise_steps),
        "--lr-steps",
        str(args.lr_steps),
        "--max-batch",
        str(args.max_batch),
        "--apply",
        *common,
    ]
    _done, measuring_s = run(recommend_cmd)
    recommendation = json.loads((args.out / "recommend" / "recommend.json").read_text())
    recommended_dir = args.out / "recommended"
    recommended_cmd = [*shlex.split(recommendation["command"]), "--run-dir", str(recommended_dir), "--quiet", "--json"]
    recommended_cmd[0] = PARATRAIN
    recommended = json.loads(run(recommended_cmd)[0].stdout)

    target = reference["test_accuracy"]
    rows: list[tuple[str, dict[str, Any], float | None]] = [
        ("reference (batch 8, lr 0.001, 1 process)", reference, time_to_reach(reference_dir, target)),
        (f"recommended ({args.workers} workers)", recommended, time_to_reach(recommended_dir, target)),
    ]
    print(f"recommend (find-batch, noise-scale, lr-find) took {measuring_s:.0f} s:")
    for key in ("per_worker_batch", "global_batch", "lr", "warmup_epochs", "schedule", "optimizer"):
        print(f"- {key.replace('_', ' ')}: {recommendation[key]['value']} ({recommendation[key]['source']})")
    print()
    print(
        "| run | global batch | LR | epochs | test accuracy | wall time | training time to the reference's accuracy |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, s, reach in rows:
        reached = f"{reach:.0f} s" if reach is not None else "not reached"
        print(
            f"| {name} | {s['global_batch_size']} | {s['lr']:.4g} | {s['epochs_run']} | {s['test_accuracy']:.2%} | "
            f"{s['wall_time_s']:.0f} s | {reached} |"
        )
    print("\ncommands:")
    for cmd in (reference_cmd, recommend_cmd, recommended_cmd):
        print("    " + shlex.join(["paratrain", *cmd[1:]]))


if __name__ == "__main__":
    main()
