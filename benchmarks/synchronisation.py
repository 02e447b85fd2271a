"""Synchronise less, send less, wait less: every remedy of docs/synchronisation.md on one workload,
against one worker on one core (issue #13's evidence).

Each configuration trains cifar10-cnn for the same epochs with batch 32 per worker on 2 workers of
one core each (async-ps: 2 workers plus 1 server rank, 3 ranks on the 2 cores, unpinned, so the
server takes time from the workers), and the 1-worker run gives the base. The LR is given for a batch of
32 and scaled linearly with the batch each update averages (`--base-batch-size 32`), so every
configuration gets the same rule. Runs alternate (base, sync, accum, ..., base, sync, ...) because the
machine's speed drifts; repeat r runs every configuration with --seed r (the same initial model,
order and augmentation for all of them within a repeat, another across repeats: a single seed's
accuracy differs between configurations by a point or so by luck). A seed's accuracy is the same
in every run of it, so more seeds can be added later: --first-seed F makes repeat r use F + r.
Without the base in --configurations the table has no efficiency. The table gives medians of
samples/s (epochs after the first) and of test accuracy, and efficiency = samples/s / (2 x the base's),
of the medians and, in brackets, the median of each repeat's own ratio.

    .venv/bin/python benchmarks/synchronisation.py --repeats 3 -- --data-dir ../shared/datasets/cifar10-jpg.tar.gz

A trial of the script itself (not a measurement): --epochs 2 -- --limit-train 2048.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TWO = ["--workers", "2"]

# name -> the flags that make it (after the shared ones)
CONFIGURATIONS = {
    "1 worker (base)": ["--workers", "1"],
    "sync every step (ddp)": TWO,
    "--grad-accum 2": [*TWO, "--grad-accum", "2"],
    "--grad-accum 4": [*TWO, "--grad-accum", "4"],
    # Goyal et al. 2017's remedy for the larger batch: the LR ramps up to its scaled value over an epoch.
    "--grad-accum 4 --warmup-epochs 1": [*TWO, "--grad-accum", "4", "--warmup-epochs", "1"],
    "--sync-every 4": [*TWO, "--sync-every", "4"],
    "--sync-every 8": [*TWO, "--sync-every", "8"],
    # Post-local SGD as Lin et al. (2020) run it: synchronous until the model has left its first
    # steep descent (here the first epoch, 782 steps of 64), then local.
    "--sync-every 8 --sync-warmup 782": [*TWO, "--sync-every", "8", "--sync-warmup", "782"],
    "--grad-compression fp16": [*TWO, "--grad-compression", "fp16"],
    "--grad-compression powersgd": [*TWO, "--grad-compression", "powersgd"],
    "async-ps": ["--workers", "3", "--strategy", "async-ps", "--allow-oversubscribe"],
    "async-ps --max-staleness 2": [
        "--workers",
        "3",
        "--strategy",
        "async-ps",
        "--max-staleness",
        "2",
        "--allow-oversubscribe",
    ],
    "--reduce ps": [*TWO, "--reduce", "ps"],
}


def run(flags: list[str], shared: list[str], out: Path) -> dict:
    cmd = [
        str(BIN / "paratrain"),
        "train",
        "--workload",
        "cifar10-cnn",
        *flags,
        *shared,
        "--run-dir",
        str(out),
        "--quiet",
        "--json",
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    shown = " ".join(["paratrain", *(c for c in cmd[1:] if c not in ("--json", "--run-dir", str(out)))])
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"status": "failed", "error": lines[-1] if lines else "?", "command": shown}
    return {**json.loads(proc.stdout), "command": shown, "command_s": time.perf_counter() - started}


def table(results: dict[str, list[dict]]) -> str:
    base_runs = [r for r in results.get("1 worker (base)", []) if r.get("status") == "completed"]
    base = statistics.median(r["samples_per_s"] for r in base_runs) if base_runs else None
    sync = [r for r in results.get("sync every step (ddp)", []) if r.get("status") == "completed"]
    sync_accuracy = statistics.median(r["test_accuracy"] for r in sync) if sync else None
    lines = [
        "| configuration | samples/s (median; runs) | efficiency vs 1 worker (paired by repeat) | test accuracy "
        "(median; runs) | vs sync every step (median; paired by seed: mean ± standard error) | "
        "train time, all epochs | exposed comm / step | bytes sent / step / rank | path |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        done = [r for r in runs if r.get("status") == "completed"]
        if not done:
            lines.append(f"| {name} | failed: {runs[0].get('error', '?')} | | | | | | | |")
            continue
        rate = statistics.median(r["samples_per_s"] for r in done)
        accuracy = statistics.median(r["test_accuracy"] for r in done)
        workers = 1 if name.startswith("1 worker") else 2
        efficiency = f"{rate / (workers * base):.3f}" if base else "n/a"
        # The same repeat's base, run minutes apart rather than across the whole benchmark's drift.
        paired = [
            r["samples_per_s"] / (workers * b["samples_per_s"])
            for r, b in zip(runs, results.get("1 worker (base)", []))
            if r.get("status") == "completed" and b.get("status") == "completed"
        ]
        efficiency += f" ({statistics.median(paired):.3f})" if paired else ""
        versus = f"{(accuracy - sync_accuracy) * 100:+.1f} pt" if sync_accuracy is not None and workers > 1 else ""
        # The same seed's synchronous run: its mean difference, with the standard error over seeds.
        differences = [
            (r["test_accuracy"] - d["test_accuracy"]) * 100
            for r, d in zip(runs, results.get("sync every step (ddp)", []))
            if r.get("status") == "completed" and d.get("status") == "completed"
        ]
        if workers > 1 and len(differences) > 1 and name != "sync every step (ddp)":
            error = statistics.stdev(differences) / len(differences) ** 0.5
            versus += f" (paired mean {statistics.fmean(differences):+.1f} ± {error:.1f})"
        comm = statistics.median(r["breakdown"]["comm_s"] for r in done) * 1e3
        train_time = statistics.median(r["train_time_s"] for r in done)
        sent = done[-1].get("comm_bytes_per_step")
        sent_text = "/".join(f"{b / 1024:,.0f} KiB" for b in sent) if sent else "n/a"
        path = done[-1].get("allreduce") or "none"
        rates = ", ".join(f"{r['samples_per_s']:,.0f}" for r in done)
        accuracies = ", ".join(f"{r['test_accuracy']:.1%}" for r in done)
        lines.append(
            f"| {name} | {rate:,.0f} ({rates}) | {efficiency} | {accuracy:.2%} ({accuracies}) | {versus} | "
            f"{train_time:.0f} s | {comm:.2f} ms | {sent_text} | {path} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="repeat r runs with --seed FIRST_SEED + r")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.01, help="for a batch of 32, scaled linearly")
    parser.add_argument(
        "--configurations", default=",".join(CONFIGURATIONS), help="comma-separated names from the table"
    )
    parser.add_argument(
        "extra", nargs="*", help="train flags after --, e.g. --data-dir ../shared/datasets/cifar10-jpg.tar.gz"
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.configurations.split(",")]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        parser.error(
            f"unknown configuration(s) {unknown}; choose from: {', '.join(CONFIGURATIONS)} (without the base, no "
            "efficiency)"
        )
    shared = [
        "--threads-per-worker",
        "1",
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        str(args.epochs),
        "--lr",
        str(args.lr),
        "--base-batch-size",
        "32",
        "--lr-scaling",
        "linear",
        *args.extra,
    ]
    results: dict[str, list[dict]] = {n: [] for n in names}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for i, name in enumerate(names):
                summary = run(
                    [*CONFIGURATIONS[name], "--seed", str(args.first_seed + repeat)],
                    shared,
                    Path(tmp) / f"{i}-{repeat}",
                )
                results[name].append(summary)
                print(
                    f"repeat {repeat + 1} {name}: {summary.get('status')} {summary.get('samples_per_s', 0):,.0f} "
                    "samples/s, "
                    f"test accuracy {summary.get('test_accuracy', 0):.2%}, {summary.get('command_s', 0):.0f} s",
                    file=sys.stderr,
                )
    print(table(results))
    print(f"\n{args.repeats} alternating repeat(s), {time.perf_counter() - started:.0f} s in all. Commands:")
    print("\n".join(runs[0]["command"] for runs in results.values()))


if __name__ == "__main__":
    main()
