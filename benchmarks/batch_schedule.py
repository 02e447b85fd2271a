"""Does a growing batch pay? `--batch-schedule adaptive` (and `warmup`) against fixed batches, time to a
target test accuracy (docs/batch-size.md, issue #30).

Every run trains the same workload for the same epochs on the same workers with the same LR rule (the
LR scaled linearly from --lr at --base-batch-size, a warm-up, a cosine decay); they differ only in the
global batch: fixed at each of --fixed, or grown from --start by the schedule up to --max-global-batch
(per-rank batch first, up to --max-batch-size). Each seed runs every configuration once, in an order
that rotates with the seed, so the machine's drift falls on all of them alike. The table gives, per
configuration, the medians and ranges over the seeds of the final test accuracy, the wall time and the
training time at which a run first reached the target (read from the per-epoch evaluations in
metrics.jsonl: the end of the first epoch whose test accuracy reached it). The target is the most
accurate fixed batch's median final accuracy less --target-margin points, unless --target is given.

    .venv/bin/python benchmarks/batch_schedule.py --out runs/batch-schedule -- \\
        --data-dir ../shared/datasets/cifar10-jpg.tar.gz

Runs already in --out are read, not run again, so an interrupted measurement goes on where it stopped.
A tiny budget to check that it runs (the bundled subset, 1 seed, 2 epochs):

    .venv/bin/python benchmarks/batch_schedule.py --out /tmp/bs-tiny --seeds 1 --epochs 2 -- --limit-train 2000
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARATRAIN = str(Path(sys.executable).parent / "paratrain")


def configurations(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each configuration's own flags: its batch, and how it grows."""
    per_rank = lambda batch: str(batch // args.workers)  # noqa: E731
    grown = ["--batch-size", per_rank(args.start), "--max-global-batch", str(args.max_global_batch)]
    grown += ["--max-batch-size", str(args.max_batch_size)]
    chosen = {f"fixed {b}": ["--batch-size", per_rank(b)] for b in args.fixed}
    chosen["adaptive"] = [*grown, "--batch-schedule", "adaptive"]
    if args.ramp_epochs:
        chosen["warmup"] = [*grown, "--batch-schedule", "warmup", "--batch-ramp-epochs", str(args.ramp_epochs)]
    return chosen


def test_accuracies(run_dir: Path) -> list[tuple[float, float]]:
    """(training seconds at the epoch's end, test accuracy after it), epoch by epoch."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    ends = {e["epoch"]: e["time_end"] for e in events if e["event"] == "epoch"}
    return [(ends[e["epoch"]], e["accuracy"]) for e in events if e["event"] == "eval" and e["split"] == "test"]


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((seconds for seconds, accuracy in curve if accuracy >= target), None)


def run(cmd: list[str], run_dir: Path) -> dict[str, Any]:
    """The run's record: its summary and its accuracy curve (read back when it ran before)."""
    record = run_dir / "benchmark.json"
    if record.exists():
        return json.loads(record.read_text())
    print("$ " + shlex.join(["paratrain", *cmd[1:]]), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {done.stderr.strip()}")
    summary = json.loads(done.stdout)
    result = {
        "command_s": time.perf_counter() - started,
        "test_accuracy": summary["test_accuracy"],
        "wall_time_s": summary["wall_time_s"],
        "steps": summary["steps"],
        "final_global_batch": (summary.get("batch_schedule") or {}).get("final_global_batch")
        or summary["global_batch_size"],
        "curve": test_accuracies(run_dir),
    }
    record.write_text(json.dumps(result))
    return result


def spread(values: list[float], fmt: str, unit: str = "") -> str:
    """The median, and the range when there is more than one value."""
    if not values:
        return "-"
    middle = format(statistics.median(values), fmt) + unit
    return middle if len(values) == 1 else f"{middle} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workload", default="cifar10-cnn")
    parser.add_argument("--fixed", type=lambda s: [int(b) for b in s.split(",")], default=[64, 128, 256, 512])
    parser.add_argument("--start", type=int, default=64, help="the growing runs' starting global batch")
    parser.add_argument("--max-global-batch", type=int, default=1024)
    parser.add_argument("--max-batch-size", type=int, default=256, help="the growing runs' largest per-rank batch")
    parser.add_argument("--ramp-epochs", type=float, default=2.0, help="the warmup ramp (0: no warmup runs)")
    # docs/batch-size.md's recommendation for cifar10-cnn on 2 workers: 0.107 at 222, a 1-epoch warm-up, cosine
    parser.add_argument("--lr", type=float, default=0.107)
    parser.add_argument("--base-batch-size", type=int, default=222)
    parser.add_argument("--target", type=float, default=None, help="test accuracy to reach (0-1)")
    parser.add_argument("--target-margin", type=float, default=1.0, help="points below the best fixed batch")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    common = [
        *("--workload", args.workload, "--device", "cpu", "--epochs", str(args.epochs)),
        *("--workers", str(args.workers), "--threads-per-worker", "1"),
        *("--lr", str(args.lr), "--base-batch-size", str(args.base_batch_size), "--lr-scaling", "linear"),
        *("--schedule", "cosine", "--warmup-epochs", "1", "--optimizer", "sgd"),
        *extra,
    ]
    chosen = configurations(args)
    names = list(chosen)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for seed in range(args.seeds):
        order = names[seed % len(names) :] + names[: seed % len(names)]  # rotated: drift falls on all alike
        for name in order:
            run_dir = args.out / name.replace(" ", "-") / f"seed{seed}"
            cmd = [PARATRAIN, "train", *common, *chosen[name], "--seed", str(seed)]
            cmd += ["--run-dir", str(run_dir), "--quiet", "--json"]
            results[name].append(run(cmd, run_dir))

    fixed = [n for n in names if n.startswith("fixed")]
    best = max(fixed, key=lambda n: statistics.median(r["test_accuracy"] for r in results[n]))
    target = args.target or statistics.median(r["test_accuracy"] for r in results[best]) - args.target_margin / 100
    print(f"{args.seeds} seeds, {args.epochs} epochs; the most accurate fixed batch: {best}; target {target:.2%}\n")
    print("| configuration | final global batch | test accuracy | wall time | training time to target | reached |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        rows = results[name]
        reach = [t for t in (time_to_reach(r["curve"], target) for r in rows) if t is not None]
        print(
            f"| {name} | {spread([r['final_global_batch'] for r in rows], '.0f')} "
            f"| {spread([100 * r['test_accuracy'] for r in rows], '.1f', ' %')} "
            f"| {spread([r['wall_time_s'] for r in rows], '.0f', ' s')} | {spread(reach, '.0f', ' s')} "
            f"| {len(reach)} of {len(rows)} |"
        )
    print("\ncommon flags: " + shlex.join(common))
    for name in names:
        print(f"{name}: " + shlex.join(chosen[name]))


if __name__ == "__main__":
    main()
