"""One trial: a process on its own cores (or GPUs), its metrics, its outcome.

Trial processes are forked from a multiprocessing fork server. For built-in workloads the server
has imported torch and the engine once, so a trial reaches its first step in well under a second
instead of paying a fresh interpreter and `import torch` (over 4 s here) every time. A script
trial is forked the same way and runs the user's program as its child, sampling it with the
monitor into the trial's system.jsonl (the sweep driver pays nothing for it). Either way the child first
puts itself in its own session (so the trial and everything it starts is stopped as one group),
asks the kernel to kill it if the sweep dies, and pins itself to its slot's cores.
"""

from __future__ import annotations

import ctypes
import json
import math
import multiprocessing
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for_sentinels
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.launch.probe import RUN_DIR_ENV
from paratrain.launch.probe import command as probe_command
from paratrain.measure.monitor import DEFAULT_HZ, SYSTEM_FILE, Monitor
from paratrain.runs import RunDir
from paratrain.script_client import PARAMS_ENV, REPORT_FILE_ENV

PARAM_STYLES = ("space", "equals", "plain", "none")  # --lr 0.1 | --lr=0.1 | lr=0.1 (Hydra) | env only
VAL_METRICS = ("val_loss", "val_accuracy", "val_bits_per_byte")  # a built-in trial's metrics on the validation split
# Modules the fork server imports once for built-in trials; torch._dynamo is imported lazily by
# the first optimizer torch builds (over 2 s), so it is loaded here too.
GUARD = "paratrain.sweep.guard"
PRELOAD = [GUARD, "torch", "torch._dynamo", "paratrain.launch.builtin", "paratrain.engine.loop", "paratrain.workloads"]


# -- devices ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """The devices one running trial owns: cores always, GPUs when there are any."""

    index: int
    cores: tuple[int, ...]
    gpus: tuple[int, ...] | None = None

    def describe(self) -> str:
        cores = f"cores {','.join(map(str, self.cores))}"
        return f"GPUs {','.join(map(str, self.gpus))}, {cores}" if self.gpus else cores


def plan_slots(
    jobs: int, workers_per_trial: int, allow_oversubscribe: bool, cores: Sequence[int] | None = None, gpus: int = 0
) -> list[Slot]:
    """Split this machine's devices among `jobs` concurrent trials, never sharing one by accident."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if gpus:
        if jobs * workers_per_trial > gpus and not allow_oversubscribe:
            raise UsageError(
                f"-j {jobs} x --workers-per-trial {workers_per_trial} needs {jobs * workers_per_trial} GPUs; "
                f"this machine has {gpus}; lower -j or pass --allow-oversubscribe"
            )
        per_cores = max(1, len(cores) // jobs)
        return [
            Slot(
                i,
                tuple(cores[(i * per_cores) % len(cores) :][:per_cores]),
                tuple((i * workers_per_trial + k) % gpus for k in range(workers_per_trial)),
            )
            for i in range(jobs)
        ]
    if jobs * workers_per_trial > len(cores) and not allow_oversubscribe:
        raise UsageError(
            f"-j {jobs} x --workers-per-trial {workers_per_trial} needs {jobs * workers_per_trial} cores; "
            f"this process may use {len(cores)}; lower -j or pass --allow-oversubscribe "
            "(trials would then time-slice cores and every timing would be wrong)"
        )
    per = max(1, len(cores) // jobs)
    return [
        Slot(i, tuple(cores[(i * per + k) % len(cores)] for k in range(max(per, workers_per_trial))))
        for i in range(jobs)
    ]


def gpu_count() -> int:
    """GPUs this sweep may hand out. Without an NVIDIA device node there are none, and the driver
    does not pay for importing torch (2 s) to learn that."""
    if not Path("/dev/nvidia0").exists() and not Path("/dev/nvidiactl").exists():
        return 0
    import torch

    return torch.cuda.device_count()


def visible_devices(gpus: Sequence[int], inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a trial that owns the sweep's GPUs number `gpus`.

    The sweep counts the GPUs it can see, 0..N-1; under an inherited CUDA_VISIBLE_DEVICES (SLURM
    without device cgroups, containers, shared machines) number i is the list's i-th entry, which
    may be another index, a GPU-UUID or a MIG-UUID. Taking entries by position keeps each trial on
    the devices the sweep was given.
    """
    if not inherited or not inherited.strip():
        return ",".join(map(str, gpus))
    entries = [entry.strip() for entry in inherited.split(",") if entry.strip()]
    return ",".join(entries[i] for i in gpus)


