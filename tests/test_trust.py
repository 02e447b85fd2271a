"""Trustworthy by default: divergence caught, early stopping, user code that imports, the time a
command spends, the dataset cache, and nothing left behind (issue 15)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import user_factories
from conftest import synthetic

import paratrain
from paratrain.errors import UsageError

PARATRAIN = [sys.executable, "-m", "paratrain"]
TINY = [
    "--workload",
    "synthetic-cnn",
    "--synthetic-samples",
    "512",
    "--batch-size",
    "32",
    "--threads-per-worker",
    "1",
    "--device",
    "cpu",
    "--quiet",
]


def _cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PARATRAIN, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_a_diverging_run_stops_with_status_diverged_one_line_and_exit_1(tmp_path):
    run = tmp_path / "run"
    proc = _cli("train", *TINY, "--lr", "500", "--epochs", "3", "--log-every", "4", "--run-dir", run)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "diverged" in lines[0] and "--lr" in lines[0] and "between steps" in lines[0], (
        proc.stderr
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and "nan" in summary["error"]
    # Stopped at the first log point that saw it, not at the end of the run.
    assert summary["steps"] < 3 * 16 and summary["diverged_after_step"] < summary["steps"]


def test_a_diverging_sweep_trial_fails_with_its_reason_and_the_sweep_goes_on(tmp_path):
    space = tmp_path / "space.json"
    space.write_text(
        json.dumps(
            {
                "algorithm": "grid",
                "parameters": {"lr": {"type": "discrete", "values": [0.01, 500]}},
                "spec": {"metric": "val_loss", "objective": "minimize"},
            }
        )
    )
    out = tmp_path / "out"
    proc = _cli(
        "sweep",
        space,
        "--out",
        out,
        "--quiet",
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        "512",
        "--epochs",
        "2",
        "--log-every",
        "4",
        "--lr-scaling",
        "none",
        "--val-split",
        "0.2",
    )
    assert proc.returncode == 0, proc.stderr
    trials = {t["params"]["lr"]: t for t in json.loads((out / "sweep.json").read_text())["trials"]}
    assert trials[0.01]["state"] == "COMPLETE"
    assert trials[500]["state"] == "FAIL" and "diverged" in trials[500]["reason"], trials[500]


def test_early_stop_ends_the_run_when_validation_loss_stops_improving(tmp_path):
    """200 images of the bundled subset overfit within a few epochs: the validation loss turns."""
    summary = paratrain.train(
        limit_train=200,
        val_split=0.25,
        epochs=40,
        early_stop=2,
        optimizer="adam",
        lr=0.003,
        batch_size=25,
        threads_per_worker=1,
        device="cpu",
        log_every=1000,
        quiet=True,
        run_dir=tmp_path / "run",
    )
    assert summary["early_stopped"] and summary["epochs_run"] < 40
    assert summary["epochs_run"] == summary["best_epoch"] + 2
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [e["loss"] for e in events if e["event"] == "eval" and e["split"] == "val"]
    assert len(val) == summary["epochs_run"] and min(val) == val[summary["best_epoch"] - 1]
    assert all(v >= min(val) for v in val[summary["best_epoch"] :])


def test_a_model_in_the_working_directory_imports_without_pythonpath(tmp_path):
    (tmp_path / "mymodels.py").write_text(
        "from torch import nn\n\ndef make_net(num_classes, in_channels, image_size):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, num_classes))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The console script, as users type it (`python -m` would put the working directory on the path itself).
    console_script = Path(sys.executable).parent / "paratrain"
    proc = subprocess.run(
        [
            str(console_script),
            "train",
            *TINY,
            "--model",
            "mymodels:make_net",
            "--workers",
            "2",
            "--epochs",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["model"] == "mymodels:make_net"


def test_the_python_api_takes_functions_and_classes(tmp_path):
    summary = paratrain.train(
        synthetic(tmp_path, workers=2, epochs=1, model=user_factories.tiny_net, synthetic_shape="3,8,8")
    )
    assert summary["model"] == "user_factories:tiny_net"
    summary = paratrain.train(
        synthetic(tmp_path, epochs=1, model=user_factories.TinyNet, synthetic_shape="3,8,8", run_dir=tmp_path / "cls")
    )
    assert summary["model"] == "user_factories:TinyNet"
    with pytest.raises(UsageError, match="lambda"):
        paratrain.train(synthetic(tmp_path, model=lambda num_classes: user_factories.tiny_net(num_classes)))


def test_a_notebook_function_is_refused_for_spawned_ranks_with_a_remedy(tmp_path, monkeypatch):
    notebook = types.ModuleType("__main__")  # an interactive session: no __file__ to re-import
    monkeypatch.setitem(sys.modules, "__main__", notebook)

    def make_net(num_classes):
        return user_factories.tiny_net(num_classes)

    make_net.__module__, make_net.__qualname__ = "__main__", "make_net"
    notebook.make_net = make_net
    with pytest.raises(UsageError, match=r"notebook.*\.py file"):
        paratrain.train(synthetic(tmp_path, workers=2, model=make_net, synthetic_shape="3,8,8"))
    assert not (tmp_path / "run").exists()
    # One worker runs in this very process, where the notebook's function is at hand.
    assert (
        paratrain.train(synthetic(tmp_path, workers=1, epochs=1, model=make_net, synthetic_shape="3,8,8"))["status"]
        == "completed"
    )


def test_summary_separates_data_preparation_from_training_and_the_whole_command(tmp_path):
    """A fresh cache: the bundled subset is decoded first (prepare_s), and the command's wall time
    counts it."""
    summary = paratrain.train(
        epochs=1,
        batch_size=64,
        threads_per_worker=1,
        device="cpu",
        quiet=True,
        cache_dir=tmp_path / "cache",
        run_dir=tmp_path / "run",
    )
    assert summary["prepare_s"] > 0.2
    assert summary["wall_time_s"] >= summary["prepare_s"] + summary["launch_and_train_s"]
    again = paratrain.train(
        epochs=1,
        batch_size=64,
        threads_per_worker=1,
        device="cpu",
        quiet=True,
        cache_dir=tmp_path / "cache",
        run_dir=tmp_path / "again",
    )
    assert again["prepare_s"] < summary["prepare_s"] / 2, "the second run should read the cache"


def test_cache_lists_entries_with_sizes_and_clears_them(tmp_path):
    cache = tmp_path / "cache"
    paratrain.train(
        epochs=1,
        batch_size=64,
        threads_per_worker=1,
        device="cpu",
        quiet=True,
        cache_dir=cache,
        run_dir=tmp_path / "run",
    )
    entries = [p for p in cache.iterdir() if p.suffix == ".pt"]
    assert len(entries) == 1
    listing = _cli("cache", "--cache-dir", cache)
    assert listing.returncode == 0 and entries[0].name in listing.stdout and "MiB" in listing.stdout
    refused = _cli("cache", "--cache-dir", cache, "--clear", "nosuch")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1 and entries[0].exists()
    cleared = _cli("cache", "--cache-dir", cache, "--clear")
    assert cleared.returncode == 0 and not entries[0].exists()


def _leftovers() -> set[str]:
    return {p.name for p in Path("/tmp").glob("torchelastic_*")} | {
        p.name for p in Path("/dev/shm").glob("paratrain-*")
    }


def _start(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            *PARATRAIN,
            "train",
            *TINY,
            "--synthetic-samples",
            "4096",
            "--workers",
            "2",
            "--epochs",
            "50",
            "--run-dir",
            str(run),
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1.0)
    assert proc.poll() is None, proc.stderr.read()
    return proc


def _ranks_alive(run: Path) -> bool:
    import psutil

    def mentions_run(proc: psutil.Process) -> bool:
        try:
            return str(run) in " ".join(proc.cmdline())
        except psutil.Error:
            return False

    return any(mentions_run(proc) for proc in psutil.process_iter() if proc.pid != os.getpid())


def test_nothing_is_left_behind_after_a_run_a_terminated_run_or_a_killed_one(tmp_path):
    before = _leftovers()
    paratrain.train(synthetic(tmp_path, workers=2, epochs=1))
    assert _leftovers() == before, "a normal run left files in /tmp or /dev/shm"

    # SIGTERM (kill, a scheduler's time limit): one line, a failed summary, no rank left running.
    proc = _start(tmp_path / "terminated")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.strip().splitlines() == [
        "paratrain train: stopped by SIGTERM; the ranks were terminated"
    ]
    assert json.loads((tmp_path / "terminated" / "summary.json").read_text())["status"] == "failed"
    time.sleep(0.5)
    assert not _ranks_alive(tmp_path / "terminated")

    # SIGKILL of the whole process group: nothing can clean up, so nothing may have been left to.
    proc = _start(tmp_path / "killed")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert _leftovers() == before, "a killed run left files in /tmp or /dev/shm"


def test_study_rows_are_labelled_with_what_was_trained(tmp_path):
    from paratrain.runs import RunDir
    from paratrain.scale import scaling_rows

    paratrain.train(
        synthetic(
            tmp_path, epochs=2, model="user_factories:tiny_net", synthetic_shape="3,8,8", run_dir=tmp_path / "mine"
        )
    )
    paratrain.train(synthetic(tmp_path, epochs=2, run_dir=tmp_path / "builtin"))
    labels = {row["workload"] for row in scaling_rows([RunDir(tmp_path / "mine"), RunDir(tmp_path / "builtin")])}
    assert labels == {"user_factories:tiny_net on synthetic", "synthetic-cnn"}
