"""The sweep driver: an Optuna study in shared storage, N trials at once, resumable, joinable.

Work is handed out in *items*: item i is repeat i % trials of combination i // trials. A driver
claims the next item under a lock that every driver of the study honours (a file lock beside a
journal storage, a PostgreSQL advisory lock for postgresql:// storage), so two drivers, or two
threads of one, never run the same item, and the budget is never overshot. An item whose trial
failed is claimed again while retryLimit allows; an item whose driver died (killed, machine
lost) is marked failed as "interrupted" and claimed again without counting against it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from paratrain.config import SweepConfig, TrainConfig, flag
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import SWEEP_FILE, write_json
from paratrain.runs.records import SweepResult, checked
from paratrain.sweep.space import SearchSpace, load_space, parse_parameter, parse_space
from paratrain.sweep.trial import (
    VAL_METRICS,
    BuiltinCommand,
    Outcome,
    ScriptCommand,
    Slot,
    TrialProcess,
    check_script,
    gpu_count,
    plan_slots,
    start_server,
)

JOURNAL_FILE = "study.journal"
SPEC_ATTR = "paratrain_sweep"
HEARTBEAT_S = 10.0  # a driver refreshes its running trials' heartbeat this often
STALE_AFTER_S = 60.0  # a running trial of another machine without a heartbeat this long is orphaned
BUILTIN_METRICS = (
    "val_loss",
    "val_accuracy",
    "test_loss",
    "test_accuracy",
    "train_loss",
    "samples_per_s",
    "epoch_time_s",
    "wall_time_s",
    "time_s",
    "global_batch_size",
    "lr",
    "tokens_per_s",
    "val_bits_per_byte",
    "mfu",
)
# What the tables show of a built-in trial's summary besides the objectives (time_s last).
BUILTIN_SHOWN = (
    "val_loss",
    "val_accuracy",
    "val_bits_per_byte",
    "test_accuracy",
    "train_loss",
    "samples_per_s",
    "tokens_per_s",
)
DEFAULT_VAL_SPLIT = 0.1  # a built-in sweep chooses on this fraction of the training set unless told otherwise


@dataclass
class Sweep:
    """Everything the workers share, rebuilt identically by every driver of the study."""

    space: SearchSpace
    command: ScriptCommand | BuiltinCommand
    workers_per_trial: int
    pruner: str
    trial_timeout: float | None
    out: Path
    spec: dict[str, Any]  # what is stored in the study, and compared on resume
    storage: Any = None  # the Optuna storage, once opened

    def last_step(self, params: dict[str, Any]) -> int | None:
        """A built-in trial reports once per epoch; a script's last step is unknown."""
        if isinstance(self.command, BuiltinCommand):
            values = {**self.command.train, **params}
            return int(values.get("epochs", TrainConfig.model_fields["epochs"].default)) - 1
        return None


# -- setting up ---------------------------------------------------------------------------------


def prepare(cfg: SweepConfig) -> tuple[Sweep, Any, ClaimLock, str, list[Slot]]:
    """Validate everything, then open (or create) the study: bad input leaves nothing on disk.
    Returns the sweep, the study, the claim lock, where the storage is, and the device slots."""
    if cfg.join is not None:
        return _join(cfg)
    raw, space = load_space(cfg.config)
    train = cfg.train if cfg.script else _with_validation(cfg.train, space)
    spec = {
        "config": raw,
        "script": str(cfg.script.resolve()) if cfg.script else None,
        "script_args": cfg.script_args,
        "param_style": cfg.param_style,
        "train": train,
        "workers_per_trial": cfg.workers_per_trial,
        "pruner": cfg.pruner,
        "trial_timeout": cfg.trial_timeout,
        "probe": cfg.probe,
    }
    sweep = _build(spec, space, cfg.out)
    slots = plan_slots(cfg.jobs, sweep.workers_per_trial, cfg.allow_oversubscribe, gpus=gpu_count())
    study_name = cfg.study_name or space.name
    storage, lock, where = open_storage(cfg.storage, cfg.out)
    sweep.storage = storage
    study = _open_study(storage, study_name, sweep, create=True)
    stored = study.user_attrs.get(SPEC_ATTR)
    if stored is None:
        study.set_user_attr(SPEC_ATTR, spec)
    elif _comparable(stored) != _comparable(spec):
        if not _extends_grid(_comparable(stored), _comparable(spec)):
            changed = sorted(k for k in spec if _comparable(stored).get(k) != _comparable(spec).get(k))
            raise UsageError(
                f"{where} already holds sweep {study_name!r} with a different {', '.join(changed)}; "
                "rerun the original command to resume it (adding numbers to a grid's discrete parameters "
                "extends it), or choose another --out / --study-name"
            )
        study.set_user_attr(SPEC_ATTR, spec)  # the extended grid, for reruns and --join
    cfg.out.mkdir(parents=True, exist_ok=True)
    return sweep, study, lock, where, slots


