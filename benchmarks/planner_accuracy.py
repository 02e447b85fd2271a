"""Predicted against measured step time on this machine: `paratrain plan --device cpu` for 1 and 2
workers (one core each), three workloads, two batch sizes each (docs/planner.md).

Per workload, the plan is calibrated first (`--calibrate`) from two runs at a third batch size
(1 and 2 workers), which are not among the points it then predicts: the compute efficiency, the
per-step overhead and the synchronisation wait come from those, and the four points (1 and 2
workers x the two batch sizes) are predictions. Measured step time = global batch / samples per
second (the epochs after the first). Runs alternate 1, 2 workers so drift hits both alike. Long
(roughly 15-20 minutes here, estimated, not timed): run it on a quiet machine.

    .venv/bin/python benchmarks/planner_accuracy.py                     # the full table
    .venv/bin/python benchmarks/planner_accuracy.py --tiny              # a smoke run: one workload, tiny budget
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# workload -> (calibration batch, the two predicted batches, the train flags of every run)
WORKLOADS = {
    "synthetic-cnn": (48, (32, 128), ["--synthetic-samples", "8192", "--epochs", "3", "--optimizer", "sgd"]),
    "cifar10-resnet18": (24, (16, 64), ["--limit-train", "1024", "--epochs", "2", "--optimizer", "sgd"]),
    "gpt-tiny": (12, (8, 32), ["--samples-per-epoch", "384", "--eval-samples", "32", "--epochs", "2",
                               "--optimizer", "adam"]),
}
TINY = {"synthetic-cnn": (16, (8, 32), ["--synthetic-samples", "256", "--epochs", "2", "--optimizer", "sgd"])}


def train(workload: str, workers: int, batch: int, flags: list[str], out: Path) -> dict:
    cmd = [str(BIN / "paratrain"), "train", "--workload", workload, "--workers", str(workers), "--threads-per-worker", "1",
           "--batch-size", str(batch), "--lr-scaling", "none", "--run-dir", str(out), "--quiet", "--json", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    summary = json.loads(proc.stdout)
    summary["command"] = " ".join(cmd[1:])
    return summary


def plan(workload: str, batch: int, optimizer: str, calibration: list[Path]) -> tuple[dict, str]:
    cmd = [str(BIN / "paratrain"), "plan", "--workload", workload, "--device", "cpu", "--gpus", "2", "--batch-size",
           str(batch), "--strategy", "ddp", "--optimizer", optimizer, "--calibrate", *map(str, calibration), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    return json.loads(proc.stdout), " ".join(cmd[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="one small workload: checks the script, measures nothing useful")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    workloads = TINY if args.tiny else WORKLOADS
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        rows, commands = [], []
        for workload, (calibrate_batch, batches, flags) in workloads.items():
            optimizer = flags[flags.index("--optimizer") + 1]
            calibration = []
            for workers in (1, 2):
                run_dir = out / f"{workload}-calibrate-w{workers}-b{calibrate_batch}"
                summary = train(workload, workers, calibrate_batch, flags, run_dir)
                calibration.append(run_dir)
                commands.append(summary["command"])
            for batch in batches:
                predicted, plan_command = plan(workload, batch, optimizer, calibration)
                commands.append(plan_command)
                by_devices = {r["devices"]: r for r in predicted["rows"]}
                for workers in (1, 2):
                    summary = train(workload, workers, batch, flags, out / f"{workload}-w{workers}-b{batch}")
                    commands.append(summary["command"])
                    measured = summary["global_batch_size"] / summary["samples_per_s"]
                    guess = by_devices[workers]["step_time_s"]
                    rows.append((workload, workers, batch, guess, measured, summary["machine_load"]["contended"]))
        print("| workload | workers | batch per worker | predicted step (ms) | measured step (ms) | error | contended |")
        print("|---|---|---|---|---|---|---|")
        for workload, workers, batch, guess, measured, contended in rows:
            print(f"| {workload} | {workers} | {batch} | {guess * 1e3:.2f} | {measured * 1e3:.2f} | "
                  f"{(guess - measured) / measured:+.1%} | {'yes' if contended else ''} |")
        worst = max(abs(g - m) / m for *_, g, m, _c in rows)
        print(f"\nlargest error: {worst:.1%} over {len(rows)} points")
        print("\ncommands:")
        for command in commands:
            print(f"    paratrain {command}")


if __name__ == "__main__":
    main()
