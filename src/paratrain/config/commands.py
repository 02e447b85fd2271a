"""The configs of every command but train: one model each, its flags generated from it; those with a
`train` field take the train flags too."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from paratrain.config.compute import ActivationCheckpointing, CheckpointingFlags
from paratrain.config.flags import CommandText, cli, comma_separated, flag, parse_size
from paratrain.config.optimisation import BatchSchedule, LRScaling, Optimizer
from paratrain.config.parallelism.placement import Backend, Device
from paratrain.config.train import TrainConfig

# Train flags that only a run across nodes takes; a study's and a sweep's runs are on this machine.
ACROSS_NODES = ("nodes", "node_rank", "rdzv", "rdzv_backend", "rdzv_timeout")
# Train flags that find-batch, noise-scale, lr-find and recommend set themselves on the runs they start.
BATCH_COMMAND_OWNED = ("run_dir", "resume", "quiet", "max_steps", "grad_noise", "schedule", "lr_end")

# The train flags that also apply to a study of a user's script (`scale --script`): where its ranks run, and the
# batch schedule its paratrain.batch_schedule(...) takes (launch's flags of the same names).
SCRIPT_STUDY_FLAGS = (
    "threads_per_worker",
    "allow_oversubscribe",
    "monitor_hz",
    "batch_schedule",
    "max_global_batch",
    "batch_ramp_epochs",
    "lr_scaling",
)


class ScaleConfig(BaseModel):
    """`paratrain scale`: the same training job on several worker counts."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="scaling study: the same job on 1, 2, 4, ... workers",
        description="Run the same training job on several worker counts and report epoch time (first epoch "
        "excluded), samples/s, speedup, efficiency and accuracy.",
    )
    train_flags_left_out: ClassVar[tuple[str, ...]] = ("run_dir", *ACROSS_NODES)

    workers: list[int] = Field(description="worker counts to run, e.g. 1,2,4")
    mode: Literal["weak", "strong"] = Field(
        "weak",
        description="weak: the per-worker batch stays, the global batch grows with N; strong: the global batch stays "
        "and is split",
    )
    repeats: int = Field(1, gt=0, description="runs per point; the table reports medians and spread")
    workload: list[str] = Field(
        default_factory=lambda: ["cifar10-cnn"],
        description="workload(s) to study, comma-separated or repeated; one line per workload in every plot",
    )
    strategy: list[str] = Field(
        default_factory=list,
        description="strategies to compare, e.g. ddp,fsdp,pipeline: one line per workload and strategy, all measured "
        "against the same 1-worker run (default: the train default, ddp)",
    )
    out: Path = Field(description="study directory: scaling.json, runs/, plots, report.html")
    resume: bool = Field(False, description="continue an interrupted study in --out, skipping finished points")
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags every point shares")
    script: Path | None = Field(
        None,
        description="study your own torchrun-style script instead of a workload; it reports its throughput with "
        "paratrain.report(samples_per_s=...)",
    )
    script_args: list[str] = Field(
        default_factory=list, description="arguments after -- passed to the script", json_schema_extra=cli(hidden=True)
    )
    probe: bool = Field(
        True,
        description="with --script: time each rank's steps by phase (launch's probe); --no-probe runs the script "
        "untouched",
        json_schema_extra=cli(flag="--no-probe"),
    )
    quiet: bool = Field(
        False, description="no progress bar of the running point, as train --quiet; a line per finished point"
    )

    @field_validator("workers", "workload", "strategy", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return comma_separated(value)

    @field_validator("workers")
    @classmethod
    def _valid_counts(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("give at least one worker count, e.g. --workers 1,2")
        if min(value) <= 0:
            raise ValueError(f"worker counts must be positive (got {min(value)})")
        if len(set(value)) != len(value):
            raise ValueError(f"worker counts must not repeat (got {','.join(map(str, value))})")
        return sorted(value)

    @model_validator(mode="after")
    def _script_flags(self) -> ScaleConfig:
        if self.script is not None:
            if "workload" in self.model_fields_set:
                raise ValueError(
                    "--workload names a built-in workload; with --script the study runs your script, drop --workload"
                )
            shared = [k for k in self.train if k not in SCRIPT_STUDY_FLAGS]
            if shared:
                raise ValueError(
                    f"train flags ({', '.join(flag(k) for k in shared)}) apply to built-in workloads; "
                    "with --script pass your script's own arguments after --"
                )
            if self.strategy:
                raise ValueError(
                    "--strategy chooses paratrain's strategies for built-in workloads; your script "
                    "parallelises itself, drop --strategy"
                )
        if "single" in self.strategy:
            raise ValueError(
                "--strategy single runs one worker, and it already is every line's 1-worker point; "
                "list only strategies for more workers (e.g. ddp,fsdp)"
            )
        if len(set(self.strategy)) != len(self.strategy):
            raise ValueError(f"strategies must not repeat (got {','.join(self.strategy)})")
        return self


PlanPrecision = Literal["fp32", "tf32", "bf16", "fp16"]
PLAN_DEFAULT_STRATEGIES = ("ddp", "zero1", "fsdp", "pipeline", "hybrid", "pp+fsdp")
PLAN_STRATEGIES = (*PLAN_DEFAULT_STRATEGIES, "hsdp")


class PlanConfig(CheckpointingFlags):
    """`paratrain plan`: the performance and memory model of a model on 1 ... N devices (plan/)."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="predict memory, step time and speedup of every strategy on 1 ... N devices, before you queue",
        description="Measure the model here (FLOPs, parameters, activation bytes per sample, on the meta device: "
        "nothing is trained), then predict per-device memory and step time for ddp, zero1, fsdp, "
        "pipeline and hybrid on 1 ... N devices of a table of accelerators (or this machine's cores), "
        "which strategies fit, and one recommendation with its reason. See docs/planner.md.",
        example="paratrain plan --workload gpt-medium --device a100 --precision bf16 --nodes 8 --gpus-per-node 8",
    )

    workload: str | None = Field(None, description="named workload whose model is planned; see `paratrain workloads`")
    model: str | None = Field(None, description="the model instead: a registered name or pkg.module:factory")
    dataset: str | None = TrainConfig.model_fields["dataset"]
    image_size: int | None = TrainConfig.model_fields["image_size"]
    seq_len: int | None = TrainConfig.model_fields["seq_len"]
    num_classes: int | None = TrainConfig.model_fields["num_classes"]
    device: str = Field(
        description="accelerator: p100, v100, a100, a100-40gb, h100, h200, gh200, l4, t4, "
        "or cpu (this machine, measured)"
    )
    gpus: list[int] = Field(
        default_factory=list, description="device counts to plan, e.g. 8,64,1024 (on nodes of --gpus-per-node)"
    )
    nodes: int | None = Field(None, description="nodes (with --gpus-per-node): plans nodes x gpus-per-node devices")
    gpus_per_node: int | None = Field(
        None, description="devices per node (default: 8 GPUs, or this machine's cores for cpu)"
    )
    batch_size: int = Field(
        32, gt=0, description="samples per device per step (weak scaling: the global batch grows with the devices)"
    )
    global_batch: int | None = Field(
        None, gt=0, description="a fixed global batch split over the devices instead (strong scaling)"
    )
    precision: PlanPrecision = Field("fp32", description="fp32, tf32, bf16 or fp16 (the device's peak for that dtype)")
    strategy: list[str] = Field(
        default_factory=lambda: list(PLAN_DEFAULT_STRATEGIES),
        description="strategies to plan, comma-separated (default: all of ddp,zero1,fsdp,pipeline,hybrid,pp+fsdp; "
        "pp+fsdp is --pp K --dp-shard N/K: hybrid's stages sharded over the replicas); also hsdp: FSDP within each "
        "node, a replica a node, on more than one node",
    )
    tp: int = Field(
        1,
        gt=0,
        description="also plan tensor parallelism of this degree, measured with the model's own plan (gpt has one): "
        "a 'tp' row on T devices, 'fsdp+tp' rows sharding over N/T groups, and the pipelines' stages split T ways "
        "('pp+tp' with pipeline: N/T stages; 'pp+fsdp+tp' with pp+fsdp)",
    )
    dp_replicate: int | None = Field(
        None,
        gt=0,
        description="plan one layout, as torchtitan's mesh: --dp-replicate R x --dp-shard S x --tp T x --pp P "
        "devices (each 1 unless given) against one device; R replicas of the rest (with --dp-shard S > 1: HSDP)",
    )
    dp_shard: int | None = Field(
        None, gt=0, description="with the mesh: the S ranks FSDP shards each replica (or each pipeline stage) over"
    )
    pp: int | None = Field(None, gt=0, description="with the mesh: the model cut into P pipeline stages")
    # planned with the mesh's --dp-shard (PlanConfig refuses it otherwise)
    reshard_after_forward: bool = TrainConfig.model_fields["reshard_after_forward"]
    tp_plan: str | None = TrainConfig.model_fields["tp_plan"]
    shard_unit: str | None = TrainConfig.model_fields["shard_unit"]
    sequence_parallel: bool = TrainConfig.model_fields["sequence_parallel"]
    loss_parallel: bool = TrainConfig.model_fields["loss_parallel"]
    checkpoint_activations: bool = TrainConfig.model_fields["checkpoint_activations"]
    checkpoint_activations_every: int = TrainConfig.model_fields["checkpoint_activations_every"]
    checkpoint_activations_ops: bool = TrainConfig.model_fields["checkpoint_activations_ops"]
    activation_checkpointing: ActivationCheckpointing | None = TrainConfig.model_fields["activation_checkpointing"]
    search: bool = Field(
        False,
        description="also search, on the largest device count, every strategy with tensor parallelism of each degree "
        "within a node and activation checkpointing none, every 2nd block, every block by operator or every block: "
        "the fastest layout that fits, the runner-up and why",
    )
    optimizer: Optimizer = Field(
        "adam", description="the optimizer whose state is counted: sgd (momentum), adam, adamw, lars, lamb"
    )
    microbatches: int = TrainConfig.model_fields["microbatches"]  # the plan raises it to the stages where fewer
    interconnect: str | None = Field(
        None,
        description="the inter-node network (ib-edr, ib-hdr, ib-ndr, 25gbe, 100gbe; default ib-hdr) or a paratrain "
        "commbench JSON file",
    )
    intra_node_gbps: float | None = Field(
        None,
        gt=0,
        description="bandwidth between devices of a node, Gb/s per direction (default: the device's own link)",
    )
    inter_node_gbps: float | None = Field(
        None,
        gt=0,
        description="bandwidth between nodes, Gb/s per direction per device: a node's network over its devices (a "
        "DGX's 8 x 200 Gb/s: 200; 8 GPUs sharing one 25 GbE port: 3.125) (default: the --interconnect's)",
    )
    calibrate: list[Path] = Field(
        default_factory=list,
        description="run directories measured here (single, ddp, zero1, fsdp, tp, pipeline, hybrid) whose compute "
        "efficiency, overhead and synchronisation the plan uses; runs of fsdp, tp or pipelines also give that layout's "
        "own cost a step (a pipeline's at its stages and micro-batches)",
        json_schema_extra=cli(nargs="+", metavar="RUN_DIR"),
    )
    out: Path | None = Field(None, description="also write plan.json, the plots and report.html into this directory")
    cache_dir: Path | None = TrainConfig.model_fields["cache_dir"]

    @field_validator("gpus", "strategy", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return comma_separated(value)

    @property
    def mesh(self) -> tuple[int, int, int, int] | None:
        """The one layout given as a mesh (replicas, shards, tensor-parallel degree, stages), or None."""
        if self.dp_replicate is None and self.dp_shard is None and self.pp is None:
            return None
        return self.dp_replicate or 1, self.dp_shard or 1, self.tp, self.pp or 1

    @model_validator(mode="after")
    def _consistent(self) -> PlanConfig:
        if (self.workload is None) == (self.model is None):
            raise ValueError("give the model to plan: --workload NAME or --model NAME_OR_FACTORY (one of them)")
        if self.mesh is not None:
            self._one_layout(*self.mesh)
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{flag(name)} must be at least 1 (got {value})")
        if self.gpus and self.nodes is not None:
            raise ValueError("give the devices once: --gpus N[,N...] or --nodes N --gpus-per-node G")
        if not self.gpus and self.nodes is None:
            raise ValueError("how many devices? give --gpus N[,N...] or --nodes N --gpus-per-node G")
        if self.gpus and min(self.gpus) <= 0:
            raise ValueError(f"--gpus counts must be positive (got {min(self.gpus)})")
        if not self.reshard_after_forward and ((self.dp_shard or 1) == 1 or (self.pp or 1) > 1):
            raise ValueError(
                "--reshard-after-forward false plans FSDP's parameters kept from forward to backward; give the mesh's "
                "--dp-shard S (S >= 2), without --pp"
            )
        for given in ("tp_plan", "sequence_parallel", "loss_parallel"):
            if getattr(self, given) and self.tp == 1 and not self.search:
                raise ValueError(f"{flag(given)} goes with tensor parallelism; give --tp N (N > 1) or --search too")
        unknown = [s for s in self.strategy if s not in PLAN_STRATEGIES]
        if unknown or not self.strategy:
            raise ValueError(
                f"unknown strategy {unknown[0] if unknown else '(none)'!r}; choose from {','.join(PLAN_STRATEGIES)}"
            )
        return self

    def _one_layout(self, r: int, s: int, t: int, p: int) -> None:
        """The mesh plans one layout on its R x S x T x P devices: the device count and the strategies follow
        from it (--gpus may repeat the count; --nodes x --gpus-per-node must make it)."""
        devices = r * s * t * p
        given = f"--dp-replicate {r} x --dp-shard {s} x --tp {t} x --pp {p}"
        for name in ("strategy", "search"):
            if name in self.model_fields_set and getattr(self, name):
                raise ValueError(f"{given} plans that one layout; drop {flag(name)}")
        if self.gpus and self.gpus != [devices]:
            raise ValueError(f"{given} is {devices} devices; drop --gpus {','.join(map(str, self.gpus))}")
        if self.nodes is not None and self.nodes * (self.gpus_per_node or 0) != devices:
            raise ValueError(f"{given} is {devices} devices; give --nodes and --gpus-per-node whose product is that")
        if self.nodes is None:
            self.gpus = [devices]


class LaunchConfig(BaseModel):
    """`paratrain launch`: any torchrun-style script on N local ranks, into a run directory."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="run your own torchrun-style script on N ranks, pinned and monitored, into a run directory",
        description="Run any torchrun-style script (it reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) on N "
        "local ranks under PyTorch's elastic launcher, each rank on its own cores, with the monitor "
        "sampling CPU, memory and GPUs into RUN_DIR/system.jsonl. Everything after the script's path "
        "goes to the script. paratrain exits with the script's exit status. See docs/launch.md.",
        example="paratrain launch -n 2 --run-dir runs/mine train.py --epochs 3",
    )

    script: Path = Field(
        description="the program every rank runs: a .py file (run with this Python) or an executable",
        json_schema_extra=cli(positional=True),
    )
    script_args: list[str] = Field(
        default_factory=list,
        description="arguments for the script: everything after its path",
        json_schema_extra=cli(positional=True, nargs="..."),
    )
    workers: int = Field(1, gt=0, description="ranks to start", json_schema_extra=cli(short="-n", metavar="N"))
    threads_per_worker: int | None = Field(
        None, gt=0, description="CPU threads per rank, pinned to their own cores (default: cores // ranks)"
    )
    allow_oversubscribe: bool = TrainConfig.model_fields["allow_oversubscribe"]
    run_dir: Path | None = Field(None, description="run directory (default runs/<time>-<script>-w<ranks>)")
    monitor_hz: float = TrainConfig.model_fields["monitor_hz"]
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment variables of the ranks", json_schema_extra=cli(hidden=True)
    )
    probe: bool = Field(
        True,
        description="time each rank's steps by phase for the doctor (torch-level hooks, "
        "docs/doctor.md); --no-probe runs the script untouched",
        json_schema_extra=cli(flag="--no-probe"),
    )
    batch_schedule: BatchSchedule = Field(
        "fixed",
        description="the script's global batch over the run, set through paratrain.batch_schedule(...) in the "
        "script (docs/launch.md): fixed (the script's own); warmup (doubled at even intervals over "
        "--batch-ramp-epochs up to --max-global-batch); adaptive (doubled when the noise scale and the throughput "
        "measured in the run say it raises the goodput); by gradient accumulation, the LR following by --lr-scaling",
    )
    max_global_batch: int | None = TrainConfig.model_fields["max_global_batch"]
    batch_ramp_epochs: float = TrainConfig.model_fields["batch_ramp_epochs"]
    lr_scaling: LRScaling = Field(
        "linear",
        description="--batch-schedule warmup or adaptive: how the script's LR follows the global batch: linear "
        "(Goyal et al. 2017), sqrt, or none",
    )

    @model_validator(mode="after")
    def _growth_needs_a_schedule(self) -> LaunchConfig:
        if self.batch_schedule == "fixed":
            for given in ("max_global_batch", "batch_ramp_epochs", "lr_scaling"):
                if getattr(self, given) != type(self).model_fields[given].default:
                    raise ValueError(f"{flag(given)} applies to --batch-schedule warmup or adaptive")
        return self

    def schedule_settings(self) -> dict[str, Any]:
        """What the ranks' paratrain.batch_schedule(...) is told (engine/script_schedule.py)."""
        settings = {"kind": self.batch_schedule, "batch_ramp_epochs": self.batch_ramp_epochs}
        if self.max_global_batch is not None:
            settings["max_global_batch"] = self.max_global_batch
        return {**settings, "lr_scaling": self.lr_scaling}