def _comparable(spec: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(spec, default=str))


def _extends_grid(stored: dict[str, Any], spec: dict[str, Any]) -> bool:
    """True when `spec` is the stored grid sweep with values added to parameters' lists and
    nothing else changed: its finished combinations stay valid, and only the new ones run."""
    old, new = stored["config"], spec["config"]
    if old.get("algorithm") != "grid" or new.get("algorithm") != "grid":
        return False
    if {k: v for k, v in stored.items() if k != "config"} != {k: v for k, v in spec.items() if k != "config"}:
        return False
    if {k: v for k, v in old.items() if k != "parameters"} != {k: v for k, v in new.items() if k != "parameters"}:
        return False
    old_params, new_params = old.get("parameters") or {}, new.get("parameters") or {}
    if list(old_params) != list(new_params):
        return False
    for name, before in old_params.items():
        after = new_params[name]
        if before == after:
            continue
        if {k: v for k, v in before.items() if k != "values"} != {k: v for k, v in after.items() if k != "values"}:
            return False
        kept = {json.dumps(v) for v in before.get("values") or []}
        if not kept <= {json.dumps(v) for v in after.get("values") or []}:
            return False
        if not all(parse_parameter(name, version, "").extensible for version in (before, after)):
            return False
    return True


def _with_validation(train: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """A built-in sweep chooses by a metric, so it measures on a validation split carved from the
    training set (stratified; DEFAULT_VAL_SPLIT unless --val-split says otherwise), never on the
    test split: test accuracy stays an honest estimate of the chosen configuration."""
    if "val_split" in {p.name for p in space.parameters}:
        return train
    if "val_split" not in train:
        return {**train, "val_split": DEFAULT_VAL_SPLIT}
    chosen = [m for m in space.metrics if m in VAL_METRICS]
    if not train["val_split"] and chosen:
        raise UsageError(
            f"{flag('val_split')} 0 leaves no validation split, so {chosen[0]} would be measured on the "
            f"test split and the sweep would choose on it; drop {flag('val_split')} (the sweep's default is "
            f"{DEFAULT_VAL_SPLIT}) or give a fraction such as 0.2"
        )
    return train


def _join(cfg: SweepConfig) -> tuple[Sweep, Any, ClaimLock, str, list[Slot]]:
    target = cfg.join
    assert target is not None
    is_url = "://" in target
    if not is_url and not (Path(target) / JOURNAL_FILE).is_file():
        raise UsageError(
            f"--join {target}: no sweep there (no {JOURNAL_FILE}); pass a sweep directory or a storage URL"
        )
    if is_url and cfg.out is None:
        raise UsageError("--join URL needs --out DIR on this machine for its trials' directories")
    out = cfg.out or Path(target)
    storage, lock, where = open_storage(target if is_url else None, Path(target) if not is_url else out)
    import optuna

    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    name = cfg.study_name or (names[0] if len(names) == 1 else None)
    if name not in names:
        raise UsageError(f"--join {target}: pass --study-name, one of: {', '.join(names) or '(no studies)'}")
    study = optuna.load_study(study_name=name, storage=storage)
    spec = study.user_attrs.get(SPEC_ATTR)
    if spec is None:
        raise UsageError(f"--join {target}: study {name!r} was not made by paratrain sweep")
    space = parse_space(spec["config"], f"the stored search space of {name!r}")
    sweep = _build(spec, space, out)
    sweep.storage = storage
    slots = plan_slots(cfg.jobs, sweep.workers_per_trial, cfg.allow_oversubscribe, gpus=gpu_count())
    study = _open_study(storage, name, sweep, create=False, worker_salt=os.getpid())
    out.mkdir(parents=True, exist_ok=True)
    return sweep, study, lock, where, slots


def _build(spec: dict[str, Any], space: SearchSpace, out: Path) -> Sweep:
    if spec["script"] is not None:
        check_script(Path(spec["script"]))
        command: ScriptCommand | BuiltinCommand = ScriptCommand(
            spec["script"], tuple(spec["script_args"]), spec["param_style"], spec.get("probe", True)
        )
    else:
        command = BuiltinCommand(spec["train"])
        _check_builtin(space, spec["train"])
    return Sweep(space, command, spec["workers_per_trial"], spec["pruner"], spec["trial_timeout"], out, spec)


def _check_builtin(space: SearchSpace, train: dict[str, Any]) -> None:
    """A built-in trial is `paratrain train`: the parameters must be its options, the metrics its summary's."""
    fields = set(TrainConfig.model_fields)
    derived = [space.lr_scaling.lr_param] if space.lr_scaling else []
    for param in [p.name for p in space.parameters] + derived:
        if param not in fields or param in ("workers", "run_dir", "resume"):
            raise UsageError(
                f"parameter {param!r} is not a train option a trial can vary; "
                f"name parameters after train flags ({flag('batch_size')} -> batch_size), or use --script"
            )
    for metric in space.metrics:
        if metric not in BUILTIN_METRICS:
            raise UsageError(
                f"metric {metric!r} is not in a built-in trial's summary; choose from {', '.join(BUILTIN_METRICS)}"
            )
        if metric.startswith("test_"):
            raise UsageError(
                f"metric {metric!r} would choose on the test split; optimise {metric.replace('test_', 'val_')} "
                f"(measured on a validation split carved from the training set, {flag('val_split')}); "
                f"{metric} is still recorded and shown"
            )
    swept = {p.name for p in space.parameters}
    if (
        train.get("lr_scaling", "linear") != "none"
        and "batch_size" in swept
        and "base_batch_size" not in train
        and space.lr_scaling is None
    ):
        raise UsageError(
            f"sweeping batch_size with {flag('lr_scaling')} {train.get('lr_scaling', 'linear')} needs "
            f"{flag('base_batch_size')} (the batch --lr is meant for), or {flag('lr_scaling')} none for a fixed LR"
        )
    # A trial that cannot even be configured would fail every time: check one now, and load its
    # data here, once, so that a dataset still to be decoded is not decoded by every trial at once
    # (and a bad --data-dir is an input error, not a sweep of failures).
    from paratrain.config import validate
    from paratrain.workloads import check_model, load_data

    probe = {**train, **space.grid()[0], **space.derived(space.grid()[0])} if space.algorithm == "grid" else dict(train)
    cfg = validate(TrainConfig, probe)
    check_model(cfg)
    load_data(cfg)


def prunes(space: SearchSpace, choice: str) -> bool:
    """Whether trials may be pruned. Never by batch: a larger batch takes fewer steps per epoch, so
    at an equal epoch it is behind by construction, and the median pruner would discard exactly the
    large batches a batch study is run to see. A grid is run to see every combination, so it prunes
    only when --pruner median asks; several metrics have no single median."""
    if space.multi_objective or any("batch" in p.name for p in space.parameters):
        return False
    return choice == "median" or (choice == "auto" and space.algorithm != "grid")


def _open_study(storage: Any, name: str, sweep: Sweep, create: bool, worker_salt: int = 0) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = sweep.space
    directions = list(space.directions)
    # Optuna's defaults: no pruning before 5 trials have finished; any epoch may be pruned after.
    pruner = optuna.pruners.MedianPruner() if prunes(space, sweep.pruner) else optuna.pruners.NopPruner()
    sampler = _sampler(space, space.seed + worker_salt)
    if create:
        return optuna.create_study(
            storage=storage, study_name=name, directions=directions, sampler=sampler, pruner=pruner, load_if_exists=True
        )
    return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)


