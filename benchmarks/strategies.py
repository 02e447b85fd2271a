"""Every strategy on one workload, side by side: throughput, memory per rank, loss after a fixed
budget (docs/strategies.md).

Each strategy trains the same workload for the same number of epochs with the same global batch
(the per-worker batch is doubled for strategies whose ranks share one batch: pipeline,
model-parallel and tp; hybrid, fsdp-tp, hsdp, pp-fsdp and pp-tp need 4 ranks, pp-fsdp-tp 8, and run
oversubscribed on this 2-core machine, so their speed is shown but not comparable). Runs alternate
across repeats (single, ddp, zero1, ..., single, ddp, ...) because the machine's speed drifts; the
table gives medians, memory the largest rank's.

    .venv/bin/python benchmarks/strategies.py --workload gpt-small --repeats 3
    .venv/bin/python benchmarks/strategies.py --workload cifar10-resnet50v2 --repeats 1 \\
        -- --data-dir ../shared/datasets/cifar10-jpg.tar.gz --limit-train 1024

`--memory-limit SIZE` adds the "does not fit" demonstration: ddp, fsdp and pipeline on 2 ranks, each
rank bounded to SIZE; prints which ran and the error of any that did not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# name -> (flags, per-worker batch multiplier: ranks of one pipeline or tensor-parallel group share a batch,
# 4-rank layouts split the same global batch over more replicas)
STRATEGIES = {
    "single": (["--workers", "1", "--strategy", "single"], 2),
    "ddp": (["--workers", "2", "--strategy", "ddp"], 1),
    "zero1": (["--workers", "2", "--strategy", "zero1"], 1),
    "fsdp": (["--workers", "2", "--strategy", "fsdp"], 1),
    "pipeline": (["--workers", "2", "--strategy", "pipeline", "--microbatches", "4"], 2),
    "model-parallel": (["--workers", "2", "--strategy", "model-parallel"], 2),
    "tp": (["--workers", "2", "--tp", "2"], 2),  # both ranks compute each batch together
    "tp-sp": (["--workers", "2", "--tp", "2", "--sequence-parallel"], 2),
    "tp-sp-lp": (["--workers", "2", "--tp", "2", "--sequence-parallel", "--loss-parallel"], 2),
    # 4 ranks, oversubscribed here: FSDP over 2 tensor-parallel groups; 2 replicas of a 2-way FSDP shard
    "fsdp-tp": (["--workers", "4", "--strategy", "fsdp", "--tp", "2", "--allow-oversubscribe"], 1),
    "hsdp": (["--workers", "4", "--strategy", "fsdp", "--dp-replicate", "2", "--allow-oversubscribe"], 0.5),
    # the pipeline's stages composed (4 and 8 ranks, oversubscribed): sharded over 2 replicas of 4 windows
    # (PP x FSDP), split over 2 ranks in one pipeline of the whole batch (PP x TP), both (torchtitan's 3-D)
    "pp-fsdp": (["--workers", "4", "--pp", "2", "--dp-shard", "2", "--microbatches", "2", "--allow-oversubscribe"], 1),
    "pp-tp": (["--workers", "4", "--pp", "2", "--tp", "2", "--microbatches", "2", "--allow-oversubscribe"], 2),
    "pp-fsdp-tp": (
        ["--workers", "8", "--pp", "2", "--dp-shard", "2", "--tp", "2", "--microbatches", "2", "--allow-oversubscribe"],
        1,
    ),
    "hybrid": (
        [
            "--workers",
            "4",
            "--strategy",
            "hybrid",
            "--dp",
            "2",
            "--stages",
            "2",
            "--microbatches",
            "2",
            "--allow-oversubscribe",
        ],
        1,
    ),
}
MEMORY = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes", "rss_peak_bytes")


def run(strategy: str, workload: str, batch: int, epochs: int, out: Path, extra: list[str]) -> dict:
    flags, multiplier = STRATEGIES[strategy]
    cmd = [
        str(BIN / "paratrain"),
        "train",
        "--workload",
        workload,
        *flags,
        "--threads-per-worker",
        "1",
        "--batch-size",
        str(int(batch * multiplier)),
        "--epochs",
        str(epochs),
        "--run-dir",
        str(out),
        "--quiet",
        "--json",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {
            "status": "failed",
            "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?",
            "command": " ".join(cmd),
        }
    return {**json.loads(proc.stdout), "command": " ".join(cmd)}


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f}" if n >= 2**20 else f"{n / 2**20:.1f}"


def table(results: dict[str, list[dict]], text: bool) -> str:
    unit = "tokens/s" if text else "samples/s"
    lines = [
        f"| strategy | {unit} | params MB | grads MB | optimizer MB | activations MB | peak RSS MB | "
        f"{'val loss' if text else 'val accuracy'} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        done = [r for r in runs if r.get("status") == "completed"]
        if not done:
            lines.append(f"| {name} | failed: {runs[0].get('error', '?')} | | | | | | |")
            continue
        rate = statistics.median(r["tokens_per_s" if text else "samples_per_s"] for r in done)
        mem = done[-1].get("memory", {})
        cells = [mb(max(mem[k])) if k in mem else "n/a" for k in MEMORY]
        quality = statistics.median(r["val_loss"] if text else r["val_accuracy"] * 100 for r in done)
        lines.append(f"| {name} | {rate:,.0f} | {' | '.join(cells)} | {quality:.2f}{'' if text else ' %'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="gpt-small")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--batch-size", type=int, default=4, help="per worker for data-parallel strategies")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-limit", help="also run ddp, fsdp and pipeline with each rank bounded to this limit")
    parser.add_argument("extra", nargs="*", help="train flags after --")
    args = parser.parse_args()
    names = args.strategies.split(",")
    text = args.workload.startswith("gpt")
    results: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in names:
                summary = run(
                    name, args.workload, args.batch_size, args.epochs, Path(tmp) / f"{name}-{repeat}", args.extra
                )
                results[name].append(summary)
                print(
                    f"repeat {repeat + 1} {name}: {summary.get('status')} "
                    f"{summary.get('tokens_per_s' if text else 'samples_per_s', 0):,.0f}/s",
                    file=sys.stderr,
                )
        print(table(results, text))
        print("\ncommands:\n" + "\n".join(runs[0]["command"] for runs in results.values()))
        if args.memory_limit:
            print(f"\nper-rank memory limit {args.memory_limit}:")
            for name in ("ddp", "fsdp", "pipeline"):
                summary = run(
                    name,
                    args.workload,
                    args.batch_size,
                    1,
                    Path(tmp) / f"limit-{name}",
                    [*args.extra, "--memory-limit", args.memory_limit],
                )
                print(
                    f"- {name}: {summary['status']}"
                    + (
                        f" ({summary['error']})"
                        if summary["status"] != "completed"
                        else f", peak RSS {mb(max(summary['memory']['rss_peak_bytes']))} MB per rank"
                    )
                    + f"\n  {summary['command']}"
                )


if __name__ == "__main__":
    main()