class SweepConfig(BaseModel):
    """`paratrain sweep`: a hyperparameter search, N trials at once (inter-model parallelism)."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="hyperparameter search, N trials at once (Optuna; Comet optimizer config format)",
        description="Run a hyperparameter search with N trials at once, each on its own cores/GPUs. CONFIG is a "
        "Comet optimizer file (algorithm grid|random|bayes, parameters, spec). Trials run --script PATH "
        "(any program; parameters as --name value, the metric back via paratrain.report() or its last "
        "stdout line) or a built-in workload made from the train flags. Rerun the same command to resume.",
        example="paratrain sweep batch.json -j 2 --out runs/sweep --workload cifar10-cnn --epochs 3 --lr-scaling none",
    )
    train_flags_left_out: ClassVar[tuple[str, ...]] = ("workers", "run_dir", "resume", *ACROSS_NODES)

    config: Path | None = Field(
        None,
        description="the search space: Comet optimizer format (JSON, YAML, or JSON with # comments)",
        json_schema_extra=cli(positional=True, nargs="?"),
    )
    out: Path | None = Field(
        None, description="sweep directory: sweep.json, study storage, trials/, plots, report.html"
    )
    jobs: int = Field(
        1,
        gt=0,
        description="trials running at once, each on its own cores (or GPUs)",
        json_schema_extra=cli(short="-j"),
    )
    script: Path | None = Field(
        None,
        description="your training program (any executable, or a .py run with this Python); "
        "without it, trials are paratrain workloads built from the train flags",
    )
    script_args: list[str] = Field(
        default_factory=list,
        description="arguments after -- passed to every trial before the parameters",
        json_schema_extra=cli(hidden=True),
    )
    param_style: Literal["space", "equals", "plain", "none"] = Field(
        "space",
        description="how parameters reach the script: --name value | --name=value | name=value | none "
        "(PARATRAIN_PARAMS only)",
    )
    workers_per_trial: int = Field(1, gt=0, description="data-parallel workers (ranks) inside each trial")
    probe: bool = Field(
        True,
        description="with a .py --script: time each trial's steps by phase (launch's probe; "
        "TRIAL_DIR/probe/); --no-probe runs the script untouched",
        json_schema_extra=cli(flag="--no-probe"),
    )
    storage: str | None = Field(
        None,
        description="Optuna storage URL shared by machines, e.g. postgresql://user@host/db "
        "(default: a journal file in the sweep directory)",
    )
    join: str | None = Field(
        None,
        description="add workers to an existing sweep: its directory or storage URL",
        json_schema_extra=cli(metavar="DIR_OR_URL"),
    )
    study_name: str | None = Field(None, description="the study's name in the storage (default: the config's name)")
    pruner: Literal["auto", "median", "none"] = Field(
        "auto",
        description="stop trials whose metric at an epoch is worse than "
        "the median of earlier trials at that epoch; auto: median for random and bayes, none for a grid or a sweep "
        "over a batch size",
    )
    trial_timeout: float | None = Field(
        None, gt=0, description="seconds after which a trial is stopped and recorded as failed"
    )
    # Optuna's study.optimize(n_trials=, timeout=): limits on what this command starts; running trials finish.
    n_trials: int | None = Field(
        None,
        gt=0,
        description="start at most this many trials in this command, then stop "
        "(rerun to continue); running trials finish",
    )
    timeout: float | None = Field(
        None, gt=0, description="start no trial after this many seconds of this command; running trials finish"
    )
    allow_oversubscribe: bool = Field(False, description="allow more concurrent workers than cores/GPUs")
    quiet: bool = Field(False, description="no live table; one line per finished trial")
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags every built-in trial shares")

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        if self.join is None and (self.config is None or self.out is None):
            raise ValueError("give the search-space file and --out DIR (or --join DIR_OR_URL to help a running sweep)")
        if self.join is not None and self.config is not None:
            raise ValueError("--join takes the running sweep's own search space; drop the CONFIG argument")
        if self.script is not None and self.train:
            names = ", ".join(flag(k) for k in self.train)
            raise ValueError(f"train flags ({names}) apply to built-in workloads; with --script pass them after --")
        return self


class SlurmConfig(BaseModel):
    """`paratrain slurm`: sbatch scripts for a train run, each point of a scaling study, or a sweep."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="sbatch scripts for a run, each point of a scaling study, or a sweep on a SLURM cluster",
        description="Write the sbatch scripts of `paratrain train|scale|sweep` with these flags: one job per run or "
        "study point (--gres, --ntasks-per-node, --cpus-per-task and srun line from its ranks), and for "
        "a study a last job that collects the points into OUT (paratrain report OUT). --submit submits "
        "them. `paratrain slurm scale --help` lists both the study's flags and the SLURM flags. See "
        "docs/cluster.md.",
        example="paratrain slurm scale --workers 1,2,4 --workload cifar10-resnet50v2 --gpus-per-node 4 --time "
        "00:30:00 --partition gpu --setup 'module load python' --out study",
    )

    gpus_per_node: int = Field(
        ge=0, description="GPUs of one node a job may use (0: CPU nodes, one rank per --cpus-per-worker cores)"
    )
    nodes: int = Field(
        1,
        gt=0,
        description="nodes a job may span at most; a point with more workers than --gpus-per-node spans several",
    )
    time: str = Field(description="the jobs' time limit, HH:MM:SS or D-HH:MM:SS")
    partition: str = Field(description="the SLURM partition (queue) to submit to")
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run before paratrain in every job, e.g. 'module load python' or 'source "
        "~/venv/bin/activate' (repeatable)",
        json_schema_extra=cli(metavar="LINE"),
    )
    gres: str | None = Field(
        None,
        description="the node's GPU resource as SLURM names it, gpu[:TYPE]:COUNT, e.g. gpu:v100:4; COUNT must be "
        "--gpus-per-node (default gpu:G)",
    )
    cpus_per_worker: int | None = Field(
        None,
        gt=0,
        description="CPU cores per rank; --cpus-per-task is this x the ranks of a node (default: --threads-per-worker, "
        "else 1)",
    )
    account: str | None = Field(None, description="the SLURM account to charge")
    sbatch_option: list[str] = Field(
        default_factory=list,
        description="another #SBATCH option for every job, written with =: --sbatch-option=--qos=training (repeatable)",
        json_schema_extra=cli(metavar="LINE"),
    )
    out: Path | None = Field(
        None,
        description="the directory of the job's results, scripts in DIR/slurm/ (scale, sweep: their --out; train: the "
        "run goes to DIR/run)",
    )
    submit: bool = Field(False, description="submit the jobs with sbatch (the study's collection job after its points)")

    @field_validator("time")
    @classmethod
    def _a_time(cls, value: str) -> str:
        if not re.fullmatch(r"(\d+-)?\d{1,2}:[0-5]\d:[0-5]\d", value):
            raise ValueError(f"{value!r} is not a SLURM time limit; write HH:MM:SS (e.g. 00:30:00) or D-HH:MM:SS")
        return value

    @field_validator("gres")
    @classmethod
    def _a_gpu_gres(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"gpu(:[\w.-]+)?:\d+", value):
            raise ValueError(f"{value!r} is not a GPU resource; write gpu:COUNT or gpu:TYPE:COUNT (e.g. gpu:v100:4)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SlurmConfig:
        if self.gres is not None:
            count = int(self.gres.rsplit(":", 1)[1])
            if count != self.gpus_per_node:
                raise ValueError(
                    f"--gres {self.gres} gives {count} GPUs per node and --gpus-per-node says {self.gpus_per_node}; "
                    f"make them agree (e.g. --gres {self.gres.rsplit(':', 1)[0]}:{self.gpus_per_node})"
                )
        return self

    @property
    def gpu_resource(self) -> str:
        """The gres name without its count: gpu or gpu:TYPE."""
        return self.gres.rsplit(":", 1)[0] if self.gres else "gpu"


# -- choosing the batch and the LR by measurement (paratrain/batch/, docs/batch-size.md) ------------


class FindBatchConfig(BaseModel):
    """`paratrain find-batch`: the largest per-worker batch that fits, and the throughput knee."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="the largest per-worker batch that fits (probe runs, doubling then bisection) and the throughput knee",
        description="Measure the largest per-worker batch that fits (probe runs, doubling then bisection) and the "
        "throughput knee. See docs/batch-size.md.",
        example="paratrain find-batch --workload cifar10-cnn --memory-limit 2G --out batch",
    )
    train_flags_left_out: ClassVar[tuple[str, ...]] = (*BATCH_COMMAND_OWNED, *ACROSS_NODES)

    out: Path = Field(description="directory for find_batch.json (the probes' run directories are removed)")
    margin: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="safety margin: the batch to use is the largest that fits, less this fraction (Lightning's "
        "BatchSizeFinder margin)",
    )
    max_batch: int | None = Field(
        None, gt=0, description="probe no batch above this (default: the training set split over the workers)"
    )
    probe_steps: int = Field(
        12,
        ge=3,
        description="optimizer steps of each probe; samples/s is measured over the steps after the first third",
    )
    knee_within: float = Field(
        0.05, gt=0, lt=1, description="the knee: the smallest batch whose samples/s is within this fraction of the best"
    )
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags every probe shares")


class NoiseScaleConfig(BaseModel):
    """`paratrain noise-scale`: the gradient noise scale B_simple measured during a short run."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="the gradient noise scale B_simple, which predicts the critical batch, measured during a short run",
        description="Measure the gradient noise scale B_simple, which predicts the critical batch, measured during a "
        "short run. See docs/batch-size.md.",
        example="paratrain noise-scale --workers 2 --batch-size 32 --steps 200 --out batch",
    )
    train_flags_left_out: ClassVar[tuple[str, ...]] = (*BATCH_COMMAND_OWNED, *ACROSS_NODES)

    out: Path = Field(description="directory for noise_scale.json and the measured run (OUT/noise-scale-run)")
    steps: int = Field(200, gt=0, description="optimizer steps of the measured run")
    ema_steps: int | None = Field(
        None,
        gt=0,
        description="span of the moving averages of |G|² and tr(Σ), in steps (default: a quarter of --steps, at least "
        "10)",
    )
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags of the measured run")