def _sampler(space: SearchSpace, seed: int) -> Any:
    """bayes: TPE (default), GP, or NSGA-II (the default for several metrics). grid and random
    trials arrive with their values fixed, so their sampler only has to exist."""
    import optuna

    if space.algorithm != "bayes":
        return optuna.samplers.RandomSampler(seed=seed)
    budget = space.combinations()
    startup = max(2, min(10, budget // 3))  # random trials before the model takes over
    if space.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if space.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, budget // 4)))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)


def open_storage(url: str | None, out: Path) -> tuple[Any, ClaimLock, str]:
    import optuna

    if url is None:
        out.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend

        backend = JournalFileBackend(str(out / JOURNAL_FILE))
        return optuna.storages.JournalStorage(backend), FileClaimLock(out / "sweep.lock"), str(out / JOURNAL_FILE)
    try:
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=None)
    except ImportError as exc:
        raise UsageError(
            f"--storage {_safe(url)}: the database driver is missing ({exc}); pip install 'paratrain[postgres]'"
        ) from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--storage {_safe(url)} cannot be opened: {first}") from None
    lock: ClaimLock = AdvisoryClaimLock(storage) if url.startswith("postgresql") else FileClaimLock(out / "sweep.lock")
    return storage, lock, _safe(url)


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}@{host}"
    return url