# -- what a trial runs ------------------------------------------------------------------------

# A probed trial starts as launch's ranks do (probe.command(): `python -m paratrain.launch.probe SCRIPT
# ARGS...`), its records in TRIAL_DIR/probe/. The probe package imports no torch, so neither do the sweep
# driver and the script trials' fork server.


@dataclass(frozen=True)
class ScriptCommand:
    """Any program; hyperparameters as arguments and in PARATRAIN_PARAMS. A Python script runs under the
    probe unless `probe` is off."""

    script: str
    args: tuple[str, ...] = ()
    param_style: str = "space"
    probe: bool = False

    @property
    def probed(self) -> bool:
        return self.probe and self.script.endswith(".py")

    def argv(self, params: dict[str, Any]) -> list[str]:
        if self.script.endswith(".py"):
            prefix = probe_command(self.script) if self.probe else [sys.executable, self.script]
        else:
            prefix = [self.script]
        return prefix + list(self.args) + param_arguments(params, self.param_style)


def check_script(script: Path) -> None:
    if script.is_dir():
        raise UsageError(f"--script {script} is a directory; pass the path of your training script, a file in it")
    if not script.is_file():
        raise UsageError(f"--script {script} does not exist; pass the path of your training script")
    if script.suffix != ".py" and not os.access(script, os.X_OK):
        raise UsageError(
            f"--script {script} is not executable; chmod +x it, or pass a .py file (run with {sys.executable})"
        )


def param_arguments(params: dict[str, Any], style: str) -> list[str]:
    if style == "none":
        return []
    out: list[str] = []
    for name, value in params.items():
        text = value if isinstance(value, str) else json.dumps(value)
        if style == "space":
            out += [f"--{name}", text]
        elif style == "equals":
            out.append(f"--{name}={text}")
        else:
            out.append(f"{name}={text}")
    return out


@dataclass(frozen=True)
class BuiltinCommand:
    """A paratrain workload: `paratrain train` with the sweep's train flags and the trial's params."""

    train: dict[str, Any]  # the shared train flags (TrainConfig fields)

    def config(self, params: dict[str, Any], repeat: int, workers: int, run_dir: Path) -> dict[str, Any]:
        values = {**self.train, **params, "workers": workers, "run_dir": str(run_dir), "quiet": True}
        # Repeats of one combination differ in their seed only; combinations share seeds, so they
        # are compared on the same initialisation and data order.
        values["seed"] = values.get("seed", 0) + repeat
        return values


# -- running one --------------------------------------------------------------------------------


@dataclass
class Outcome:
    state: str  # COMPLETE | FAIL | PRUNED
    values: list[float] | None = None  # the objective(s), in spec.metric order
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str | None = None  # why it failed or was pruned
    duration_s: float = 0.0
    launch_overhead_s: float | None = None  # from launch to the first training step (built-in)


_server: Any = None

# The sweep's slot threads start and poll trial processes concurrently, and CPython's forkserver
# Popen.poll() is not thread-safe: Process.start() polls every live child, and when two threads
# poll one finished child the loser reads EOF and records exit code 255, overwriting the real one
# (python/cpython gh-130895). Every start and poll goes through this lock; waiting is done on the
# sentinel, which reads nothing.
_popen_lock = threading.Lock()


def start_server(builtin: bool) -> Any:
    """Start the fork server now, from the calling (main) thread; see paratrain.sweep.guard."""
    global _server
    if _server is None:
        _server = multiprocessing.get_context("forkserver")
        _server.set_forkserver_preload(PRELOAD if builtin else [GUARD])
        from multiprocessing import forkserver

        forkserver.ensure_running()
    return _server