class LRFindConfig(BaseModel):
    """`paratrain lr-find`: the LR range test."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="the LR range test: an exponential LR sweep and the LR it suggests",
        description="Measure the LR range test: an exponential LR sweep and the LR it suggests. See "
        "docs/batch-size.md.",
        example="paratrain lr-find --batch-size 32 --out batch",
    )
    train_flags_left_out: ClassVar[tuple[str, ...]] = (*BATCH_COMMAND_OWNED, *ACROSS_NODES)

    out: Path = Field(description="directory for lr_find.json and the sweep's run (OUT/lr-find-run)")
    steps: int = Field(100, gt=0, description="optimizer steps of the sweep from --lr-min to --lr-max")
    lr_min: float = Field(1e-6, gt=0, description="the LR of the first step")
    lr_max: float = Field(
        10.0,
        gt=0,
        description="the LR of the last step (10, as fastai and torch-lr-finder: high enough that the loss diverges "
        "before it)",
    )
    target_batch: int | None = Field(
        None, gt=0, description="also give the LR scaled to this global batch (default: the sweep's own)"
    )
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags of the sweep")

    @model_validator(mode="after")
    def _range(self) -> LRFindConfig:
        if self.lr_min >= self.lr_max:
            raise ValueError(
                f"--lr-min {self.lr_min:g} must be below --lr-max {self.lr_max:g}: the range test raises the "
                "LR from one to the other"
            )
        return self


class RecommendConfig(BaseModel):
    """`paratrain recommend`: per-worker batch, global batch, LR, warmup and optimizer for N workers."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="batch per worker and in all, LR and its scaling, warmup, schedule and optimizer for N workers, "
        "from find-batch, noise-scale and lr-find",
        description="Measure batch per worker and in all, LR and its scaling, warmup, schedule and optimizer for N "
        "workers, from find-batch, noise-scale and lr-find. See docs/batch-size.md.",
        example="paratrain recommend --workers 2 --epochs 10 --out batch --apply",
    )
    # recommend takes a --schedule for the run it recommends (its measurements set their own).
    train_flags_left_out: ClassVar[tuple[str, ...]] = (
        *(f for f in BATCH_COMMAND_OWNED if f != "schedule"),
        *ACROSS_NODES,
    )

    workers: int = Field(gt=0, description="the workers the recommended run will use")
    out: Path = Field(
        description="directory for recommend.json and the measurements (their JSON files are reused when the same "
        "train flags made them)"
    )
    apply: bool = Field(False, description="print the paratrain train command of the recommendation")
    max_batch: int | None = Field(
        None, gt=0, description="find-batch probes no per-worker batch above this (default: the training set)"
    )
    noise_steps: int = Field(
        NoiseScaleConfig.model_fields["steps"].default,
        gt=0,
        description="optimizer steps of the noise-scale measurement",
    )
    lr_steps: int = Field(
        LRFindConfig.model_fields["steps"].default, gt=0, description="optimizer steps of the LR range test"
    )
    train: dict[str, Any] = Field(
        default_factory=dict, description="the train flags of the measurements and the recommended run"
    )


