"""Typed records of the run directory: summary.json and its blocks.

The launcher checks every summary it writes against `Summary` (a field of the wrong type is a bug
in paratrain, caught where it is written, not in a report weeks later), and readers get the record
from `RunDir.summary_record()`. Units are in the names (`_s` seconds, `_bytes`, `_per_s`), as in the
files. docs/run-directory.md documents these fields; tests/test_records.py keeps the two in step.

Old run directories still load: every field but `status` may be missing, and keys these models do
not name are kept as they are: what a launched script reported (at the top level, beside these), an
exporter's additions, and fields a later release adds. File names and keys never change; new ones
are added.

Not imported by `paratrain.runs` itself: `import paratrain` and a trial script load `runs` without
pydantic (pyproject.toml's import-linter contract).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, field_validator

from paratrain.errors import UsageError


class Record(BaseModel):
    """A block of a run file: named fields typed, others kept. Fields are optional: a release that
    wrote fewer of them still reads."""

    model_config = ConfigDict(extra="allow")


R = TypeVar("R", bound=Record)


class Breakdown(Record):
    """Seconds per optimizer step, averaged over the ranks that train; they sum to the step."""

    data_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    optimizer_s: float | None = None
    other_s: float | None = None


class Memory(Record):
    """Where each rank's memory goes, one entry per rank (None: the run ended before the measured step)."""

    parameters_bytes: list[int | None] = []
    gradients_bytes: list[int | None] = []
    optimizer_bytes: list[int | None] = []
    activations_peak_bytes: list[int | None] = []
    rss_peak_bytes: list[int | None] = []


class MachineLoad(Record):
    """What else ran on the run's cores while its ranks trained."""

    cores: int | None = None
    wall_s: float | None = None
    run_cpu_s: float | None = None
    other_cpu_s: float | None = None
    steal_s: float | None = None
    other_fraction: float | None = None
    contended: bool | None = None


class MfuPeak(Record):
    """The peak FLOP/s that MFU divides by, and where it came from."""

    flops_per_s: float | None = None
    per_device: float | None = None
    devices: int | None = None
    source: str | None = None


class Summary(Record):
    """summary.json: a run's outcome (`paratrain train`, or `paratrain launch` of a user's script)."""

    status: Literal["completed", "failed", "diverged"]
    error: str | None = None
    diverged_after_step: int | None = None
    model: str | None = None
    dataset: str | None = None
    workers: int | None = None
    strategy: str | None = None
    # the ranks as a mesh: dp_replicate x dp_shard x tp x pp = workers (None for async-ps and older runs)
    layout: dict[str, int] | None = None
    allreduce: str | None = None
    comm_bytes_per_step: list[float] | None = None
    # A strategy's own block: ddp's `sync`, async-ps's `ps`, a pipeline's layout.
    sync: dict[str, Any] | None = None
    ps: dict[str, Any] | None = None
    pipeline: dict[str, Any] | None = None
    bubble_fraction: float | None = None
    bubble_fraction_per_rank: list[float | None] | None = None
    bubble_fraction_theory: float | None = None
    batch_size: int | None = None
    global_batch_size: int | None = None
    grad_accum: int | None = None
    lr: float | None = None
    base_lr: float | None = None
    lr_scaling: str | None = None
    epochs: int | None = None
    steps: int | None = None
    steps_per_epoch: int | None = None
    epochs_run: int | None = None
    early_stopped: bool | None = None
    best_epoch: int | None = None
    restarts: int | None = None
    resumed_from_step: int | None = None
    epoch_times_s: list[float] | None = None
    epoch_time_s: float | None = None
    timed_epochs: int | None = None
    samples_per_s: float | None = None
    train_loss: float | None = None
    train_accuracy: float | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    val_split: str | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None
    wall_time_s: float | None = None
    prepare_s: float | None = None
    launch_and_train_s: float | None = None
    train_time_s: float | None = None
    breakdown: Breakdown | None = None
    peak_memory_bytes: list[int | None] | None = None
    memory: Memory | None = None
    seq_len: int | None = None
    tokens_per_s: float | None = None
    val_bits_per_byte: float | None = None
    test_bits_per_byte: float | None = None
    flops_per_sample: float | None = None
    mfu: float | None = None
    mfu_peak: MfuPeak | None = None
    machine_load: MachineLoad | None = None
    grad_noise: dict[str, Any] | None = None
    # --batch-schedule warmup or adaptive: kind, start/final/largest global batch, the last noise scale
    batch_schedule: dict[str, Any] | None = None
    # A launched script's: its exit status, the rank that failed first, what it reported, the probe's figures.
    exit_code: int | None = None
    failed_rank: int | None = None
    reported: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None
    run_dir: str | None = None

    @property
    def contended(self) -> bool:
        return bool(self.machine_load and self.machine_load.contended)


