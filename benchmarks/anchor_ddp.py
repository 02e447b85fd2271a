"""paratrain against the hand-written DDP loop (../shared/anchors/raw_ddp.py), side by side.

paratrain runs twice at 2 workers: with its default gradient averaging (shared memory between CPU
ranks, `--allreduce auto`) and through gloo like the anchor (`--allreduce backend`).

Same workload for both: the tutorial CNN on 20,000 CIFAR-10 training images, batch 128 per worker,
3 epochs, SGD with momentum; throughput over the epochs after the first. Runs alternate
(paratrain, anchor, paratrain, anchor, ...) because this machine is shared and noisy; the report
quotes medians and ratios, never a single absolute time.

    .venv/bin/python benchmarks/anchor_ddp.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ANCHORS = SHARED / "anchors"
ARCHIVE = SHARED / "datasets" / "cifar10-jpg.tar.gz"
BIN = Path(sys.executable).parent


def _stdout(cmd: list[str], **kwargs) -> str:
    """Run a command; one retry, because a rendezvous on a shared machine fails now and then
    (a port taken between choosing and binding it). A second failure shows the command's stderr."""
    for attempt in (1, 2):
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        if proc.returncode == 0:
            return proc.stdout
        print(f"attempt {attempt} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}", file=sys.stderr)
    raise SystemExit(f"benchmark command failed twice: {' '.join(cmd)}")


def run_paratrain(workers: int, allreduce: str, args: argparse.Namespace, scratch: Path, tag: str) -> dict:
    run_dir = scratch / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        str(BIN / "paratrain"),
        "train",
        "--workload",
        "cifar10-cnn",
        "--data-dir",
        str(ARCHIVE),
        "--workers",
        str(workers),
        "--threads-per-worker",
        "1",
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        str(args.epochs),
        "--limit-train",
        str(args.limit_train),
        "--lr",
        "0.001",
        "--allreduce",
        allreduce,
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--json",
    ]
    return json.loads(_stdout(cmd))


def run_anchor(workers: int, args: argparse.Namespace) -> float:
    common = [
        "raw_ddp.py",
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        str(args.epochs),
        "--limit-train",
        str(args.limit_train),
    ]
    if workers == 1:
        cmd = [sys.executable, *common, "--threads", "1"]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={workers}", *common]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = _stdout(cmd, cwd=ANCHORS, env=env)
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--limit-train", type=int, default=20000)
    args = p.parse_args()

    # name -> (tool, workers, paratrain's --allreduce)
    variants = {
        "paratrain-2": ("paratrain", 2, "auto"),
        "paratrain-gloo-2": ("paratrain", 2, "backend"),
        "anchor-2": ("anchor", 2, None),
        "paratrain-1": ("paratrain", 1, "auto"),
        "anchor-1": ("anchor", 1, None),
    }
    results: dict[str, list[float]] = {k: [] for k in variants}
    comm_ms: dict[str, list[float]] = {k: [] for k, v in variants.items() if v[0] == "paratrain"}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for r in range(args.repeats):
            # Alternate the variants, so drift on the machine hits all of them alike.
            for key, (tool, workers, allreduce) in variants.items():
                if tool == "paratrain":
                    summary = run_paratrain(workers, allreduce, args, scratch, f"{key}-{r}")
                    results[key].append(summary["samples_per_s"])
                    comm_ms[key].append(1000 * summary["breakdown"]["comm_s"])
                else:
                    results[key].append(run_anchor(workers, args))
                print(f"repeat {r + 1}/{args.repeats} {key:16} {results[key][-1]:9.1f} samples/s", flush=True)

    med = {k: statistics.median(v) for k, v in results.items()}
    report = {
        "workload": f"cifar10-cnn, {args.limit_train} images, batch {args.batch_size}/worker, {args.epochs} epochs, 1 "
        "core per worker",
        "repeats": args.repeats,
        "samples_per_s": {
            k: {"median": round(m, 1), "runs": [round(x, 1) for x in results[k]]} for k, m in med.items()
        },
        "exposed_comm_ms_per_step": {k: round(statistics.median(v), 2) for k, v in comm_ms.items()},
        "paratrain_vs_anchor_2_workers": round(med["paratrain-2"] / med["anchor-2"], 3),
        "paratrain_gloo_vs_anchor_2_workers": round(med["paratrain-gloo-2"] / med["anchor-2"], 3),
        "paratrain_vs_anchor_1_worker": round(med["paratrain-1"] / med["anchor-1"], 3),
        "efficiency_paratrain": round(med["paratrain-2"] / (2 * med["paratrain-1"]), 3),
        "efficiency_paratrain_gloo": round(med["paratrain-gloo-2"] / (2 * med["paratrain-1"]), 3),
        "efficiency_anchor": round(med["anchor-2"] / (2 * med["anchor-1"]), 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
