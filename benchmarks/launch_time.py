"""Launch time: from the command to the first training step, against `python -c "import torch"`.

For 1 and 2 workers, the time from starting `paratrain train` to its first training step (the
`start` event that rank 0 writes to metrics.jsonl right before the first batch, a Unix time) is
divided by the wall time of `python -c "import torch"` with the same interpreter. So is the time to
the END of the first optimizer step (its `step` event, with --log-every 1): PyTorch's optimizers
import torch._dynamo in their first step, which takes a while, and this column shows it. The
three commands alternate (torch, 1 worker, 2 workers, torch, ...) because the machine is shared;
the table quotes medians with min-max. The dataset cache is warmed once before timing: what is
measured is starting, not decoding CIFAR-10.

    .venv/bin/python benchmarks/launch_time.py --repeats 7        # the measurement (~2 min on 2 cores)
    .venv/bin/python benchmarks/launch_time.py --repeats 1        # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
IMPORT_TORCH = [sys.executable, "-c", "import torch"]


def train_command(workers: int, run_dir: Path) -> list[str]:
    return [
        str(BIN / "paratrain"),
        "train",
        "--workers",
        str(workers),
        "--workload",
        "cifar10-cnn",
        "--epochs",
        "1",
        "--limit-train",
        "1000",
        "--log-every",
        "1",
        "--quiet",
        "--run-dir",
        str(run_dir),
    ]


def to_first_step(workers: int, scratch: Path, name: str) -> tuple[float, float]:
    """Seconds from the command to the first step's start, and to its end."""
    run_dir = scratch / name
    started = time.time()
    subprocess.run(train_command(workers, run_dir), check=True, capture_output=True, text=True)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    start = next(e for e in events if e["event"] == "start")
    step = next(e for e in events if e["event"] == "step")
    shutil.rmtree(run_dir)
    return start["unix_time"] - started, start["unix_time"] + step["time"] - start["time"] - started


def import_torch() -> float:
    started = time.perf_counter()
    subprocess.run(IMPORT_TORCH, check=True)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="paratrain-launch-bench-"))
    env_cache = os.environ.get("PARATRAIN_CACHE", "~/.cache/paratrain")
    imports: list[float] = []
    starts: dict[int, list[float]] = {1: [], 2: []}
    ends: dict[int, list[float]] = {1: [], 2: []}
    try:
        to_first_step(1, scratch, "warm")  # decodes and caches the dataset once, untimed
        for repeat in range(args.repeats):
            imports.append(import_torch())
            for workers in (1, 2):
                start, end = to_first_step(workers, scratch, f"w{workers}-{repeat}")
                starts[workers].append(start)
                ends[workers].append(end)
            print(
                f"repeat {repeat + 1}: import torch {imports[-1]:.2f} s; to the first step (start / end): 1 worker "
                f"{starts[1][-1]:.2f} / {ends[1][-1]:.2f} s, 2 workers {starts[2][-1]:.2f} / {ends[2][-1]:.2f} s",
                file=sys.stderr,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = statistics.median(imports)

    def cell(times: list[float]) -> str:
        median = statistics.median(times)
        return f"{median:.2f} ({min(times):.2f}-{max(times):.2f}) | {median / base:.2f}"

    print(f"\nmedians (min-max) of {args.repeats} alternating repeats, seconds from the command; x = / import torch")
    print("\n| command | to the first step | x | to the end of the first step | x |")
    print("|---|---|---|---|---|")
    print(f'| `python -c "import torch"` | {cell(imports)} | | |')
    for workers in (1, 2):
        print(f"| `paratrain train --workers {workers}` | {cell(starts[workers])} | {cell(ends[workers])} |")
    print("\ncommands:")
    print(f"  {shlex.join(IMPORT_TORCH)}")
    for workers in (1, 2):
        print(f"  {shlex.join(train_command(workers, Path('RUN_DIR')))}")
    print(f"dataset cache: {env_cache} (warmed before timing); {os.cpu_count()} cores; python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
