"""`paratrain launch`: any torchrun-style script on N local ranks, into a run directory.

The script is started the way `torchrun --standalone --nproc-per-node N` starts it: PyTorch's
elastic agent with a c10d rendezvous on a free local port sets RANK, LOCAL_RANK, WORLD_SIZE and
MASTER_ADDR/PORT in each rank's environment, and a rank that fails tears the others down. On top
of that each rank gets what `paratrain train` gives its own ranks: cores of its own (pinned) with
OMP_NUM_THREADS/MKL_NUM_THREADS to match, a log file, and the monitor sampling it from here.

The run directory:

    config.json           the command, the placement (threads and cores per rank)
    summary.json          status (completed | failed), workers, exit_code, wall_time_s, what the
                          script reported, and samples_per_s / epoch_times_s derived from it
    system.jsonl          the monitor's samples (see paratrain.measure.monitor)
    logs/rank<R>.log      each rank's stdout and stderr
    reports/rank<R>.jsonl each rank's `paratrain.report(...)` calls, one JSON line per call
    probe/rank<R>.jsonl   each rank's steps timed by phase (launch/probe.py; not with --no-probe)
    metrics.jsonl, batch_schedule.json, grad_noise/
                          with --batch-schedule warmup or adaptive: the script's paratrain.batch_schedule
                          records each change of its global batch, its state and (adaptive) its norms
                          (engine/script_schedule.py)

summary.json then also holds `breakdown` (seconds per optimizer step: data, compute, comm,
optimizer, other, as for built-in runs) and `probe` (what the probe saw per rank, or why it is off).
"""

from __future__ import annotations

import ast
import datetime as _dt
import json
import os
import re
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from paratrain.config import LaunchConfig, validate
from paratrain.errors import UsageError
from paratrain.launch import probe, probe_summary
from paratrain.launch.load import LoadMeter
from paratrain.launch.local import quiet_elastic_logs, root_failure, scoped_environ, worker_env
from paratrain.launch.placement import available_cores, core_sets, resolve_device
from paratrain.measure.monitor import monitor_run, ranks_by_environment
from paratrain.runs import RunDir, json_records, steady_epoch_time, write_json
from paratrain.runs.lock import run_dir_entries, run_dir_lock
from paratrain.runs.records import Summary, checked, fitting_fields
from paratrain.script_client import BATCH_SCHEDULE_ENV, REPORT_FILE_ENV

# The keys of summary.json that launch itself writes; a reported metric of the same name is kept
# under "reported" only.
OWN_KEYS = (
    "status",
    "workers",
    "exit_code",
    "failed_rank",
    "error",
    "wall_time_s",
    "run_dir",
    "reported",
    "machine_load",
    "samples_per_s",
    "epoch_times_s",
    "epoch_time_s",
    "breakdown",
    "probe",
    "batch_schedule",
)

# Each rank starts as `python -c RANK_EXEC PROGRAM...`: it pins itself to its cores, sends its
# output to its log and names its report file, then exec()s the program: same process, same
# environment, so the script runs as torchrun would have started it. Pinning before the exec
# (rather than from outside once it runs) means every thread the script ever starts inherits the
# cores. Only `os` and `sys`: this costs a bare interpreter start, no imports.
RANK_EXEC = """\
import os, sys
rank, local_rank, run_dir = os.environ["RANK"], int(os.environ["LOCAL_RANK"]), os.environ["PARATRAIN_RUN_DIR"]
cpu_sets = os.environ.pop("PARATRAIN_CPU_SETS", "")
if cpu_sets:
    os.sched_setaffinity(0, [int(c) for c in cpu_sets.split(";")[local_rank].split(",")])
os.environ["{report_env}"] = os.path.join(run_dir, "reports", "rank" + rank + ".jsonl")
log = os.open(os.path.join(run_dir, "logs", "rank" + rank + ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 1)
os.dup2(log, 2)
os.close(log)
os.execv(sys.argv[1], sys.argv[1:])
""".replace("{report_env}", REPORT_FILE_ENV)