# -- the lock every driver honours ------------------------------------------------------------


class ClaimLock:
    def __init__(self) -> None:
        self._threads = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._threads, self._across_processes():
            yield

    def _across_processes(self) -> Any:
        raise NotImplementedError


class FileClaimLock(ClaimLock):
    """flock(2) on a file beside the journal: every driver on this machine (or on a shared filesystem)."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    @contextmanager
    def _across_processes(self) -> Iterator[None]:
        with open(self.path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class AdvisoryClaimLock(ClaimLock):
    """A PostgreSQL advisory lock: every driver of the study, on any machine."""

    def __init__(self, storage: Any):
        super().__init__()
        self.engine = storage.engine
        self.key = int.from_bytes(hashlib.sha256(b"paratrain-sweep-claim").digest()[:7], "big")

    @contextmanager
    def _across_processes(self) -> Iterator[None]:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                conn.commit()


# -- claiming work --------------------------------------------------------------------------


@dataclass
class Claim:
    trial: Any  # optuna.Trial, RUNNING and owned by this driver
    params: dict[str, Any]  # sampled and derived
    item: int
    repeat: int
    attempt: int


def _running() -> Any:
    from optuna.trial import TrialState

    return TrialState.RUNNING


def _owner() -> dict[str, Any]:
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}


def _orphaned(trial: Any, me: dict[str, Any]) -> bool:
    """A RUNNING trial whose driver is gone."""
    owner = trial.user_attrs.get("owner") or {}
    if owner == me:
        return False
    if owner.get("host") == me["host"]:
        try:
            return psutil.Process(owner["pid"]).create_time() != owner["started"]
        except (psutil.NoSuchProcess, KeyError):
            return True
    return time.time() - trial.user_attrs.get("heartbeat", 0) > STALE_AFTER_S


class Claimer:
    def __init__(
        self, sweep: Sweep, study: Any, lock: ClaimLock, n_trials: int | None = None, timeout: float | None = None
    ):
        self.sweep, self.study, self.lock = sweep, study, lock
        self.me = _owner()
        space = sweep.space
        self._grid = space.grid()[: space.combinations()] if space.algorithm == "grid" else None
        self.items = space.combinations() * space.repeats
        # Optuna's optimize(n_trials=, timeout=): limits on what this driver starts.
        self.n_trials, self.timeout = n_trials, timeout
        self.started = 0
        self.clock = time.monotonic()
        self.stopped_by: str | None = None  # "n_trials" | "timeout", once a limit kept a trial from starting

    def next(self) -> Claim | None:
        """The next item to run, claimed for this driver, or None when nothing is left to start."""
        from optuna.trial import TrialState

        with self.lock.held():
            trials = self.study.get_trials(deepcopy=False)
            for t in trials:
                if t.state == TrialState.RUNNING and "item" in t.user_attrs and _orphaned(t, self.me):
                    record_end(
                        self.sweep,
                        self.study,
                        t.number,
                        Outcome("FAIL", reason="interrupted: its sweep driver stopped"),
                        interrupted=True,
                    )
            trials = self.study.get_trials(deepcopy=False)
            by_item: dict[int, list[Any]] = defaultdict(list)
            for t in trials:
                if "item" in t.user_attrs:
                    by_item[t.user_attrs["item"]].append(t)
            for item in sorted(by_item):
                attempts = sorted(by_item[item], key=lambda t: t.number)
                last = attempts[-1]
                if last.state != TrialState.FAIL:
                    continue
                failures = sum(
                    1 for t in attempts if t.state == TrialState.FAIL and not t.user_attrs.get("interrupted")
                )
                if last.user_attrs.get("interrupted") or failures <= self.sweep.space.retry_limit:
                    sampled = {k: v for k, v in last.params.items()}
                    return self._start(item, sampled, attempt=len(attempts))
            if self._grid is not None:
                return self._next_combination(by_item)
            item = max(by_item) + 1 if by_item else 0
            if item >= self.items:
                return None
            return self._start(item, self._params_for(item, by_item), attempt=0)

    def _next_combination(self, by_item: dict[int, list[Any]]) -> Claim | None:
        """A grid's next item is the first (combination, repeat) no trial has claimed: a grid
        extended with new values runs its new combinations and redoes none of the finished ones."""
        assert self._grid is not None
        claimed = {
            (_combination(attempts[0].params), attempts[0].user_attrs.get("repeat", 0)) for attempts in by_item.values()
        }
        for combo in self._grid:
            for repeat in range(self.sweep.space.repeats):
                if (_combination(combo), repeat) not in claimed:
                    return self._start(max(by_item, default=-1) + 1, combo, attempt=0, repeat=repeat)
        return None

    def still_running(self) -> bool:
        return any("item" in t.user_attrs for t in self.study.get_trials(deepcopy=False, states=(_running(),)))

    def _params_for(self, item: int, by_item: dict[int, list[Any]]) -> dict[str, Any] | None:
        space = self.sweep.space
        combo, repeat = divmod(item, space.repeats)
        if space.algorithm == "random":
            return space.draw(combo)
        if repeat > 0:  # bayes: a repeat reuses its combination's sampled values
            return dict(by_item[combo * space.repeats][0].params)
        return None  # bayes: the sampler chooses

    def _start(self, item: int, fixed: dict[str, Any] | None, attempt: int, repeat: int | None = None) -> Claim | None:
        if self.n_trials is not None and self.started >= self.n_trials:
            self.stopped_by = "n_trials"
            return None
        if self.timeout is not None and time.monotonic() - self.clock >= self.timeout:
            self.stopped_by = "timeout"
            return None
        self.started += 1
        space = self.sweep.space
        if fixed is not None:
            self.study.enqueue_trial(fixed, skip_if_exists=False)
        trial = self.study.ask(space.distributions())
        params = {**trial.params, **space.derived(trial.params)}
        repeat = item % space.repeats if repeat is None else repeat
        for key, value in (
            ("item", item),
            ("repeat", repeat),
            ("attempt", attempt),
            ("owner", self.me),
            ("heartbeat", time.time()),
            ("derived", space.derived(trial.params)),
        ):
            trial.set_user_attr(key, value)
        return Claim(trial, params, item, repeat, attempt)


def _combination(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _trial_id(sweep: Sweep, study: Any, number: int) -> int:
    storage = sweep.storage
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def record_end(sweep: Sweep, study: Any, number: int, outcome: Outcome, interrupted: bool = False) -> None:
    """Store a trial's end (this driver's or an orphan's): its values, or its state and the reason."""
    from optuna.trial import TrialState

    trial_id = _trial_id(sweep, study, number)
    attrs = {
        "reason": outcome.reason,
        "metrics": outcome.metrics,
        "duration_s": outcome.duration_s,
        "ended_at": time.time(),
        "launch_overhead_s": outcome.launch_overhead_s,
        "interrupted": interrupted,
    }
    for key, value in attrs.items():
        sweep.storage.set_trial_user_attr(trial_id, key, value)
    state = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED, "FAIL": TrialState.FAIL}[outcome.state]
    study.tell(number, outcome.values if state == TrialState.COMPLETE else None, state=state, skip_if_finished=True)


