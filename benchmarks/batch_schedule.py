"""Does a growing batch pay? `--batch-schedule adaptive` (and `warmup`) against fixed batches, time to a
held-out target (docs/batch-size.md, issue #30).

Every run trains the same workload for the same epochs on the same workers with the same LR rule (the
LR scaled from --lr at --base-batch-size by --lr-scaling, a warm-up, a cosine decay); they differ only in
the global batch: fixed at each of --fixed, or grown from --start by the schedule up to --max-global-batch
(per-rank batch first, up to --max-batch-size). Each seed runs every configuration once, in an order
that rotates with the seed, so the machine's drift falls on all of them alike. The table gives, per
configuration, the medians and ranges over the seeds of the final held-out value (test accuracy, or
bits per byte for text), the wall time and the training time at which a run first reached the target
(read from the per-epoch evaluations in metrics.jsonl: the end of the first epoch that reached it). The
target is the best fixed batch's median final value less --target-margin (1 point of accuracy, 0.02
bits per byte), unless --target is given.

    .venv/bin/python benchmarks/batch_schedule.py --out runs/batch-schedule -- \\
        --data-dir ../shared/datasets/cifar10-jpg.tar.gz

Runs already in --out are read, not run again, so an interrupted measurement goes on where it stopped.
A tiny budget to check that it runs (the bundled subset, 1 seed, 2 epochs):

    .venv/bin/python benchmarks/batch_schedule.py --out /tmp/bs-tiny --seeds 1 --epochs 2 -- --limit-train 2000

On text (gpt-small, held-out bits per byte, Adam with its square-root LR rule; docs/batch-size.md's table,
about 8 minutes a run here):

    .venv/bin/python benchmarks/batch_schedule.py --out runs/batch-schedule-gpt --workload gpt-small \\
        --metric bits-per-byte --fixed 8,16,32 --start 8 --max-batch-size 32 --max-global-batch 128 \\
        --ramp-epochs 0 --seeds 3 --epochs 5 --optimizer adamw --lr-scaling sqrt --lr 1e-3 \\
        --base-batch-size 16 -- --samples-per-epoch 928 --eval-samples 256
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from paratrain.reporting.verdict import batch_schedule_line

ROOT = Path(__file__).resolve().parents[1]
PARATRAIN = str(Path(sys.executable).parent / "paratrain")


def configurations(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each configuration's own flags: its batch, and how it grows."""
    per_rank = lambda batch: str(batch // args.workers)  # noqa: E731
    grown = ["--batch-size", per_rank(args.start), "--max-global-batch", str(args.max_global_batch)]
    grown += ["--max-batch-size", str(args.max_batch_size)]
    chosen = {f"fixed {b}": ["--batch-size", per_rank(b)] for b in args.fixed}
    if args.adaptive:
        chosen["adaptive"] = [*grown, "--batch-schedule", "adaptive"]
    if args.ramp_epochs:
        chosen["warmup"] = [*grown, "--batch-schedule", "warmup", "--batch-ramp-epochs", str(args.ramp_epochs)]
    for variant in args.variant:  # NAME=FLAGS: later flags override the common ones
        name, _, flags = variant.partition("=")
        chosen[name] = shlex.split(flags)
    return chosen


def held_out_curve(run_dir: Path, metric: str) -> list[tuple[float, float]]:
    """(training seconds at the epoch's end, the held-out metric after it), epoch by epoch; bits per byte
    are the test loss in nats over ln 2 (the text workloads' loss is per byte)."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    ends = {e["epoch"]: e["time_end"] for e in events if e["event"] == "epoch"}
    value = (lambda e: e["accuracy"]) if metric == "accuracy" else (lambda e: e["loss"] / math.log(2))
    return [(ends[e["epoch"]], value(e)) for e in events if e["event"] == "eval" and e["split"] == "test"]


def better(metric: str, value: float, target: float) -> bool:
    return value >= target if metric == "accuracy" else value <= target


def time_to_reach(curve: list[tuple[float, float]], target: float, metric: str) -> float | None:
    return next((seconds for seconds, value in curve if better(metric, value, target)), None)


def run(cmd: list[str], run_dir: Path, metric: str) -> dict[str, Any]:
    """The run's record: its summary and its accuracy curve (read back when it ran before)."""
    record = run_dir / "benchmark.json"
    if record.exists():
        kept = json.loads(record.read_text())
        return {"final": kept["curve"][-1][1], **kept}  # records of the first version lack `final`
    print("$ " + shlex.join(["paratrain", *cmd[1:]]), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {done.stderr.strip()}")
    summary = json.loads(done.stdout)
    curve = held_out_curve(run_dir, metric)
    result = {
        "command_s": time.perf_counter() - started,
        "final": curve[-1][1],
        "wall_time_s": summary["wall_time_s"],
        "steps": summary["steps"],
        "final_global_batch": (summary.get("batch_schedule") or {}).get("final_global_batch")
        or summary["global_batch_size"],
        "curve": curve,
        "batch_schedule": summary.get("batch_schedule"),  # a growing batch's last reading: why it stopped
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
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the seeds run are --first-seed, ... (to add seeds to a measurement)"
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workload", default="cifar10-cnn")
    parser.add_argument("--fixed", type=lambda s: [int(b) for b in s.split(",")], default=[64, 128, 256, 512])
    parser.add_argument("--start", type=int, default=64, help="the growing runs' starting global batch")
    parser.add_argument(
        "--no-adaptive",
        dest="adaptive",
        action="store_false",
        help="no adaptive runs: the fixed batches (and any --variant) only, to add a batch to a sweep",
    )
    parser.add_argument("--max-global-batch", type=int, default=1024)
    parser.add_argument("--max-batch-size", type=int, default=256, help="the growing runs' largest per-rank batch")
    parser.add_argument("--ramp-epochs", type=float, default=2.0, help="the warmup ramp (0: no warmup runs)")
    # docs/batch-size.md's recommendation for cifar10-cnn on 2 workers: 0.107 at 222, a 1-epoch warm-up, cosine
    parser.add_argument("--lr", type=float, default=0.107)
    parser.add_argument("--base-batch-size", type=int, default=222)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="another configuration, NAME=FLAGS (e.g. an adaptive run with another LR rule); repeatable",
    )
    parser.add_argument("--metric", choices=("accuracy", "bits-per-byte"), default="accuracy")
    parser.add_argument("--target", type=float, default=None, help="held-out value to reach (accuracy 0-1)")
    parser.add_argument(
        "--target-margin",
        type=float,
        default=None,
        help="how far short of the best fixed batch the target is (default: 1 point of accuracy, 0.02 bits/byte)",
    )
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--lr-scaling", default="linear")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    common = [
        *("--workload", args.workload, "--device", "cpu", "--epochs", str(args.epochs)),
        *("--workers", str(args.workers), "--threads-per-worker", "1"),
        *("--lr", str(args.lr), "--base-batch-size", str(args.base_batch_size), "--lr-scaling", args.lr_scaling),
        *("--schedule", "cosine", "--warmup-epochs", "1", "--optimizer", args.optimizer),
        *extra,
    ]
    chosen = configurations(args)
    names = list(chosen)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for seed in seeds:
        order = names[seed % len(names) :] + names[: seed % len(names)]  # rotated: drift falls on all alike
        for name in order:
            run_dir = args.out / name.replace(" ", "-") / f"seed{seed}"
            cmd = [PARATRAIN, "train", *common, *chosen[name], "--seed", str(seed)]
            cmd += ["--run-dir", str(run_dir), "--quiet", "--json"]
            results[name].append(run(cmd, run_dir, args.metric))

    fixed = [n for n in names if n.startswith("fixed")]
    accuracy = args.metric == "accuracy"
    finals = {n: statistics.median(r["final"] for r in results[n]) for n in fixed}
    best = max(fixed, key=finals.get) if accuracy else min(fixed, key=finals.get)
    margin = args.target_margin if args.target_margin is not None else (1.0 if accuracy else 0.02)
    target = args.target or (finals[best] - margin / 100 if accuracy else finals[best] + margin)
    shown = f"{target:.2%}" if accuracy else f"{target:.3f} bits/byte"
    print(f"seeds {seeds.start}-{seeds.stop - 1}, {args.epochs} epochs; the best fixed batch: {best}; target {shown}\n")
    print(
        f"| configuration | final global batch | held-out {args.metric} | wall time | training time to target "
        "| reached |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    scale, fmt, unit = (100, ".1f", " %") if accuracy else (1, ".3f", "")
    for name in names:
        rows = results[name]
        reach = [t for t in (time_to_reach(r["curve"], target, args.metric) for r in rows) if t is not None]
        print(
            f"| {name} | {spread([r['final_global_batch'] for r in rows], '.0f')} "
            f"| {spread([scale * r['final'] for r in rows], fmt, unit)} "
            f"| {spread([r['wall_time_s'] for r in rows], '.0f', ' s')} | {spread(reach, '.0f', ' s')} "
            f"| {len(reach)} of {len(rows)} |"
        )
    # Seed by seed, so that seeds measured on another day can join these in a median (each seed's runs share
    # an hour of the machine; its configurations compare within it).
    print("\n| seed | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for index, seed in enumerate(seeds):
        cells = []
        for name in names:
            r = results[name][index]
            reached = time_to_reach(r["curve"], target, args.metric)
            cells.append(
                f"{format(scale * r['final'], fmt)}, {r['wall_time_s']:.0f} s, "
                + ("-" if reached is None else f"{reached:.0f} s")
            )
        print(f"| {seed} | " + " | ".join(cells) + " |")
    for name in names:
        for seed, r in zip(seeds, results[name]):
            said = batch_schedule_line(r.get("batch_schedule"))  # records of earlier versions have none
            if said:
                print(f"{name}, seed {seed}: {said}")
    print("\ncommon flags: " + shlex.join(common))
    for name in names:
        print(f"{name}: " + shlex.join(chosen[name]))


if __name__ == "__main__":
    main()