def fitting_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The values that fit the Summary field of their name (all others, which are not fields, too): a
    launched script's reported metrics go to the top level of its summary only where they read as
    what the field means (a script's `epochs` of 2.5 stays in `reported` alone)."""
    from pydantic import ValidationError

    fields = Summary.model_fields
    kept = {}
    for key, value in values.items():
        if key in fields and key != "status":
            try:
                Summary.model_validate({"status": "completed", key: value})
            except ValidationError:
                continue
        kept[key] = value
    return kept


def read_summary_record(data: dict[str, Any], where: str) -> Summary:
    """A summary.json's contents as a record; one line naming the file when it is not a summary."""
    return read_record(Summary, data, where, "summary")


def read_record(model: type[R], data: Any, where: str, what: str) -> R:
    """A run file's contents as its record; one line naming the file and the field when it does not read."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise UsageError(f"{where} is not a paratrain {what}: {field}: {error['msg']}") from None


def load_record(model: type[R], file: Path, what: str) -> R:
    """A JSON run file as its record: one line when it is not JSON, or not the record it should be."""
    import json

    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file} is not valid JSON ({exc}); it was damaged or is not paratrain's") from None
    return read_record(model, data, str(file), what)


class ScalingRow(Record):
    """One row of scaling.json: a (workload, worker count) point over its repeats, or, on CPU, the
    one-process-on-all-cores reference of a workload (`point` says which)."""

    workload: str
    strategy: str | None = None
    workers: int
    threads_per_worker: int | None = None
    point: Literal["scaling", "all_cores_reference"] = "scaling"
    global_batch_size: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    epoch_time_s: float | None = None
    epoch_time_s_range: list[float] | None = None
    samples_per_s: float
    samples_per_s_range: list[float] | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    speedup_basis: Literal["epoch_time_s", "samples_per_s"] | None = None
    speedup: float
    speedup_range: list[float] | None = None
    efficiency: float
    speedup_vs_all_cores: float | None = None
    speedup_vs_all_cores_range: list[float] | None = None
    val_accuracy: float | None = None
    val_split: str | None = None
    repeats: int | None = None
    repeat_spread: float | None = None
    contended_runs: int | None = None
    flags: list[str] = []
    run_dir: str | None = None
    run_dirs: list[str] | None = None
    breakdown: dict[str, float] | None = None


class Study(Record):
    """scaling.json: a scaling study's table (`paratrain scale`, or `paratrain report` collecting a study
    that ran as SLURM jobs), its rules and its rows."""

    mode: Literal["weak", "strong"]
    workload: list[str] | str | None = None
    repeats: int | None = None
    timing: str | None = None
    cpu_worker: str | None = None
    flag_rules: dict[str, str] = {}
    strategy: list[str] | None = None
    rows: list[ScalingRow]

    def points(self, workload: str | None = None) -> list[ScalingRow]:
        """The scaling points (not the all-cores reference), of one workload or of all, in worker order."""
        return [r for r in self.rows if r.point == "scaling" and workload in (None, r.workload)]

    def reference(self, workload: str) -> ScalingRow | None:
        """The one process on all cores that a CPU study of `workload` measured, if it did."""
        return next((r for r in self.rows if r.workload == workload and r.point == "all_cores_reference"), None)

    @property
    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.rows))


def checked(model: type[Record], data: dict[str, Any]) -> dict[str, Any]:
    """`data` as it is, once it reads as `model`: what paratrain writes passes here, so a field of the
    wrong type is a bug caught where it is written."""
    model.model_validate(data)
    return data


class Trial(Record):
    """A trial of sweep.json: its parameters, its state and what it measured."""

    number: int
    state: Literal["COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING"]
    params: dict[str, Any] = {}
    # the objective's value (a list with several objectives); None unless the trial completed
    value: float | list[float] | None = None
    duration_s: float | None = None
    run_dir: str | None = None
    reason: str | None = None
    metrics: dict[str, float] = {}
    item: int | None = None
    repeat: int = 0
    attempt: int = 0
    launch_overhead_s: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    intermediate: dict[str, float] = {}


class ParetoFront(Record):
    """sweep.json's `best` with several objectives: the trials no other trial beats on all of them."""

    pareto_front: list[Trial]


