"""Predicted against measured step time on this machine: `paratrain plan --device cpu` for 1 and 2
workers (one core each), three workloads, two batch sizes each (docs/planner.md).

Per workload, the plan is calibrated first (`--calibrate`) from runs at two other batch sizes (1
and 2 workers each), which are not among the points it then predicts: the compute efficiency and
fixed compute per step, the per-step overhead and the synchronisation wait come from those, and
the four points (1 and 2 workers x the two batch sizes) are predictions. Measured step time =
global batch / samples per second (the epochs after the first). Runs alternate 1, 2 workers so
drift hits both alike; with --repeats R every run is made R times in turn (all runs of a repeat,
then the next repeat), the calibration uses all of them, and the table gives the median measured
step. Long (about 15 minutes a repeat here): run it on a quiet machine.

    .venv/bin/python benchmarks/planner_accuracy.py --repeats 3         # the full table
    .venv/bin/python benchmarks/planner_accuracy.py --tiny --repeats 1  # a smoke run: one workload, tiny budget
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

# workload -> (the two calibration batches, the two predicted batches, the train flags of every run)
WORKLOADS = {
    "synthetic-cnn": ((24, 64), (32, 128), ["--synthetic-samples", "8192", "--epochs", "3", "--optimizer", "sgd"]),
    "cifar10-resnet18": ((12, 32), (16, 64), ["--limit-train", "768", "--epochs", "2", "--optimizer", "sgd"]),
    "gpt-tiny": (
        (6, 16),
        (8, 32),
        ["--samples-per-epoch", "384", "--eval-samples", "32", "--epochs", "2", "--optimizer", "adam"],
    ),
}
TINY = {"synthetic-cnn": ((8, 16), (12, 32), ["--synthetic-samples", "256", "--epochs", "2", "--optimizer", "sgd"])}


def train(workload: str, workers: int, batch: int, flags: list[str], out: Path) -> dict:
    cmd = [
        str(BIN / "paratrain"),
        "train",
        "--workload",
        workload,
        "--workers",
        str(workers),
        "--threads-per-worker",
        "1",
        "--batch-size",
        str(batch),
        "--lr-scaling",
        "none",
        "--run-dir",
        str(out),
        "--quiet",
        "--json",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    summary = json.loads(proc.stdout)
    summary["command"] = " ".join(cmd[1:])
    return summary


def plan(workload: str | list[str], optimizer: str, calibration: list[Path], flags: list[str]) -> tuple[dict, str]:
    """`paratrain plan --device cpu --gpus 2` of the workload with `flags`, calibrated from the runs; a list is the
    plan's model flags themselves (`--model FACTORY`)."""
    model = workload if isinstance(workload, list) else ["--workload", workload]
    cmd = [str(BIN / "paratrain"), "plan", *model, "--device", "cpu", "--gpus", "2", *flags]
    cmd += ["--optimizer", optimizer, "--calibrate", *map(str, calibration), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    return json.loads(proc.stdout), " ".join(cmd[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tiny", action="store_true", help="one small workload: checks the script, measures nothing useful"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of every point, in turn; the median counts")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    workloads = TINY if args.tiny else WORKLOADS
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        # (workload, workers, batch) -> measured summaries; commands of the first repeat
        measured: dict[tuple[str, int, int], list[dict]] = {}
        commands: list[str] = []
        for repeat in range(args.repeats):
            for workload, (calibrate_batches, batches, flags) in workloads.items():
                for batch in (*calibrate_batches, *batches):
                    for workers in (1, 2):
                        run_dir = out / f"{workload}-w{workers}-b{batch}-r{repeat}"
                        summary = train(workload, workers, batch, flags, run_dir)
                        summary["_dir"] = run_dir
                        measured.setdefault((workload, workers, batch), []).append(summary)
                        if repeat == 0:
                            commands.append(summary["command"])
                        print(
                            f"repeat {repeat + 1} {workload} w{workers} b{batch}: "
                            f"{summary['global_batch_size'] / summary['samples_per_s'] * 1e3:.2f} ms a step",
                            file=sys.stderr,
                        )
        rows = []
        for workload, (calibrate_batches, batches, flags) in workloads.items():
            optimizer = flags[flags.index("--optimizer") + 1]
            calibration = [s["_dir"] for b in calibrate_batches for w in (1, 2) for s in measured[(workload, w, b)]]
            for batch in batches:
                flags = ["--batch-size", str(batch), "--strategy", "ddp"]
                predicted, plan_command = plan(workload, optimizer, calibration, flags)
                commands.append(plan_command.replace(str(out), "RUNS"))
                by_devices = {r["devices"]: r for r in predicted["rows"]}
                for workers in (1, 2):
                    runs = measured[(workload, workers, batch)]
                    steps = [s["global_batch_size"] / s["samples_per_s"] for s in runs]
                    rows.append(
                        (
                            workload,
                            workers,
                            batch,
                            by_devices[workers]["step_time_s"],
                            statistics.median(steps),
                            steps,
                            any(s["machine_load"]["contended"] for s in runs),
                        )
                    )
        print(
            "| workload | workers | batch per worker | predicted step (ms) | measured step (ms), median (runs) | error "
            "| contended |"
        )
        print("|---|---|---|---|---|---|---|")
        for workload, workers, batch, guess, median, steps, contended in rows:
            shown = ", ".join(f"{t * 1e3:.2f}" for t in steps)
            print(
                f"| {workload} | {workers} | {batch} | {guess * 1e3:.2f} | {median * 1e3:.2f} ({shown}) | "
                f"{(guess - median) / median:+.1%} | {'yes' if contended else ''} |"
            )
        worst = max(abs(g - m) / m for _w, _n, _b, g, m, *_ in rows)
        print(f"\nlargest error: {worst:.1%} over {len(rows)} points, {args.repeats} repeat(s)")
        print("\ncommands (RUNS: the run directories above):")
        for command in commands:
            print(f"    paratrain {command.replace(str(out), 'RUNS')}")


if __name__ == "__main__":
    main()