def launch_script(config: LaunchConfig | dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """Run a torchrun-style script on `workers` local ranks; returns the summary (also RUN_DIR/summary.json).

    A failing script does not raise: the summary says `status: failed` with the `exit_code` of
    the first rank that failed, which `paratrain launch` returns as its own exit status.
    """
    values = config.model_dump() if isinstance(config, LaunchConfig) else dict(config or {})
    cfg: LaunchConfig = validate(LaunchConfig, {**values, **overrides})
    script = cfg.script.resolve()
    if script.is_dir():
        raise UsageError(f"{cfg.script} is a directory; pass the path of your training script, a file in it")
    if not script.is_file():
        raise UsageError(f"{cfg.script} does not exist; pass the path of your training script")
    if script.suffix != ".py" and not os.access(script, os.X_OK):
        raise UsageError(f"{cfg.script} is not executable; chmod +x it, or pass a .py file (run with {sys.executable})")
    if cfg.batch_schedule != "fixed" and not _sets_batch_schedule(script):
        raise UsageError(
            f"--batch-schedule {cfg.batch_schedule}: {cfg.script} never calls paratrain.batch_schedule(...), so "
            "paratrain cannot set its batch; build one after wrapping the model and run each optimizer step's "
            "micro_steps() (docs/launch.md)"
        )
    program = [sys.executable, str(script)] if script.suffix == ".py" else [str(script)]
    if cfg.probe and script.suffix == ".py":
        program = probe.command(str(script))
    cuda = resolve_device("auto")
    cores = available_cores()
    if cuda:  # GPU ranks, as in `train`: one GPU each, cores shared, unpinned
        threads, cpu_sets = cfg.threads_per_worker or max(1, len(cores) // cfg.workers), None
    else:
        threads, cpu_sets = core_sets(cfg.workers, cfg.threads_per_worker, cfg.allow_oversubscribe, cores)
    run = RunDir(cfg.run_dir or Path("runs") / f"{_dt.datetime.now():%Y%m%d-%H%M%S}-{script.stem}-w{cfg.workers}")
    if run.path.exists() and (not run.path.is_dir() or run_dir_entries(run.path)):
        raise UsageError(f"{run.path} already exists and is not empty; choose another --run-dir")
    with run_dir_lock(run.path, fresh=True):  # one run at a time in it (runs/lock.py)
        return _launch(cfg, run, script, program, cuda, threads, cpu_sets)


def _launch(
    cfg: LaunchConfig,
    run: RunDir,
    script: Path,
    program: list[str],
    cuda: bool,
    threads: int,
    cpu_sets: list[list[int]] | None,
) -> dict[str, Any]:
    """Write config.json, run the ranks under the monitor, write summary.json."""
    for sub in ("logs", "reports"):
        (run.path / sub).mkdir(parents=True, exist_ok=True)
    run_id = str(uuid.uuid4())
    write_json(
        run.config,
        {
            **cfg.model_dump(mode="json"),
            "script": str(script),
            "command": [*program, *cfg.script_args],
            "resolved": {
                "device": "cuda" if cuda else "cpu",
                "threads_per_worker": threads,
                "cpu_sets": cpu_sets,
                "run_id": run_id,
            },
        },
    )
    env = {**worker_env(threads), **cfg.env, "PARATRAIN_RUN_DIR": str(run.path.resolve())}
    if cfg.batch_schedule != "fixed":
        env[BATCH_SCHEDULE_ENV] = json.dumps(cfg.schedule_settings())
    if cpu_sets is not None:
        env["PARATRAIN_CPU_SETS"] = ";".join(",".join(map(str, cores)) for cores in cpu_sets)

    load = LoadMeter(cpu_sets)
    started = time.perf_counter()
    outcome: dict[str, Any] = {"status": "completed", "exit_code": 0}
    try:
        with monitor_run(run.path, cfg.monitor_hz, ranks_by_environment(run_id), cfg.workers if cuda else 0, env):
            outcome = _run(program + cfg.script_args, cfg.workers, run_id, run.path, env)
    except KeyboardInterrupt:
        write_json(
            run.summary,
            {
                "status": "failed",
                "workers": cfg.workers,
                "exit_code": 130,
                "error": "interrupted",
                "wall_time_s": time.perf_counter() - started,
                "run_dir": str(run.path),
            },
        )
        raise
    summary = {
        **outcome,
        "workers": cfg.workers,
        "wall_time_s": time.perf_counter() - started,
        "run_dir": str(run.path),
        "machine_load": load.finish(),
    }
    reported = read_reports(run.path / "reports")
    summary = {
        **fitting_fields({k: v for k, v in reported.items() if k not in OWN_KEYS}),
        **summary,
        "reported": reported,
        **throughput(run.path / "reports"),
        **probed(cfg, script, run.path),
        **scheduled(cfg, run.path),
    }
    if summary.get("samples_per_s") is None and summary["probe"].get("samples_per_s"):
        # The script reported no throughput: the probe's count of the samples its ranks trained on.
        summary["samples_per_s"] = summary["probe"]["samples_per_s"]
    write_json(run.summary, checked(Summary, summary))
    return summary


def _run(command: list[str], workers: int, run_id: str, run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Start the ranks under the elastic agent and wait; the outcome's status and exit code."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig
    from torch.distributed.launcher.api import elastic_launch

    quiet_elastic_logs()
    elastic_logs = run_dir / "logs" / "elastic"  # error.json of scripts that use torch's @record
    config = ElasticConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=workers,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(elastic_logs)),
    )
    try:
        with scoped_environ(env):
            elastic_launch(config, sys.executable)("-c", RANK_EXEC, *command)
    except SignalException as exc:
        # SIGTERM or SIGHUP to this process: the agent has stopped the ranks.
        return {
            "status": "failed",
            "exit_code": 128 + exc.sigval,
            "error": f"stopped by {signal.Signals(exc.sigval).name}; the ranks were terminated",
        }
    except ChildFailedError as exc:
        # The rank whose failure caused the others' (for scripts that record theirs with torch's @record).
        rank, failure = root_failure(exc)
        code = failure.exitcode if failure.exitcode >= 0 else 128 - failure.exitcode
        how = f"exit status {code}" if failure.exitcode >= 0 else f"killed by {_signal_name(-failure.exitcode)}"
        log = run_dir / "logs" / f"rank{rank}.log"
        last = _framework_fix(log) or _fatal_error(log) or _last_line(log)
        return {
            "status": "failed",
            "exit_code": code,
            "failed_rank": rank,
            "error": f"rank {rank} failed with {how}{': ' + last if last else ''} (see {log})",
        }
    shutil.rmtree(elastic_logs, ignore_errors=True)
    return {"status": "completed", "exit_code": 0}


def probed(cfg: LaunchConfig, script: Path, run_dir: Path) -> dict[str, Any]:
    """summary.json's `breakdown` and `probe` blocks (launch/probe_summary.py), or why there are none."""
    if not cfg.probe:
        return probe_summary.off("--no-probe")
    if script.suffix != ".py":
        return probe_summary.off(f"{script.name} is not a Python script (.py); only the monitor's samples describe it")
    return probe_summary.summarise(run_dir)


def _sets_batch_schedule(script: Path) -> bool:
    """Whether a Python script calls paratrain.batch_schedule (by any name ending so); a script that does not
    parse is let through, to fail with Python's own error."""
    if script.suffix != ".py":
        return False
    try:
        tree = ast.parse(script.read_text(errors="replace"))
    except SyntaxError:
        return True
    called = (node.func for node in ast.walk(tree) if isinstance(node, ast.Call))
    return any("batch_schedule" in (getattr(func, "attr", None), getattr(func, "id", None)) for func in called)


def scheduled(cfg: LaunchConfig, run_dir: Path) -> dict[str, Any]:
    """summary.json's `batch_schedule`: where the script's schedule started, ended and could go (rank 0's
    record, engine/script_schedule.py); nothing with a fixed batch or a script that never built one."""
    state = run_dir / "batch_schedule.json"
    if cfg.batch_schedule == "fixed" or not state.exists():
        return {}
    return {"batch_schedule": json.loads(state.read_text())}


def read_reports(reports: Path) -> dict[str, float]:
    """The last value of every metric the ranks reported; rank 0's win over the others'."""
    merged: dict[str, float] = {}
    for path in sorted(reports.glob("rank*.jsonl"), key=_rank_number, reverse=True):
        for record in json_records(path):
            merged.update(_floats(record.get("metrics", {})))
    return merged


def throughput(reports: Path) -> dict[str, Any]:
    """samples_per_s, and epoch times when the script timed its epochs, from rank 0's reports.

    A script reports either `samples_per_s` (its own figure, taken as is) or `samples` (training
    samples of one epoch, all ranks together) with `epoch_time_s` once per epoch; then the epoch
    time is the median of the epochs after the first (which pays for start-up), as for built-in
    workloads, and samples/s = samples / that time.
    """
    records = json_records(reports / "rank0.jsonl")
    epochs = [v["epoch_time_s"] for v in (_floats(r.get("metrics", {})) for r in records) if "epoch_time_s" in v]
    last: dict[str, float] = {}
    for record in records:
        last.update(_floats(record.get("metrics", {})))
    out: dict[str, Any] = {}
    if epochs:
        out["epoch_times_s"] = epochs
        out["epoch_time_s"] = steady_epoch_time(epochs)
    if "samples_per_s" in last:
        out["samples_per_s"] = float(last["samples_per_s"])
    elif epochs and "samples" in last:
        out["samples_per_s"] = float(last["samples"]) / out["epoch_time_s"]
    return out


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    """report() writes finite values as numbers and the others as "nan" or "inf"."""
    out = {}
    for name, value in metrics.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _rank_number(path: Path) -> int:
    digits = path.stem.removeprefix("rank")
    return int(digits) if digits.isdigit() else -1


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# Lightning checks its Trainer(devices * num_nodes) against the launcher's WORLD_SIZE before training and
# raises this; the usual cause is a devices count written into the script, which breaks as soon as the
# launch (or a `scale --script` point) starts another number of ranks.
LIGHTNING_WORLD = re.compile(
    r"You set `devices=(\d+)` and `num_nodes=(\d+)` in Lightning, but the product"
    r" \(\d+ \* \d+\) does not match the world size \((\d+)\)"
)


def _framework_fix(path: Path) -> str:
    """A framework's own error in a failed rank's log, turned into the one-line fix; "" if none is known."""
    if not path.exists():
        return ""
    found = LIGHTNING_WORLD.search(path.read_text(errors="replace"))
    if not found:
        return ""
    devices, nodes, world = found.groups()
    return (
        f"Lightning's Trainer(devices={devices}, num_nodes={nodes}) does not match the {world} rank(s) "
        f"started; set devices=int(os.environ['WORLD_SIZE']) and num_nodes=1 in your Trainer"
    )


# Python's fault handler (PYTHONFAULTHANDLER, set for every rank by worker_env) on a fatal signal:
# "Fatal Python error: Segmentation fault", then each thread's stack (innermost call first), the crashing one headed
# "Current thread".
FATAL_ERROR = re.compile(r"^Fatal Python error: (?P<what>.+)$", re.MULTILINE)
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)$', re.MULTILINE)


