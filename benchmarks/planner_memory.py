"""What `paratrain plan` says a rank holds against what the ranks of a real run held, for every layout `train`
runs (docs/planner.md, "Memory: against the `memory` block of real runs"; issue #29).

Each layout is trained once on gpt-tiny (Adam, float32, a global batch of 8 windows of 64 bytes, 4 steps: the
memory meter reads the second) with the mesh flags `train` and `plan` share (`--dp-replicate R --dp-shard S --tp T
--pp P`), and planned with the same flags. The plan reports its heaviest rank; the run's rank compared is the one
that held the most in all (the same stage, where the stages differ). Layouts of 4 and 8 ranks run on 2 cores
(`--allow-oversubscribe`): memory does not depend on speed. About 4 minutes here.

    .venv/bin/python benchmarks/planner_memory.py [--out RUNS] [--layouts hybrid,pp+tp]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL = ["--workload", "gpt-tiny", "--seq-len", "64"]
GLOBAL_BATCH = 8
FIGURES = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes")
# name: (ranks, data-parallel replicas, the plan row's strategy, the flags train and plan share, train's only, plan's
# only). The replicas share the global batch; a tensor-parallel group and a pipeline are one replica.
LAYOUTS: dict[str, tuple[int, int, str, list[str], list[str], list[str]]] = {
    "one-rank": (1, 1, "single", [], [], ["--gpus", "1", "--strategy", "ddp"]),
    "ddp": (2, 2, "ddp", ["--dp-replicate", "2"], [], []),
    "zero1": (2, 2, "zero1", [], ["--strategy", "zero1"], ["--gpus", "2", "--strategy", "zero1"]),
    "fsdp": (2, 2, "fsdp", ["--dp-shard", "2"], [], []),
    "hsdp": (4, 4, "hsdp", ["--dp-replicate", "2", "--dp-shard", "2"], [], []),
    "tp": (2, 1, "tp", ["--tp", "2"], [], ["--gpus", "2", "--strategy", "ddp"]),
    "tp+sp": (2, 1, "tp", ["--tp", "2", "--sequence-parallel"], [], ["--gpus", "2", "--strategy", "ddp"]),
    "fsdp+tp": (4, 2, "fsdp+tp", ["--dp-shard", "2", "--tp", "2"], [], []),
    "pipeline": (2, 1, "pipeline", ["--pp", "2", "--microbatches", "4"], [], []),
    "hybrid": (4, 2, "hybrid", ["--dp-replicate", "2", "--pp", "2", "--microbatches", "2"], [], []),
    "pp+fsdp": (4, 2, "pp+fsdp", ["--dp-shard", "2", "--pp", "2", "--microbatches", "2"], [], []),
    "pp+tp": (4, 1, "pp+tp", ["--pp", "2", "--tp", "2", "--microbatches", "2"], [], []),
    "pp+fsdp+tp": (8, 2, "pp+fsdp+tp", ["--dp-shard", "2", "--pp", "2", "--tp", "2", "--microbatches", "2"], [], []),
}


def run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    return json.loads(proc.stdout)


def train(ranks: int, replicas: int, flags: list[str], out: Path) -> dict:
    cmd = [str(BIN / "paratrain"), "train", *MODEL, "--workers", str(ranks), "--threads-per-worker", "1"]
    cmd += ["--optimizer", "adam", "--samples-per-epoch", "32", "--eval-samples", "8", "--epochs", "1"]
    cmd += ["--batch-size", str(GLOBAL_BATCH // replicas), "--lr-scaling", "none", "--log-every", "1"]
    cmd += ["--run-dir", str(out), "--quiet", "--json", *flags]
    if ranks > 2:
        cmd.append("--allow-oversubscribe")
    return run(cmd)


def plan(ranks: int, strategy: str, flags: list[str]) -> dict:
    """The plan's row of the layout (its figures are its heaviest rank's)."""
    cmd = [str(BIN / "paratrain"), "plan", *MODEL, "--device", "cpu", "--global-batch", str(GLOBAL_BATCH)]
    cmd += ["--optimizer", "adam", "--precision", "fp32", "--json", *flags]
    rows = run(cmd)["rows"]
    (row,) = [r for r in rows if r["devices"] == ranks and r["strategy"] == strategy]
    return row


def heaviest_rank(memory: dict) -> int:
    """The rank that held the most parameters, gradients, optimizer state and activations in all."""
    ranks = range(len(memory["parameters_bytes"]))
    keys = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes")
    return max(ranks, key=lambda r: sum(memory[k][r] for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated, of: " + ", ".join(LAYOUTS))
    args = parser.parse_args()
    names = [n.strip() for n in args.layouts.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        sys.exit(f"unknown layout {unknown[0]!r}: choose from {', '.join(LAYOUTS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="planner-memory-"))
    print("| layout | ranks | parameters | gradients | optimizer | activations: planned / held (error) |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name in names:
        ranks, replicas, strategy, shared, train_only, plan_only = LAYOUTS[name]
        summary = train(ranks, replicas, [*shared, *train_only], out / name)
        planned = plan(ranks, strategy, [*shared, *plan_only])["memory"]
        held = summary["memory"]
        rank = heaviest_rank(held)
        cells = []
        for figure in FIGURES:
            actual = held["activations_peak_bytes" if figure == "activations_bytes" else figure][rank]
            error = planned[figure] / actual - 1 if actual else 0.0
            worst = max(worst, abs(error))
            shown = f"{planned[figure] / 1024:,.0f}"
            if figure == "activations_bytes":
                shown += f" / {actual / 1024:,.0f}"
            cells.append(f"{shown} ({error:+.1%})")
        print(f"| {name} | {ranks} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nKiB held by the heaviest rank; the largest error {worst:.1%}. Runs in {out}")


if __name__ == "__main__":
    main()