class CommbenchConfig(BaseModel):
    """`paratrain commbench`: collective latency and bandwidth on N local ranks, fitted to alpha-beta."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="collective latency and bandwidth on N local ranks, fitted to latency + bytes/bandwidth",
        description="Time all-reduce, broadcast, all-gather and reduce-scatter on the backend (and the shared-memory "
        "average of CPU ranks) from --min-size to --max-size, fit t = alpha + bytes/beta to each, and "
        "save the JSON (paratrain plan --interconnect FILE reads it). See docs/synchronisation.md.",
        example="paratrain commbench --workers 2 --out commbench.json",
    )

    workers: int = Field(2, gt=1, description="ranks taking part (at least 2)")
    out: Path | None = Field(
        None,
        description="the JSON result (default: <cache>/commbench/<backend>-<device>-w<N>.json); paratrain plan "
        "--interconnect FILE reads it",
    )
    min_size: str = Field("1K", description="smallest message, e.g. 1K")
    max_size: str = Field("256M", description="largest message, e.g. 256M; sizes go up by 2x from --min-size")
    backend: Backend = TrainConfig.model_fields["backend"]
    device: Device = TrainConfig.model_fields["device"]
    threads_per_worker: int | None = TrainConfig.model_fields["threads_per_worker"]
    allow_oversubscribe: bool = TrainConfig.model_fields["allow_oversubscribe"]
    seconds_per_size: float = Field(
        0.2,
        gt=0,
        description="seconds spent timing each collective at each size: a tenth warming up, then 7 rounds (the median "
        "round counts)",
    )

    @field_validator("min_size", "max_size")
    @classmethod
    def _a_size(cls, value: str) -> str:
        parse_size(value)
        return value

    @model_validator(mode="after")
    def _ordered(self) -> CommbenchConfig:
        if parse_size(self.min_size) > parse_size(self.max_size):
            raise ValueError(f"--min-size {self.min_size} is above --max-size {self.max_size}; swap them")
        if parse_size(self.min_size) < 4 * self.workers:
            raise ValueError(f"--min-size {self.min_size} holds less than one float32 per rank; use 1K or more")
        if self.out is not None and self.out.is_dir():
            raise ValueError(
                f"--out {self.out} is a directory; give the JSON file's path, e.g. {self.out / 'commbench.json'}"
            )
        return self


# -- reading and housekeeping commands -----------------------------------------------------------


class DoctorConfig(BaseModel):
    """`paratrain doctor`: why a run, study or sweep is slow, and what to change."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="why a run, study or sweep is slow, and what to change",
        description="Read a run, scaling study or sweep directory and print ranked findings: the evidence (numbers "
        "from the run), the cause, the remedy (a command or code change) and the predicted gain. See "
        "docs/doctor.md.",
    )

    path: Path = Field(
        description="a run directory (--run-dir), a scaling study's or a sweep's --out",
        json_schema_extra=cli(positional=True),
    )
    verify: bool = Field(
        False,
        description="rerun the run as it was and with the top finding's remedy (when it is a paratrain flag), "
        "alternating, into RUN-verify/, and print the predicted gain beside the measured one",
    )
    # No bound here: verify() refuses fewer than 1 round with its own message, for Python callers too.
    repeats: int = Field(1, description="--verify: rounds of baseline and remedy runs (median)")

    @model_validator(mode="after")
    def _repeats_need_verify(self) -> DoctorConfig:
        if self.repeats != 1 and not self.verify:
            raise ValueError(f"--repeats {self.repeats} counts --verify's rounds; add --verify, or drop --repeats")
        return self