class TrialProcess:
    """A started trial: poll it, read what it reported, stop it."""

    def __init__(
        self,
        command: ScriptCommand | BuiltinCommand,
        params: dict[str, Any],
        trial_dir: Path,
        slot: Slot,
        repeat: int,
        workers: int,
        number: int,
    ):
        self.command, self.trial_dir, self.slot = command, trial_dir, slot
        trial_dir.mkdir(parents=True, exist_ok=True)
        self.reports_path = trial_dir / "reports.jsonl"
        self.reports_path.touch()
        self.run = RunDir(trial_dir / "run")
        env = {
            PARAMS_ENV: json.dumps(params),
            REPORT_FILE_ENV: str(self.reports_path),
            "PARATRAIN_TRIAL_NUMBER": str(number),
            "PARATRAIN_TRIAL_DIR": str(trial_dir),
            "PARATRAIN_WORKERS": str(workers),
            "OMP_NUM_THREADS": str(max(1, len(slot.cores) // workers)),
            "MKL_NUM_THREADS": str(max(1, len(slot.cores) // workers)),
        }
        if slot.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(slot.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if isinstance(command, ScriptCommand):
            if command.probed:
                env[RUN_DIR_ENV] = str(trial_dir)
            what: Any = command.argv(params)
            (trial_dir / "command.txt").write_text(shlex.join(what) + "\n")
        else:
            what = command.config(params, repeat, workers, self.run.path)
        (trial_dir / "params.json").write_text(json.dumps(params, indent=2) + "\n")
        self.started_unix = time.time()
        self.started = time.perf_counter()
        ctx = start_server(builtin=isinstance(command, BuiltinCommand))
        self.process = ctx.Process(
            target=_trial_main,
            daemon=False,
            name=f"trial-{number}",
            args=(slot.cores, env, str(trial_dir / "stdout.log"), str(trial_dir / "stderr.log"), what),
        )
        with _popen_lock:
            self.process.start()
        self._offset = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def running(self) -> bool:
        with _popen_lock:
            return self.process.exitcode is None

    def wait(self, timeout: float) -> None:
        """Until the trial ends or `timeout` seconds pass."""
        wait_for_sentinels([self.process.sentinel], timeout)

    def new_reports(self) -> list[tuple[int | None, dict[str, float]]]:
        """(step, metrics) reported since the last call: the script's report file, or the built-in
        run's evaluation events (one step per epoch), each named after its split: val_* only ever
        measures the validation split, so a sweep never prunes or chooses on the test split."""
        if isinstance(self.command, ScriptCommand):
            lines, self._offset = _read_new_lines(self.reports_path, self._offset)
            return [(r.get("step"), _floats(r.get("metrics", {}))) for r in map(_loads, lines) if r is not None]
        lines, self._offset = _read_new_lines(self.run.metrics, self._offset)
        out = []
        for event in filter(None, map(_loads, lines)):
            if event.get("event") == "eval":
                split = event["split"]
                metrics = {f"{split}_loss": event["loss"], f"{split}_accuracy": event["accuracy"]}
                out.append((event["epoch"], metrics))
        return out

    def stop(self) -> None:
        """Stop the trial and whatever it started: SIGTERM to its process group, SIGKILL after 5 s."""
        if self.pid is None or not self.running():
            return
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            self.wait(grace)
            if not self.running():
                return

    def outcome(self, metrics_wanted: Sequence[str]) -> Outcome:
        """The finished trial's result: its objective values, or why there are none."""
        duration = self.elapsed()
        with _popen_lock:
            code = self.process.exitcode
        final, overhead = self._final_metrics()
        final.setdefault("time_s", duration)
        if code != 0:
            why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            last = _last_line(self.trial_dir / "stderr.log")
            return Outcome(
                "FAIL",
                metrics=final,
                reason=f"{why}: {last}" if last else why,
                duration_s=duration,
                launch_overhead_s=overhead,
            )
        missing = [m for m in metrics_wanted if m not in final]
        if missing:
            how = "paratrain.report" if isinstance(self.command, ScriptCommand) else "the run's summary.json"
            return Outcome(
                "FAIL",
                metrics=final,
                duration_s=duration,
                launch_overhead_s=overhead,
                reason=f"the trial never reported {missing[0]!r} (looked in {how} and the last lines of stdout)",
            )
        values = [final[m] for m in metrics_wanted]
        bad = [m for m, v in zip(metrics_wanted, values) if not math.isfinite(v)]
        if bad:
            return Outcome(
                "FAIL",
                metrics=final,
                duration_s=duration,
                launch_overhead_s=overhead,
                reason=f"the trial reported {bad[0]} = {final[bad[0]]}",
            )
        return Outcome("COMPLETE", values=values, metrics=final, duration_s=duration, launch_overhead_s=overhead)

    def _final_metrics(self) -> tuple[dict[str, float], float | None]:
        if isinstance(self.command, BuiltinCommand):
            metrics: dict[str, float] = {}
            if self.run.summary.exists():
                summary = self.run.summary_record()
                metrics = {
                    k: float(v)
                    for k, v in summary.model_dump().items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                if summary.val_split == "test":  # without a validation split the engine's val_* are the test split's
                    metrics = {k: v for k, v in metrics.items() if k not in VAL_METRICS}
            start = next((e["unix_time"] for e in self.run.read_metrics() if e.get("event") == "start"), None)
            return metrics, (start - self.started_unix if start is not None else None)
        reported: dict[str, float] = {}
        for record in filter(None, map(_loads, _read_lines(self.reports_path))):
            reported.update(_floats(record.get("metrics", {})))
        return {**parse_stdout_metrics(_tail(self.trial_dir / "stdout.log")), **reported}, None


def _trial_main(cores: Sequence[int], env: dict[str, str], stdout: str, stderr: str, what: Any) -> None:
    """Runs in the forked child: isolate, pin, redirect, then run the script or train.

    A script runs as a child of this process, which samples it with the monitor into
    TRIAL_DIR/system.jsonl (as rank 0; ranks a script starts itself are its launcher's to watch)
    and ends as the script did. A built-in trial's train() runs its own monitor into its run directory.
    """
    os.setsid()
    die_with_parent()
    os.sched_setaffinity(0, cores)
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    if isinstance(what, list):
        _run_script(what, Path(env["PARATRAIN_TRIAL_DIR"]) / SYSTEM_FILE)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    from paratrain.launch.builtin import train

    try:
        train(what)
    except BaseException as exc:  # the reason goes to stderr.log's last line, where the sweep reads it
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(1)


def _run_script(argv: list[str], samples: Path) -> None:
    """Run the trial's script under the monitor, then end the way it ended (status or signal)."""
    try:
        script = subprocess.Popen(argv, preexec_fn=die_with_parent)
    except OSError as exc:
        print(f"cannot run {argv[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127)
    with Monitor(samples, DEFAULT_HZ, lambda proc: 0 if proc.pid == script.pid else None):
        code = script.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel sends SIGKILL to this process when its parent thread ends."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: trials may outlive a killed sweep
        pass


# -- the stdout protocol ----------------------------------------------------------------------

_PAIR = re.compile(
    r"([A-Za-z_][\w.\-/]*)\s*(?:=|:)\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf))\b"
)


def parse_stdout_metrics(lines: Sequence[str]) -> dict[str, float]:
    """Metrics from stdout lines, later lines winning: `NAME=VALUE`, `NAME: VALUE` (several per line
    allowed) or a JSON object. Only the last line that names a metric counts for that metric."""
    found: dict[str, float] = {}
    for line in lines:
        line = line.strip()
        record = _loads(line) if line.startswith("{") else None
        if isinstance(record, dict):
            found.update(_floats(record))
            continue
        for name, value in _PAIR.findall(line):
            found[name] = float(value)
    return found


def _floats(record: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in record.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[key] = float(value)
        elif isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
            out[key] = float(value)
    return out


def _loads(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def _read_new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Whole lines appended since `offset`; a half-written last line waits for the next call."""
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def _tail(path: Path, lines: int = 50) -> list[str]:
    if not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64 * 1024))
        return f.read().decode(errors="replace").splitlines()[-lines:]


def _last_line(path: Path) -> str:
    tail = [line.strip() for line in _tail(path, 20) if line.strip()]
    return tail[-1][:300] if tail else ""