class SweepParallelism(Record):
    """Whether running trials side by side paid off: their summed time against the wall time."""

    trials: int = 0
    trial_time_s: float = 0.0
    wall_time_s: float = 0.0
    speedup: float | None = None


class SweepResult(Record):
    """sweep.json: every trial of a sweep, the best one (or the Pareto front), and its space. A sweep
    that failed writes what it had (`failure` says what), so every field but `name` may be missing."""

    name: str
    out: str | None = None
    algorithm: str | None = None
    sampler: str | None = None
    metric: list[str] = []
    objective: list[Literal["minimize", "maximize"]] = []
    storage: str | None = None
    mode: Literal["builtin", "script"] | None = None
    val_split: float | None = None
    script: str | None = None
    recorded_metrics: list[str] = []
    space: dict[str, Any] = {}
    items: int | None = None
    counts: dict[str, int] = {}
    parallelism: SweepParallelism | None = None
    trials: list[Trial] = []
    best: Trial | ParetoFront | None = None
    stopped_by: dict[str, float] | None = None
    failure: Any = None

    @field_validator("best", mode="before")
    @classmethod
    def _no_best_yet(cls, value: Any) -> Any:
        return value or None  # `{}`: no trial completed

    def completed(self) -> list[Trial]:
        return [t for t in self.trials if t.state == "COMPLETE"]


class PlanModel(Record):
    """What the plan measured of the model (on the meta device)."""

    name: str
    params: int
    flops_per_sample: float
    kind: str | None = None
    # a model of token sequences: tokens per sample (None for any other, and in a plan written before)
    tokens_per_sample: int | None = None


class PlanDevice(Record):
    """The device planned for, its efficiency (published or calibrated from runs) and its links."""

    name: str
    precision: str
    memory_bytes: float
    usable_fraction: float
    efficiency: float
    efficiency_source: str
    peak_flops_per_s: float | None = None


class PlanRow(Record):
    """One layout of plan.json's table: N devices under one strategy, its predicted time and memory."""

    devices: int
    nodes: int | None = None
    strategy: str
    # torchtitan's mesh (dp_replicate, dp_shard, tp, pp), as a run's summary.json names its own; and
    # none | selective | full. None in a plan written before they were.
    layout: dict[str, int] | None = None
    activation_checkpointing: str | None = None
    data_parallel: int
    tp: int = 1
    stages: int = 1
    microbatches: int | None = None
    global_batch: int
    step_time_s: float
    samples_per_s: float
    speedup: float
    efficiency: float
    memory_per_device_bytes: float
    fits: bool
    # the memory terms (parameters_bytes, gradients_bytes, ...) and the step's time terms
    memory: dict[str, Any] = {}
    time: dict[str, Any] = {}
    bubble_fraction: float | None = None


class PlanPick(Record):
    """The plan's recommendation, or the best layout at one device count (the curve)."""

    devices: int
    strategy: str | None = None
    reason: str | None = None
    samples_per_s: float | None = None
    speedup: float | None = None


class PlanCostPoint(Record):
    devices: int
    strategy: str | None = None
    wall_hours: float
    device_hours: float


class PlanCost(Record):
    """Device-hours against wall time for a fixed number of samples: the frontier and its bend."""

    samples: int
    points: list[PlanCostPoint] = []
    frontier: list[int] = []
    bend_devices: int | None = None


class PlanSearch(Record):
    """plan --search: the fastest layout that fits (None: nothing fits), and why."""

    devices: int
    best: dict[str, Any] | None = None
    why: str = ""
    skipped_tp: dict[int, str] = {}
    # the runner-up within 5 % of the best, nearer than the plan ranks reliably (False in an older plan)
    close_call: bool = False


class PlanStopsPaying(Record):
    """Where a doubling of the devices first gains less than 10 % at a fixed global batch, and why."""

    devices: int
    doubled: int
    gain: float
    exposed_share: float
    strategy: str
    remedies: list[str]
    sentence: str


class Plan(Record):
    """plan.json (`paratrain plan --out DIR`): the model, the device, every layout planned, the
    recommendation, the best layout per device count and its cost frontier."""

    model: PlanModel
    device: PlanDevice
    optimizer: str | None = None
    batch: dict[str, int | None] = {}
    rows: list[PlanRow]
    recommendation: PlanPick
    backend: dict[str, Any] = {}
    curve: list[PlanPick] = []
    # None in a plan written before the cost frontier was
    pareto: PlanCost | None = None
    search: PlanSearch | None = None
    # at a fixed global batch, where more devices stop paying (plan/regime.py); None while every doubling pays
    stops_paying: PlanStopsPaying | None = None