class ReportConfig(BaseModel):
    """`paratrain report`: one self-contained HTML page for a run, a study or several runs."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="one self-contained HTML page for a run, a study or several runs",
    )

    paths: list[Path] = Field(description="run or study directories", json_schema_extra=cli(positional=True, nargs="+"))
    out: Path | None = Field(None, description="the HTML file (default: DIR/report.html, or comparison-report.html)")


class CompareConfig(BaseModel):
    """`paratrain compare`: final metrics, throughput and overlaid curves of two or more runs."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="compare runs: final metrics, throughput, overlaid curves",
    )

    paths: list[Path] = Field(
        description="two or more run directories", json_schema_extra=cli(positional=True, nargs="+")
    )
    out: Path = Field(Path("comparison-report.html"), description="the HTML page with the overlays")

    @model_validator(mode="after")
    def _two_or_more(self) -> CompareConfig:
        if len(self.paths) < 2:
            raise ValueError("compare needs at least two run directories")
        return self


class CacheConfig(BaseModel):
    """`paratrain cache`: the decoded-dataset cache, listed with sizes or cleared."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="list the decoded-dataset cache with sizes, or clear it",
    )

    clear: str | None = Field(
        None,
        description="delete every entry, or those whose names start with PREFIX",
        json_schema_extra=cli(nargs="?", const="", metavar="PREFIX"),
    )
    cache_dir: Path | None = Field(None, description="the cache (default $PARATRAIN_CACHE or ~/.cache/paratrain)")


class DownloadConfig(BaseModel):
    """`paratrain download-cifar10`: the canonical CIFAR-10 archive (needs internet)."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="download the canonical CIFAR-10 archive (needs internet)",
    )

    data_dir: Path = Field(
        description="directory to put cifar-10-python.tar.gz in", json_schema_extra=cli(positional=True)
    )


class WorkloadsConfig(BaseModel):
    """`paratrain workloads`: the named workloads and models (no options)."""

    model_config = ConfigDict(extra="forbid")
    command_text: ClassVar[CommandText] = CommandText(
        help="list the named workloads and models",
    )