# -- running --------------------------------------------------------------------------------

Listener = Callable[[str, dict[str, Any]], None]  # ("start" | "report" | "end", info)


class SweepFailed(RunFailed):
    """A driver thread died of an exception: the sweep stopped; sweep.json says what was running."""


class Driver:
    """N worker threads, one per slot; each claims an item, runs its trial, records the end."""

    def __init__(
        self,
        sweep: Sweep,
        study: Any,
        lock: ClaimLock,
        slots: list[Slot],
        listener: Listener,
        n_trials: int | None = None,
        timeout: float | None = None,
    ):
        self.sweep, self.study, self.slots, self.listener = sweep, study, slots, listener
        self.claimer = Claimer(sweep, study, lock, n_trials, timeout)
        self.stopping = threading.Event()
        self.running: dict[int, TrialProcess] = {}
        self._threads: list[threading.Thread] = []
        self._current: dict[str, dict[str, Any]] = {}  # thread name -> the trial it is running
        self._failure_lock = threading.Lock()
        self.failure: dict[str, Any] | None = None  # the first exception of a driver thread

    def run(self) -> None:
        # A trial that outlived a killed sweep would keep its cores busy while the resumed sweep
        # hands them out again: trials die with the fork server, which dies with this thread.
        start_server(builtin=isinstance(self.sweep.command, BuiltinCommand))
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._work, slot), name=f"slot-{slot.index}", daemon=True)
            for slot in self.slots
        ]
        beat = threading.Thread(target=self._guarded, args=(self._heartbeat,), name="heartbeat", daemon=True)
        for thread in self._threads:
            thread.start()
        beat.start()
        try:
            while any(t.is_alive() for t in self._threads):
                for thread in self._threads:
                    thread.join(0.2)
        finally:
            self.stopping.set()  # Ctrl-C lands here: the workers stop their trials and record them
            for thread in self._threads:
                thread.join()
        if self.failure is not None:
            raise SweepFailed(self.failure["message"])

    def _guarded(self, work: Callable[..., None], *args: Any) -> None:
        """Run a thread's work. An exception stops the whole sweep: a thread that died alone
        would leave its share of the budget undone while the sweep went on to exit 0."""
        try:
            work(*args)
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        name = threading.current_thread().name
        trial = self._current.pop(name, None)
        first_line = (str(exc).strip().splitlines() or [""])[0]
        error = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        with self._failure_lock:
            if self.failure is None:
                during = f" during trial {trial['number']}" if trial else ""
                self.failure = {
                    "thread": name,
                    "error": error,
                    "traceback": traceback.format_exc(),
                    "trial": trial,
                    "running": sorted(self.running),
                    "message": f"the sweep stopped: {name} failed{during}: {error} (the trials running then are "
                    "recorded as interrupted and run again when the sweep is rerun; traceback in "
                    f"{self.sweep.out / SWEEP_FILE})",
                }
        self.stopping.set()  # the other slots stop their trials and record them as interrupted
        if trial is None:
            return
        # The trial is not to blame: stopped and recorded as interrupted, it runs again on a rerun
        # without counting against retryLimit.
        proc = self.running.pop(trial["number"], None)
        if proc is not None:
            proc.stop()
        try:
            record_end(
                self.sweep,
                self.study,
                trial["number"],
                Outcome("FAIL", reason=f"interrupted: the sweep failed ({error})"),
                interrupted=True,
            )
        except Exception:  # the storage itself may be what failed; the next driver finds it orphaned
            pass

    def _work(self, slot: Slot) -> None:
        while not self.stopping.is_set():
            claim = self.claimer.next()
            if claim is not None:
                self._run(claim, slot)
            elif self.claimer.stopped_by is None and self.claimer.still_running():
                # Nothing to start, but trials are running (here or on another driver): one may
                # fail and need its retry, and sweep.json should show the study finished.
                self.stopping.wait(1.0)
            else:
                return

    def _run(self, claim: Claim, slot: Slot) -> None:
        number = claim.trial.number
        trial_dir = self.sweep.out / "trials" / f"{number:04d}"
        claim.trial.set_user_attr("trial_dir", str(trial_dir))
        info = {"number": number, "params": claim.params, "slot": slot.describe(), "attempt": claim.attempt}
        try:
            proc = TrialProcess(
                self.sweep.command, claim.params, trial_dir, slot, claim.repeat, self.sweep.workers_per_trial, number
            )
        except Exception as exc:
            outcome = Outcome("FAIL", reason=f"could not start: {exc}")
            record_end(self.sweep, self.study, number, outcome)
            self.listener("end", {**info, "state": "FAIL", "reason": outcome.reason})
            return
        self.running[number] = proc
        self._current[threading.current_thread().name] = info
        claim.trial.set_user_attr("started_at", proc.started_unix)
        self.listener("start", info)
        stopped_because: tuple[str, str] | None = None  # (state, reason)
        metric = self.sweep.space.metrics[0]
        timeout = self.sweep.trial_timeout
        last_step = self.sweep.last_step(claim.params)
        while True:
            alive = proc.running()  # read before the reports, so the last ones are never missed
            for step, metrics in proc.new_reports():
                self.listener("report", {**info, "step": step, "metrics": metrics})
                if self.sweep.space.multi_objective or step is None or metric not in metrics or stopped_because:
                    continue
                claim.trial.report(metrics[metric], step)
                # Pruning a trial that has finished training would only throw its result away.
                if alive and step != last_step and claim.trial.should_prune():
                    # A built-in trial reports once per epoch, so its step is an epoch.
                    unit = "epoch" if isinstance(self.sweep.command, BuiltinCommand) else "step"
                    why = f"pruned at {unit} {step}: {metric} {metrics[metric]:.4g} worse than the median"
                    stopped_because = ("PRUNED", why)
                    proc.stop()
            if not alive:
                break
            if stopped_because is None and timeout is not None and proc.elapsed() > timeout:
                stopped_because = ("FAIL", f"timed out after {timeout:g} s")
                proc.stop()
            if stopped_because is None and self.stopping.is_set():
                stopped_because = ("FAIL", "interrupted: the sweep was stopped")
                proc.stop()
            proc.wait(0.25)
        del self.running[number]
        outcome = proc.outcome(self.sweep.space.metrics)
        if stopped_because is not None:
            outcome.state, outcome.reason, outcome.values = stopped_because[0], stopped_because[1], None
        interrupted = stopped_because is not None and stopped_because[1].startswith("interrupted")
        record_end(self.sweep, self.study, number, outcome, interrupted=interrupted)
        self.listener(
            "end",
            {
                **info,
                "state": outcome.state,
                "values": outcome.values,
                "reason": outcome.reason,
                "duration_s": outcome.duration_s,
                "metrics": outcome.metrics,
            },
        )
        del self._current[threading.current_thread().name]

    def _heartbeat(self) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        while not self.stopping.wait(HEARTBEAT_S):
            for number in list(self.running):
                try:
                    self.sweep.storage.set_trial_user_attr(
                        _trial_id(self.sweep, self.study, number), "heartbeat", time.time()
                    )
                except UpdateFinishedTrialError:  # it finished meanwhile: nothing to keep alive
                    pass


