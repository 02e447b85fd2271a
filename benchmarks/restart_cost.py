"""What a lost rank costs with --max-restarts: the time from the kill to training again, and the steps
trained twice, against the same run left alone.

For each repeat, alternately: an uninterrupted 2-rank run, and the same run with rank 1 killed
(SIGKILL) in the middle of its second epoch. The kill lands a chosen number of steps after a step
checkpoint, so the work trained twice is known. From the killed run's metrics.jsonl:

- recovery: the kill to the first step logged after the restart (the agent noticing, stopping
  the survivor, the rendezvous again, new ranks, loading and broadcasting the checkpoint);
- repeated: steps between the checkpoint the run resumed from and the last step logged before the kill;
- extra wall time: the killed run's whole command against the uninterrupted one's.

Prints a markdown table (medians with min-max) and the commands. Needs a quiet machine.

    .venv/bin/python benchmarks/restart_cost.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paratrain.measure.monitor import ranks_by_log, wait_for_rank

ROOT = Path(__file__).resolve().parents[1]


def _steps(run: Path, event: str = "step") -> list[dict]:
    out = []
    try:
        for line in (run / "metrics.jsonl").read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if item["event"] == event:
                out.append(item)
    except FileNotFoundError:
        pass
    return out


def _rank_pid(root: int, run: Path, rank: int) -> int:
    # the monitor's rule: rank R holds RUN_DIR/logs/rank<R>.log open
    return wait_for_rank(root, ranks_by_log(run), rank, timeout_s=120)


def one_run(args: argparse.Namespace, run: Path, kill: bool) -> dict:
    per_epoch = args.samples // (2 * args.batch_size)
    cmd = [
        sys.executable,
        "-m",
        "paratrain",
        "train",
        "--workload",
        args.workload,
        "--synthetic-samples",
        str(args.samples),
        "--batch-size",
        str(args.batch_size),
        "--workers",
        "2",
        "--threads-per-worker",
        "1",
        "--device",
        "cpu",
        "--epochs",
        str(args.epochs),
        "--log-every",
        "1",
        "--checkpoint-every",
        f"{args.interval}steps",
        "--max-restarts",
        "1",
        "--quiet",
        "--json",
        "--run-dir",
        str(run),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    result: dict = {"command": " ".join(cmd[1:])}
    if kill:
        victim = _rank_pid(proc.pid, run, 1)
        target = per_epoch + args.interval + args.after  # in the second epoch, `after` steps past a checkpoint
        while proc.poll() is None and not any(e["step"] >= target for e in _steps(run)):
            time.sleep(0.002)
        before = _steps(run)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        result.update(last_step_before_kill=before[-1]["step"], killed_at=killed_at)
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {err[-2000:]}")
    summary = json.loads(out)
    result.update(wall_time_s=time.perf_counter() - started, summary=summary)
    if kill:
        # The restarted ranks' start event is written when they are ready to train (wall clock).
        restarted = _steps(run, "start")[-1]
        result.update(
            resumed_from_step=summary["resumed_from_step"],
            restarts=summary["restarts"],
            recovery_s=restarted["unix_time"] - result["killed_at"],
            repeated_steps=result["last_step_before_kill"] - summary["resumed_from_step"],
            epochs=len(_steps(run, "epoch")),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", default="synthetic-cnn")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--interval", type=int, default=32, help="steps between checkpoints")
    parser.add_argument("--after", type=int, default=16, help="the kill comes this many steps after a checkpoint")
    args = parser.parse_args()
    plain, killed = [], []
    with tempfile.TemporaryDirectory(prefix="restart-cost-") as tmp:
        for r in range(args.repeats):
            plain.append(one_run(args, Path(tmp) / f"plain{r}", kill=False))
            killed.append(one_run(args, Path(tmp) / f"killed{r}", kill=True))

    def spread(values: list[float], fmt: str) -> str:
        return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    print(
        "| runs | restarts | recovery: kill to training again (s) | steps trained twice | wall time (s) | extra wall "
        "time (s) |"
    )
    print("|---|---|---|---|---|---|")
    print(f"| uninterrupted x{args.repeats} | 0 | - | - | {spread([p['wall_time_s'] for p in plain], '.1f')} | - |")
    extra = [k["wall_time_s"] - p["wall_time_s"] for k, p in zip(killed, plain)]
    print(
        f"| rank 1 killed x{args.repeats} | {spread([k['restarts'] for k in killed], 'd')} | "
        f"{spread([k['recovery_s'] for k in killed], '.1f')} | {spread([k['repeated_steps'] for k in killed], 'd')} | "
        f"{spread([k['wall_time_s'] for k in killed], '.1f')} | {spread(extra, '.1f')} |"
    )
    print(
        f"\ncommand: {plain[0]['command']}  (the killed runs: the same, rank 1 SIGKILLed {args.after} steps after "
        f"the checkpoint of step {args.samples // (2 * args.batch_size) + args.interval})"
    )
    print(f"every killed run completed all {args.epochs} epochs: {all(k['epochs'] == args.epochs for k in killed)}")


if __name__ == "__main__":
    main()
