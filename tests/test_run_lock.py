"""One run at a time in a run directory: a second run into a directory in use is refused and the
first finishes unharmed; a killed run's lock does not block the next."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from paratrain.cli import main
from paratrain.runs.lock import LOCK_FILE

TRAIN = [
    "train",
    "--workload",
    "synthetic-cnn",
    "--synthetic-samples",
    "512",
    "--batch-size",
    "64",
    "--lr",
    "0.01",
    "--epochs",
    "4",
    "--checkpoint-every",
    "1",
    "--threads-per-worker",
    "1",
    "--quiet",
]


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_a_second_run_into_a_running_directory_is_refused_and_the_first_finishes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "paratrain", *TRAIN, "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(run_dir / "checkpoint.pt", first)  # the first run is past its first epoch
        first.send_signal(signal.SIGSTOP)  # and stays mid-run, however busy the machine
        try:
            # A --resume passes the "already exists" check, so only the lock stands between the two.
            code = main([*TRAIN, "--run-dir", str(run_dir), "--resume"])
        finally:
            first.send_signal(signal.SIGCONT)
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "in use by another paratrain run" in err, err
        _out, first_err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first_err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_run"] == 4
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("start") == 1, "a second run wrote into the first one's metrics"
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == list(range(4))


HOLD = """
import sys, time
from pathlib import Path
from paratrain.runs.lock import run_dir_lock
with run_dir_lock(Path(sys.argv[1]), fresh=True):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_killed_runs_lock_does_not_block(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = subprocess.run([sys.executable, "-c", HOLD, str(run_dir)], capture_output=True, text=True)
        assert refused.returncode == 1 and "in use by another paratrain run" in refused.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (run_dir / LOCK_FILE).exists()  # the file stays behind, locked by nobody
    from paratrain.runs.lock import run_dir_lock

    with run_dir_lock(run_dir, fresh=True):  # empty but for the lock file: a fresh run may start
        pass