def run_sweep(
    cfg: SweepConfig,
    listener: Listener = lambda kind, info: None,
    on_ready: Callable[[Sweep, list[Slot], str, int, int], None] = lambda *a: None,
) -> dict[str, Any]:
    """Run (or resume, or join) a sweep to the end of its budget; returns what sweep.json holds."""
    if cfg.join is None:
        # The fork server imports torch (about 4 s here) in its own process while this one
        # validates the input and opens the study.
        start_server(builtin=cfg.script is None)
    sweep, study, lock, where, slots = prepare(cfg)
    driver = Driver(sweep, study, lock, slots, listener, cfg.n_trials, cfg.timeout)
    finished = {
        t.user_attrs["item"]
        for t in study.get_trials(deepcopy=False)
        if "item" in t.user_attrs and t.state.name in ("COMPLETE", "PRUNED")
    }
    on_ready(sweep, slots, where, driver.claimer.items, len(finished))
    try:
        driver.run()
    except SweepFailed:
        # sweep.json still records every trial's end, and what failed while which trials ran.
        try:
            partial = collect(sweep, study, where)
        except Exception:  # the storage may be what failed
            partial = {"name": sweep.space.name, "out": str(sweep.out)}
        write_json(sweep.out / SWEEP_FILE, checked(SweepResult, {**partial, "failure": driver.failure}))
        raise
    result = collect(sweep, study, where)
    if driver.claimer.stopped_by is not None:
        result["stopped_by"] = {driver.claimer.stopped_by: getattr(cfg, driver.claimer.stopped_by)}
    write_json(sweep.out / SWEEP_FILE, checked(SweepResult, result))
    return result


