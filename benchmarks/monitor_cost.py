"""What the launcher's monitor costs the ranks (docs/launch.md, "What it costs the ranks").

First the CPU time of one `Monitor.sample()` over R sleeping ranks (each with a child, as a DataLoader worker),
with P extra sleeping processes in the machine's process table (a busy server has hundreds), timed in a loop.
Then, with `--train`, the step of gpt-tiny under fsdp on 2 ranks, the code of `--before` (another checkout's
src, for example a git worktree of the previous commit) and this checkout's, alternating, among the same P extra
processes; medians of `--repeats` runs each. Run it on a quiet machine:

    .venv/bin/python benchmarks/monitor_cost.py --processes 500 --ranks 2 8
    .venv/bin/python benchmarks/monitor_cost.py --processes 500 --train --before /work/s13before/src --out RUNS
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN = "--workload gpt-tiny --strategy fsdp --workers 2 --threads-per-worker 1 --batch-size 16 --samples-per-epoch 640"
TRAIN += " --eval-samples 8 --epochs 3 --optimizer adam --lr-scaling none --quiet --json"


def _sleepers(count: int) -> list[int]:
    """The pids of `count` processes outside this one's tree, as other users' would be: started in the background
    by a shell that exits at once, so that they are handed to init."""
    if count == 0:
        return []
    script = f"for i in $(seq {count}); do sleep 3600 >/dev/null 2>&1 & echo $!; done"
    return [int(pid) for pid in subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.split()]


def sample_cost(ranks: int, calls: int = 20) -> float:
    """CPU seconds of one Monitor.sample() over `ranks` sleeping ranks with a child each."""
    sys.path.insert(0, str(ROOT / "src"))
    import psutil

    from paratrain.measure.monitor import Monitor, ranks_by_environment

    code = "import subprocess, sys, time\nsubprocess.Popen(['sleep', '600'])\ntime.sleep(600)\n"
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "monitor-cost"}
    started = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(r)}) for r in range(ranks)]
    try:
        while any(not psutil.Process(p.pid).children() for p in started):
            time.sleep(0.05)
        monitor = Monitor(Path(os.devnull), 2.0, ranks_by_environment("monitor-cost"))
        monitor.sample()
        begun = time.process_time()
        for _ in range(calls):
            monitor.sample()
        return (time.process_time() - begun) / calls
    finally:
        for p in started:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait()


def step_ms(src: Path, run_dir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [str(BIN / "paratrain"), "train", *TRAIN.split(), "--run-dir", str(run_dir)]
    summary = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    return 1e3 * summary["global_batch_size"] / summary["samples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=0, help="extra sleeping processes in the process table")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--train", action="store_true", help="also time training steps, --before against this code")
    parser.add_argument("--before", type=Path, help="the src directory of the code to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/monitor-cost"))
    args = parser.parse_args()
    if args.train and args.before is None:
        parser.error("--train needs --before SRC")
    others = _sleepers(args.processes)
    try:
        time.sleep(1)
        print(f"{len(os.listdir('/proc'))} entries in /proc")
        for ranks in args.ranks:
            print(f"{ranks} ranks: a sample costs {1e3 * sample_cost(ranks):.1f} ms of CPU")
        if not args.train:
            return
        steps: dict[str, list[float]] = {"before": [], "after": []}
        for repeat in range(args.repeats):
            for name, src in (("before", args.before), ("after", ROOT / "src")):
                steps[name].append(step_ms(src, args.out / f"{name}-{repeat}"))
                print(f"{name} {repeat}: {steps[name][-1]:.1f} ms a step", flush=True)
        before, after = (statistics.median(steps[k]) for k in ("before", "after"))
        print(f"median step: before {before:.0f} ms, after {after:.0f} ms ({after / before - 1:+.1%})")
    finally:
        for pid in others:
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
