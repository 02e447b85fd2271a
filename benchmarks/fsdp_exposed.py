"""FSDP's communication that compute does not hide, planned against measured on CPU ranks (issue #59,
docs/planner.md): gpt-tiny under `--strategy fsdp` on 2 ranks (one core each) at per-rank batches 1 to 64.

Measured: the time a step each rank spends inside its collectives, timed call by call (collective_clock/, put on
the runs' PYTHONPATH: off CUDA, FSDP2's gathers and reduce-scatters block the rank, so that time is exposed),
over the timed epochs, the ranks' mean (each waits there for the other's later arrival; the step is the ranks'
mean compute plus that mean). Beside it, the
step of fsdp on 2 ranks less the step of the same fsdp run on 1 rank, two such runs at once, each pinned to one
core (`taskset`), the slower of the two (every collective waits for the slower rank): that difference also holds
the 2-rank run's FSDP work outside the collectives, and the cores' drift apart, a few per cent of a long step.
Planned = `paratrain plan --device cpu --gpus 2 --strategy fsdp --batch-size B --calibrate ...`'s `exposed_comm_s`
for the same model, its compute calibrated on the single-rank runs of the smallest and largest batch (so that the
table tests the communication alone), gloo's lines as the plan measures them (commbench, once per machine: run
this with PARATRAIN_CACHE naming an empty directory to have them measured at the end, beside the runs). Another
layout or model: `--workload`, `--train`, `--alone`, `--plan`, `--row` (below). Runs alternate (2 ranks, then
the two single ranks) at each batch, every batch of a repeat before the next repeat; the table gives medians.
About 8 minutes a repeat here; run it on a quiet machine.

    PARATRAIN_CACHE=$(mktemp -d) .venv/bin/python benchmarks/fsdp_exposed.py --repeats 2 --out RUNS

Tensor parallelism, for example, whose single ranks run `--strategy single`:

    .venv/bin/python benchmarks/fsdp_exposed.py --out RUNS --train "--strategy tp --tp 2" \\
        --alone "--strategy single" --plan "--strategy ddp --tp 2" --row tp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BATCHES = (1, 2, 4, 8, 16, 32, 64)
STEPS_PER_EPOCH = 10
CLOCK = ROOT / "benchmarks" / "collective_clock"


def train_cmd(workload: str, layout: list[str], workers: int, batch: int, run_dir: Path) -> list[str]:
    samples = STEPS_PER_EPOCH * batch * workers
    # an image workload reads random images of its shape, as many as the steps take (--samples-per-epoch is text's)
    images = [] if workload.startswith("gpt") else ["--dataset", "synthetic", "--synthetic-samples", str(samples)]
    return [
        str(BIN / "paratrain"),
        "train",
        "--workload",
        workload,
        *images,
        *layout,
        "--workers",
        str(workers),
        "--threads-per-worker",
        "1",
        "--batch-size",
        str(batch),
        "--samples-per-epoch",
        str(samples),
        "--eval-samples",
        "8",
        "--epochs",
        "3",
        "--optimizer",
        "adam",
        "--lr-scaling",
        "none",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--json",
    ]


def step_s(stdout: str) -> float:
    summary = json.loads(stdout)
    return summary["global_batch_size"] / summary["samples_per_s"]


def run(cmds: list[list[str]], env: dict[str, str] | None = None) -> list[float]:
    """Start every command at once and return each one's step time."""
    env = {**os.environ, **(env or {})}
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env) for c in cmds
    ]
    steps = []
    for cmd, proc in zip(cmds, procs):
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{err.strip()}")
        steps.append(step_s(out))
    return steps