# -- results --------------------------------------------------------------------------------


def collect(sweep: Sweep, study: Any, where: str) -> dict[str, Any]:
    """sweep.json: every trial, the best one (or the Pareto front), and the space it came from."""
    space = sweep.space
    rows = [_row(t, space) for t in study.get_trials(deepcopy=False) if "item" in t.user_attrs]
    done = [r for r in rows if r["state"] == "COMPLETE"]
    if space.multi_objective:
        front = {t.number for t in study.best_trials} if done else set()
        best: dict[str, Any] = {"pareto_front": [r for r in rows if r["number"] in front]}
    else:
        sign = 1 if space.directions[0] == "minimize" else -1
        best = min(done, key=lambda r: sign * r["value"]) if done else {}
    builtin = isinstance(sweep.command, BuiltinCommand)
    return {
        "name": space.name,
        "out": str(sweep.out),
        "algorithm": space.algorithm,
        "sampler": space.sampler,
        "metric": list(space.metrics),
        "objective": list(space.directions),
        "storage": where,
        "mode": "builtin" if builtin else "script",
        **({"val_split": sweep.command.train.get("val_split")} if builtin else {"script": sweep.command.script}),
        "recorded_metrics": _recorded_metrics(rows, space.metrics, builtin),
        "space": space.to_dict(),
        "items": space.combinations() * space.repeats,
        "counts": {s: sum(1 for r in rows if r["state"] == s) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")},
        "parallelism": _parallelism(rows),
        "trials": rows,
        "best": best,
    }


def _recorded_metrics(rows: list[dict[str, Any]], objectives: tuple[str, ...], builtin: bool) -> list[str]:
    """The metrics the tables show: the objectives, every other metric a script's trials recorded
    (a built-in trial's summary: BUILTIN_SHOWN), and the trial time last."""
    seen = dict.fromkeys(m for r in rows for m in r["metrics"])
    others = [m for m in (BUILTIN_SHOWN if builtin else seen) if m in seen and m not in objectives and m != "time_s"]
    return [*objectives, *others, *(["time_s"] if "time_s" not in objectives else [])]


def _parallelism(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether running trials side by side paid off: the trials' summed durations against the wall
    time during which at least one of them ran (gaps between resumed runs of the sweep excluded)."""
    spans = sorted(
        (r["started_at"], r["started_at"] + r["duration_s"])
        for r in rows
        if r["started_at"] is not None and r["duration_s"] is not None
    )
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    total = sum(stop - start for start, stop in spans)
    return {
        "trials": len(spans),
        "trial_time_s": total,
        "wall_time_s": busy,
        "speedup": total / busy if busy > 0 else None,
    }


def _row(t: Any, space: SearchSpace) -> dict[str, Any]:
    attrs = t.user_attrs
    values = list(t.values) if t.values is not None and t.state.name == "COMPLETE" else None
    return {
        "number": t.number,
        "params": {**t.params, **(attrs.get("derived") or {})},
        "value": (values[0] if len(space.metrics) == 1 else values) if values else None,
        "state": t.state.name,
        "duration_s": attrs.get("duration_s"),
        "run_dir": attrs.get("trial_dir"),
        "reason": attrs.get("reason"),
        "metrics": attrs.get("metrics") or {},
        "item": attrs["item"],
        "repeat": attrs.get("repeat", 0),
        "attempt": attrs.get("attempt", 0),
        "launch_overhead_s": attrs.get("launch_overhead_s"),
        "started_at": attrs.get("started_at"),
        "ended_at": attrs.get("ended_at"),
        "intermediate": {str(k): v for k, v in sorted(t.intermediate_values.items())},
    }
