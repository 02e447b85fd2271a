"""FSDP's communication that compute does not hide, planned against measured on CPU ranks (issue #59,
docs/planner.md): gpt-tiny under `--strategy fsdp` on 2 ranks (one core each) at per-rank batches 1 to 64.

Measured exposed communication = the step of fsdp on 2 ranks less the step of the same fsdp run on 1 rank
alone, two such runs at once, each pinned to one core (`taskset`): the same model, FSDP machinery, batch and
memory-bandwidth sharing, without a collective that moves a byte. Planned = `paratrain plan --device cpu
--gpus 2 --strategy fsdp --batch-size B`'s `exposed_comm_s` for the same model. Runs alternate (2 ranks, then
the two single ranks) at each batch, every batch of a repeat before the next repeat; the table gives medians.
About 8 minutes a repeat here; run it on a quiet machine.

    .venv/bin/python benchmarks/fsdp_exposed.py --repeats 3 --out RUNS
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BATCHES = (1, 2, 4, 8, 16, 32, 64)
STEPS_PER_EPOCH = 10
MODEL = ["--workload", "gpt-tiny"]


def train_cmd(workers: int, batch: int, run_dir: Path) -> list[str]:
    samples = STEPS_PER_EPOCH * batch * workers
    return [
        str(BIN / "paratrain"),
        "train",
        *MODEL,
        "--strategy",
        "fsdp",
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


def run(cmds: list[list[str]]) -> list[float]:
    """Start every command at once and return each one's step time."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for c in cmds]
    steps = []
    for cmd, proc in zip(cmds, procs):
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{err.strip()}")
        steps.append(step_s(out))
    return steps


def planned_exposed_s(batch: int) -> float:
    cmd = [str(BIN / "paratrain"), "plan", *MODEL, "--device", "cpu", "--gpus", "2", "--strategy", "fsdp"]
    cmd += ["--batch-size", str(batch), "--optimizer", "adam", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    rows = [r for r in json.loads(proc.stdout)["rows"] if r["strategy"] == "fsdp" and r["devices"] == 2]
    return rows[0]["time"]["exposed_comm_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="run directories go here")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    two: dict[int, list[float]] = {b: [] for b in batches}
    alone: dict[int, list[float]] = {b: [] for b in batches}
    for repeat in range(args.repeats):
        for batch in batches:
            base = args.out / f"b{batch}-r{repeat}"
            two[batch] += run([train_cmd(2, batch, base / "fsdp2")])
            pinned = [["taskset", "-c", str(core), *train_cmd(1, batch, base / f"alone{core}")] for core in (0, 1)]
            alone[batch].append(statistics.mean(run(pinned)))
            print(
                f"repeat {repeat + 1} batch {batch}: 2 ranks {two[batch][-1] * 1e3:.1f} ms, "
                f"alone {alone[batch][-1] * 1e3:.1f} ms",
                flush=True,
            )
    print(
        "\n| per-rank batch | step, 2 ranks (ms) | step, alone (ms) | exposed, measured (ms) | planned (ms) | error |"
    )
    print("|---|---|---|---|---|---|")
    for batch in batches:
        measured = statistics.median(two[batch]) - statistics.median(alone[batch])
        planned = planned_exposed_s(batch)
        print(
            f"| {batch} | {statistics.median(two[batch]) * 1e3:.1f} | {statistics.median(alone[batch]) * 1e3:.1f} | "
            f"{measured * 1e3:.1f} | {planned * 1e3:.1f} | {(planned / measured - 1) * 100:+.0f} % |"
        )


if __name__ == "__main__":
    main()