def clocked(run_dir: Path, clock: Path) -> list[float]:
    """Seconds a step each rank spent inside collectives in the timed epochs (all but the first), from
    collective_clock's records of the run (its sitecustomize.py: why that time is the exposed communication)."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    origin = next(e["unix_time"] - e["time"] for e in events if e["event"] == "start")
    epochs = [e for e in events if e["event"] == "epoch" and e["epoch"] > 0]
    windows = [(origin + e["time_start"], origin + e["time_end"]) for e in epochs]
    steps = (
        sum(e["epoch_samples"] for e in epochs)
        / json.loads((run_dir / "summary.json").read_text())["global_batch_size"]
    )
    per_rank = []
    for path in sorted(clock.glob("rank*.jsonl")):
        calls = [json.loads(line) for line in path.read_text().splitlines()]
        inside = sum(c["seconds"] for c in calls if any(a <= c["unix"] < b for a, b in windows))
        per_rank.append(inside / steps)
    return per_rank


def planned_exposed_s(args: argparse.Namespace, batch: int, calibration: list[Path]) -> float:
    """The plan's exposed communication for the layout's row on 2 CPU ranks, its compute calibrated on the
    single-rank runs (`calibration`), so that the comparison is of the communication alone."""
    cmd = [str(BIN / "paratrain"), "plan", "--workload", args.workload, "--device", "cpu", "--gpus", "2"]
    cmd += [*args.plan.split(), "--batch-size", str(batch), "--optimizer", "adam", "--json"]
    cmd += ["--calibrate", *map(str, calibration)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    rows = [r for r in json.loads(proc.stdout)["rows"] if r["strategy"] == args.row and r["devices"] == 2]
    return rows[0]["time"]["exposed_comm_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="run directories go here")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--workload", default="gpt-tiny")
    parser.add_argument("--train", default="--strategy fsdp", help="the layout's flags for train on 2 ranks")
    parser.add_argument("--alone", default=None, help="the single-rank runs' flags (default: --train's)")
    parser.add_argument("--plan", default="--strategy fsdp", help="the layout's flags for plan")
    parser.add_argument("--row", default="fsdp", help="the plan's row of the layout")
    args = parser.parse_args()
    layout, single_layout = args.train.split(), (args.alone or args.train).split()
    batches = [int(b) for b in args.batches.split(",")]
    two: dict[int, list[float]] = {b: [] for b in batches}
    alone: dict[int, list[float]] = {b: [] for b in batches}
    inside: dict[int, list[float]] = {b: [] for b in batches}
    for repeat in range(args.repeats):
        for batch in batches:
            base = args.out / f"b{batch}-r{repeat}"
            (base / "clock").mkdir(parents=True, exist_ok=True)
            clock = {"PYTHONPATH": str(CLOCK), "PARATRAIN_COLLECTIVE_CLOCK": str(base / "clock")}
            two[batch] += run([train_cmd(args.workload, layout, 2, batch, base / "fsdp2")], clock)
            # the ranks' mean time in collectives: each waits there for the other's later arrival, and the step
            # is the ranks' mean compute plus it
            ranks = clocked(base / "fsdp2", base / "clock")
            inside[batch].append(statistics.fmean(ranks))
            pinned = [
                ["taskset", "-c", str(core), *train_cmd(args.workload, single_layout, 1, batch, base / f"alone{core}")]
                for core in (0, 1)
            ]
            cores = run(pinned)
            # every collective waits for the slower rank, so the run of 2 goes at the pace of the slower core
            alone[batch].append(max(cores))
            print(
                f"repeat {repeat + 1} batch {batch}: 2 ranks {two[batch][-1] * 1e3:.1f} ms, in collectives "
                f"{' and '.join(f'{r * 1e3:.1f}' for r in ranks)} ms; "
                f"alone {' and '.join(f'{c * 1e3:.1f}' for c in cores)} ms",
                flush=True,
            )
    print(
        "\n| per-rank batch | step, 2 ranks (ms) | step, alone (ms) | 2 ranks less alone (ms) "
        "| in collectives, measured (ms) | planned (ms) | error |"
    )
    print("|---|---|---|---|---|---|---|")
    calibration = [args.out / f"b{batches[0]}-r0" / "alone0", args.out / f"b{batches[-1]}-r0" / "alone0"]
    for batch in batches:
        step, single = statistics.median(two[batch]), statistics.median(alone[batch])
        measured, planned = statistics.median(inside[batch]), planned_exposed_s(args, batch, calibration)
        print(
            f"| {batch} | {step * 1e3:,.1f} | {single * 1e3:,.1f} | {(step - single) * 1e3:.1f} | {measured * 1e3:.1f} "
            f"| {planned * 1e3:.1f} | {(planned / measured - 1) * 100:+.0f} % |"
        )


if __name__ == "__main__":
    main()