def _fatal_error(path: Path) -> str:
    """The fatal error a rank died of and where: the innermost line of Python it was running, and the innermost
    line of code of its own (neither Python's library nor an installed package) when that is another; "" if the
    log has none. A crash inside the probe's profiler window (torch.profiler's native code) says how to run
    without it."""
    if not path.exists():
        return ""
    text = path.read_text(errors="replace")
    fatal = list(FATAL_ERROR.finditer(text))
    if not fatal:
        return ""
    # Each thread's stack is a block of its own; the one that crashed is headed "Current thread", wherever it is.
    blocks = text[fatal[-1].end() :].split("\n\n")
    stack = next((b for b in blocks if b.lstrip().startswith("Current thread")), "")
    frames = list(FRAME.finditer(stack))
    if not frames:
        return fatal[-1]["what"]

    def line(frame: re.Match[str]) -> str:
        return f"{Path(frame['file']).name}:{frame['line']} ({frame['function']})"

    own = next((f for f in frames if not _installed(f["file"])), frames[0])
    said = f"{fatal[-1]['what']} in {line(frames[0])}" + (f", called from {line(own)}" if own is not frames[0] else "")
    if any(Path(f["file"]).parts[-3:] == ("launch", "probe", "window.py") for f in frames):
        said += f"; it crashed inside torch.profiler, run by the probe a few steps: {probe.TRACE_ENV}=0 turns it off"
    return said


def _installed(file: str) -> bool:
    """A file of Python's own library or of an installed package, not of the user's code (nor paratrain's)."""
    parts = Path(file).parts
    inside = (Path(sys.base_prefix), Path(sys.prefix))
    return "site-packages" in parts or "dist-packages" in parts or any(Path(file).is_relative_to(p) for p in inside)


def _last_line(path: Path) -> str:
    if not path.exists():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()[-20:] if line.strip()]
    return lines[-1][:300] if lines else ""
