"""How long `paratrain plan` takes for LLM-shaped models (issue #29: "a plan answers in seconds").

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/plan_speed.py --repeats 3
    # against an earlier version, alternating with this one (a worktree of it: git worktree add /tmp/old REV):
    PYTHONPATH=benchmarks .venv/bin/python benchmarks/plan_speed.py --repeats 3 --before /tmp/old/src

Each case is the whole command, a fresh process (imports, measuring the model on the meta device, the
plots), timed by wall clock; with --before, the two versions run alternately, case by case, so drift
of this VM's speed falls on both. Prints the medians and ranges in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "Llama 2 70B, fsdp on 64 A100, every block checkpointed": [
        *["--model", "llama:llama2_70b", "--dataset", "text", "--seq-len", "4096", "--device", "a100"],
        *["--precision", "bf16", "--optimizer", "adamw", "--strategy", "fsdp", "--gpus", "64", "--batch-size", "1"],
        "--checkpoint-activations",
    ],
    "Llama 3 8B, --search on 64 H100": [
        *["--model", "llama:llama3_8b", "--dataset", "text", "--seq-len", "8192", "--device", "h100"],
        *["--precision", "bf16", "--gpus", "64", "--batch-size", "2", "--optimizer", "adamw", "--search"],
    ],
}


def timed(src: Path, args: list[str], out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT / 'benchmarks'}")
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "paratrain", "plan", *args, "--out", str(out)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, help="the src/ directory of an earlier version, timed alternately")
    args = parser.parse_args()
    versions = {"this version": ROOT / "src", **({"before": args.before} if args.before else {})}
    seconds: dict[tuple[str, str], list[float]] = {(c, v): [] for c in CASES for v in versions}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for version, src in versions.items():
                for case, case_args in CASES.items():
                    took = timed(src, case_args, Path(scratch) / f"{version}-{repeat}".replace(" ", "-"))
                    seconds[(case, version)].append(took)
                    print(f"{repeat + 1} {version}: {case}: {took:.1f} s", flush=True)
    print("\n| case | " + " | ".join(versions) + " |")
    print("|---|" + "---|" * len(versions))
    for case in CASES:
        cells = []
        for version in versions:
            runs = seconds[(case, version)]
            cells.append(f"{statistics.median(runs):.1f} s ({min(runs):.1f}-{max(runs):.1f})")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
