"""What the doctor reads: a run directory's files turned into the figures its checks need.

Only files are read (config.json, summary.json, metrics.jsonl, system.jsonl), never live objects,
so a finished, failed or copied run can be diagnosed anywhere.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.measure.monitor import SYSTEM_FILE
from paratrain.runs import RunDir
from paratrain.runs.records import MachineLoad, Summary, read_summary_record

PHASES = ("data_s", "compute_s", "comm_s", "optimizer_s", "other_s")
IDLE_CPU_PERCENT = 10.0  # a rank below this CPU % (100 = one core) is idle; a GPU below this utilisation too


@dataclass
class Phase:
    """A span of the run on the unix clock: an epoch's training, or the evaluation (and checkpoint)
    between one epoch's end and the next one's start."""

    kind: str  # "train" or "eval"
    epoch: int
    start: float
    end: float


@dataclass
class RunEvidence:
    path: Path
    config: dict[str, Any]
    summary: Summary | None  # None: the run wrote none (killed, or still running)
    events: list[dict[str, Any]]
    system: list[dict[str, Any]] = field(default_factory=list)

    # -- configuration --------------------------------------------------------------------
    @property
    def resolved(self) -> dict[str, Any]:
        return self.config.get("resolved", {})

    @property
    def is_script(self) -> bool:
        """A `paratrain launch` run of the user's own script (no built-in training loop)."""
        return "script" in self.config

    @property
    def workers(self) -> int:
        workers = self.summary and self.summary.workers
        return int(workers or self.config.get("workers") or self.config.get("nproc") or 1)

    @property
    def batch_size(self) -> int | None:
        """Samples per worker per micro-step: the run's, else the one configured."""
        return (self.summary and self.summary.batch_size) or self.config.get("batch_size")

    @property
    def grad_accum(self) -> int:
        return int((self.summary and self.summary.grad_accum) or self.config.get("grad_accum") or 1)

    @property
    def global_batch_size(self) -> int | None:
        return (self.summary and self.summary.global_batch_size) or self.resolved.get("global_batch_size")

    @property
    def grown_batch(self) -> dict[str, Any] | None:
        """summary.json's `batch_schedule` block: the batch grew during the run (--batch-schedule warmup or
        adaptive), from the batch the fields above give to the `final_` ones."""
        return (self.summary and self.summary.batch_schedule) or None

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each taking its share of the global batch: the workers, except where ranks
        share a batch (a pipeline's stages, a tensor-parallel group)."""
        g, batch = self.global_batch_size, self.batch_size
        if g and batch:
            return max(1, g // (batch * self.grad_accum))
        return self.workers

    @property
    def dataset(self) -> str | None:
        """The dataset's name, else the workload's (which names its dataset)."""
        return (self.summary and self.summary.dataset) or self.config.get("dataset") or self.config.get("workload")

    @property
    def machine_load(self) -> MachineLoad:
        """What else ran on the run's cores (empty: not measured)."""
        return (self.summary and self.summary.machine_load) or MachineLoad()

    @property
    def threads(self) -> int | None:
        return self.resolved.get("threads_per_worker") or self.config.get("threads_per_worker")

    @property
    def on_cpu(self) -> bool:
        return self.resolved.get("device", "cpu") == "cpu" and not self.gpu_samples

    @property
    def cores(self) -> int | None:
        """Cores the ranks could run on: the launcher's measurement (machine_load) or the monitor's
        per-core readings."""
        if self.machine_load.cores:
            return self.machine_load.cores
        host = [s for s in self.system if s["kind"] == "host"]
        return len(host[0]["cpu_percent"]) if host else None

    # -- timing ---------------------------------------------------------------------------
    @property
    def epochs(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "epoch"]

    @property
    def step_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "step"]

    @property
    def breakdown(self) -> dict[str, float]:
        """Seconds per optimizer step by phase: the summary's, else the last epoch's (a failed run)."""
        if self.summary and self.summary.breakdown:
            return {p: getattr(self.summary.breakdown, p) or 0.0 for p in PHASES}
        if self.epochs:
            return {p: float(self.epochs[-1]["breakdown"].get(p, 0.0)) for p in PHASES}
        return {}

    @property
    def step_s(self) -> float:
        return sum(self.breakdown.values())

    def share(self, phase: str) -> float:
        return self.breakdown.get(phase, 0.0) / self.step_s if self.step_s > 0 else 0.0

    @property
    def epoch_times(self) -> list[float]:
        return list((self.summary and self.summary.epoch_times_s) or [e["epoch_time_s"] for e in self.epochs])

    @property
    def start_unix(self) -> float | None:
        """The unix time of the metrics' `time` 0, to line events up with system.jsonl.

        Events' `time` counts from the trainer's creation, while the `start` event's `unix_time` is
        read when training begins, right before the first epoch: so `time` 0 is `unix_time` minus the
        first epoch's `time_start` (exact to the few microseconds between the two readings)."""
        start = next((e for e in self.events if e.get("event") == "start"), None)
        if not start or "unix_time" not in start:
            return None
        first = next((e for e in self.epochs if e.get("step", 0) > start.get("step", 0)), None)
        return start["unix_time"] - (first["time_start"] if first else 0.0)

    def phases(self) -> list[Phase]:
        """Training and evaluation spans on the unix clock (empty without a start event). The span
        after the last epoch runs to the last monitor sample or the run's training time."""
        origin = self.start_unix
        if origin is None:
            return []
        epochs = self.epochs
        spans = []
        train_end = self.summary and self.summary.train_time_s
        for i, e in enumerate(epochs):
            spans.append(Phase("train", e["epoch"], origin + e["time_start"], origin + e["time_end"]))
            after = epochs[i + 1]["time_start"] if i + 1 < len(epochs) else train_end
            if after is not None and after > e["time_end"]:
                spans.append(Phase("eval", e["epoch"], origin + e["time_end"], origin + after))
        return spans

    @property
    def has_steps(self) -> bool:
        """Anything measured: optimizer steps (a built-in run) or monitor samples of the ranks (a script)."""
        return bool(
            self.epochs
            or (self.summary and (self.summary.breakdown or self.summary.steps))
            or any(s["kind"] == "rank" for s in self.system)
        )

    # -- probe (launched scripts: launch/probe.py, launch/probe_summary.py) ---------------------
    @property
    def probe(self) -> dict[str, Any]:
        return (self.summary and self.summary.probe) or {}

    @property
    def probe_ranks(self) -> list[dict[str, Any]]:
        """Per rank, what the probe measured over its steady steps; empty without a working probe."""
        return [r for r in self.probe.get("ranks", []) if "phases_s" in r] if self.probe.get("status") == "on" else []

    def rank_phase(self, phase: str) -> list[float]:
        """Seconds per step in `phase` (a probe phase: data, forward, ..., eval, checkpoint), per rank."""
        return [r["phases_s"][phase] for r in self.probe_ranks]

    @property
    def all_reduce_s(self) -> float:
        """DDP's all-reduce's own time per step, without the waits for other ranks (launch/probe_summary.py
        own_time_s); a run directory written before it kept only each rank's mean: the least of them."""
        return self.probe.get("all_reduce_s", min(self.rank_phase("comm")))

    @property
    def collective_own_s(self) -> float:
        """The script's own collectives' time per step, without the waits for other ranks, as all_reduce_s."""
        return self.probe.get("collective_own_s", min(self.rank_phase("collective")))

    # -- monitor --------------------------------------------------------------------------
    @property
    def rank_samples(self) -> dict[int, list[dict[str, Any]]]:
        ranks: dict[int, list[dict[str, Any]]] = {}
        for s in self.system:
            if s["kind"] == "rank":
                ranks.setdefault(int(s["rank"]), []).append(s)
        return dict(sorted(ranks.items()))

    @property
    def core_contention(self) -> dict[int, float]:
        """Per rank pinned to cores no other rank runs on: the share of those cores other work took over the
        monitor's samples, their busy time less the rank's and its children's (its DataLoader workers are its own
        work). One busy core slows its rank alone, which the run's average over all cores understates."""
        return {rank: min(1.0, sum(shares) / len(shares)) for rank, shares in self._core_contention_samples.items()}

    @property
    def contention_change(self) -> float | None:
        """The most other work's share of a rank's own cores changed between the first and the last third of the
        monitor's samples (None: no rank's own cores were read, so whether it stayed put is unknown). Contention that
        stayed put slowed the early steps as much as the late ones: it makes no trend, and no gap between two
        moments of the run."""
        changes = [
            abs(sum(shares[-(len(shares) // 3) :]) - sum(shares[: len(shares) // 3])) / (len(shares) // 3)
            for shares in self._core_contention_samples.values()
            if len(shares) >= 3
        ]
        return max(changes) if changes else None

    @property
    def _core_contention_samples(self) -> dict[int, list[float]]:
        """core_contention's samples, per rank, in time order."""
        hosts = {s["time"]: s["cpu_percent"] for s in self.system if s["kind"] == "host"}
        samples = self.rank_samples
        cores = {rank: tuple(s[-1].get("cores") or ()) for rank, s in samples.items()}
        out = {}
        for rank, mine in cores.items():
            if not mine or any(set(mine) & set(theirs) for other, theirs in cores.items() if other != rank):
                continue
            shares = [
                max(0.0, sum(hosts[s["time"]][c] for c in mine) - s["tree_cpu_percent"]) / (100 * len(mine))
                for s in sorted(samples[rank], key=lambda s: s["time"])
                if "tree_cpu_percent" in s and s["time"] in hosts and max(mine) < len(hosts[s["time"]])
            ]
            if shares:
                out[rank] = shares
        return out

    @property
    def gpu_samples(self) -> dict[int, list[dict[str, Any]]]:
        gpus: dict[int, list[dict[str, Any]]] = {}
        for s in self.system:
            if s["kind"] == "gpu":
                gpus.setdefault(int(s["index"]), []).append(s)
        return dict(sorted(gpus.items()))


def _json_lines(file: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's objects; a line cut short by a killed process is skipped."""
    out = []
    for line in file.read_text().splitlines() if file.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def json_file(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file} is not valid JSON ({exc}); it was damaged or is not paratrain's") from None


def read_run(path: Path) -> RunEvidence:
    run = RunDir(Path(path))
    summary = read_summary_record(json_file(run.summary), str(run.summary)) if run.summary.is_file() else None
    return RunEvidence(
        path=run.path,
        config=json_file(run.config),
        summary=summary,
        events=_json_lines(run.metrics),
        system=system_samples(run.path),
    )


def system_samples(path: Path) -> list[dict[str, Any]]:
    """The monitor's samples in PATH/system.jsonl, in time order."""
    return sorted(
        (s for s in _json_lines(path / SYSTEM_FILE) if isinstance(s, dict) and "time" in s and "kind" in s),
        key=lambda s: s["time"],
    )


def idle_fractions(ev: RunEvidence, spans: Sequence[Phase] | None = None) -> dict[str, float]:
    """Per device ("rank R" for CPU ranks, "GPU I"), the share of monitor samples in which it was idle
    (CPU below IDLE_CPU_PERCENT of a core; GPU utilisation below the same percentage), over the whole
    run or only inside `spans`."""

    def inside(t: float) -> bool:
        return spans is None or any(p.start <= t <= p.end for p in spans)

    out = {}
    for label, samples, key in [(f"rank {r}", s, "cpu_percent") for r, s in ev.rank_samples.items()] + [
        (f"GPU {i}", s, "utilization_percent") for i, s in ev.gpu_samples.items()
    ]:
        mine = [s for s in samples if inside(s["time"])]
        if mine:
            out[label] = sum(s[key] < IDLE_CPU_PERCENT for s in mine) / len(mine)
    return out


# -- remedies as commands ------------------------------------------------------------------------

# Fields that say where and how a run is recorded: a suggested rerun gets its own run directory.
_NOT_REPEATED = ("run_dir", "resume", "quiet", "resolved", "tensorboard", "mlflow", "mlflow_experiment")


def rerun_command(ev: RunEvidence, run_dir: str | None = None, **changes: Any) -> str:
    """The command that reruns this run with `changes` (a value of None drops the flag), into a new
    run directory (beside the old one unless given)."""
    run_dir = run_dir or f"{ev.path}-fixed"
    if ev.is_script:
        cfg = {"threads_per_worker": ev.config.get("threads_per_worker"), **changes}
        parts = ["paratrain", "launch", "-n", str(cfg.get("workers") or ev.workers)]
        if cfg.get("threads_per_worker"):
            parts += ["--threads-per-worker", str(cfg["threads_per_worker"])]
        if cfg.get("allow_oversubscribe", ev.config.get("allow_oversubscribe")):
            parts.append("--allow-oversubscribe")
        parts += ["--run-dir", run_dir, str(ev.config["script"]), *map(str, ev.config.get("script_args") or [])]
        return shlex.join(parts)
    from paratrain.config import TrainConfig

    values = {k: v for k, v in ev.config.items() if k in TrainConfig.model_fields and k not in _NOT_REPEATED}
    values.update(changes)
    parts = ["paratrain", "train"]
    for name, value in values.items():
        default = TrainConfig.model_fields[name].get_default(call_default_factory=True)
        if value is None or value == default or (isinstance(default, tuple) and list(default) == value):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value is False:
            continue
        else:
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            parts += [flag, f"{shown:g}" if isinstance(shown, float) else str(shown)]
    parts += ["--run-dir", run_dir]
    return shlex.join(parts)
