"""The typed inputs of every command.

One pydantic model per command. Each field's description is its CLI help, so the model is the
single place a flag is declared: the CLI is generated from it (see cli.py) and config files
(YAML, TOML, JSON) use the same keys. Validation failures become one-line UsageErrors naming the
flag.
"""
from __future__ import annotations

import hashlib
import re
import sys
import json
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from paratrain.errors import UsageError

Precision = Literal["32", "bf16", "fp16"]
LRScaling = Literal["none", "linear", "sqrt"]
Schedule = Literal["constant", "step", "exp", "inverse-time", "poly", "cosine"]
Optimizer = Literal["sgd", "adam", "adamw", "lars", "lamb"]
Backend = Literal["auto", "gloo", "nccl", "mpi"]
Device = Literal["auto", "cpu", "cuda"]
AllReduce = Literal["auto", "shm", "backend"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]
# Strategies that split the model's layers into stages, one per rank of a pipeline.
STAGED_STRATEGIES = ("pipeline", "model-parallel", "hybrid")


# Fields that say where and how to record a run, not what it trains: a resumed run may change them.
# --memory-limit too: a run that ran out of memory resumes with a higher limit.
RUN_CONTROL_FIELDS = ("run_dir", "resume", "quiet", "checkpoint_every", "log_every", "cache_dir", "tensorboard",
                      "mlflow", "mlflow_experiment", "monitor_hz", "memory_limit")


class TrainConfig(BaseModel):
    """Everything `paratrain train` needs; `paratrain.train(TrainConfig(...))` takes the same."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # What to train.
    workload: str = Field("cifar10-cnn", description="named workload (model + dataset); see `paratrain workloads`")
    model: Optional[str] = Field(None, description="override the workload's model: a registered name or pkg.module:factory")
    dataset: Optional[str] = Field(None, description="override the workload's dataset: cifar10, synthetic, text or pkg.module:factory")
    data_dir: Optional[Path] = Field(None, description="CIFAR-10 as cifar-10-python.tar.gz / cifar-10-batches-py, or an image tree train|test/<class>/* (folder or .tar.gz); default: the bundled offline subset. Text workloads: a UTF-8 text file or a folder of them; default: Python's own sources")
    cache_dir: Optional[Path] = Field(None, description="where decoded datasets are cached (default $PARATRAIN_CACHE or ~/.cache/paratrain)")
    image_size: Optional[int] = Field(None, gt=0, description="resize images to this many pixels a side (on the device, per batch)")
    synthetic_samples: int = Field(10000, gt=0, description="training samples of the synthetic dataset")
    synthetic_shape: tuple[int, int, int] = Field((3, 32, 32), description="C,H,W of the synthetic dataset")
    num_classes: int = Field(10, gt=1, description="classes of the synthetic dataset")
    limit_train: Optional[int] = Field(None, gt=0, description="train on a class-balanced subset of this many samples")
    val_split: float = Field(0.0, ge=0.0, lt=1.0, description="carve this fraction of the training set out as a validation set (e.g. 0.2)")
    seq_len: Optional[int] = Field(None, gt=0, description="text workloads: tokens (bytes) per training window (default: the gpt preset's context, else 256)")
    samples_per_epoch: int = Field(4096, gt=0, description="text workloads: random windows per epoch")
    eval_samples: int = Field(256, gt=0, description="text workloads: windows of each held-out text evaluated (evenly spaced, the same every epoch)")
    n_layer: Optional[int] = Field(None, gt=0, description="gpt models: transformer blocks (default: the preset's)")
    n_head: Optional[int] = Field(None, gt=0, description="gpt models: attention heads; must divide --n-embd (default: the preset's)")
    n_embd: Optional[int] = Field(None, gt=0, description="gpt models: width of the residual stream (default: the preset's)")
    loss: Optional[str] = Field(None, description="the loss as pkg.module:fn, called fn(output, target) -> scalar tensor (default: the workload's; a model whose forward takes targets returns its own)")

    # How to parallelise.
    workers: int = Field(1, gt=0, description="number of ranks (one per GPU, or per group of CPU cores)")
    strategy: Optional[str] = Field(None, description="parallel strategy: single, ddp, zero1, fsdp, pipeline, model-parallel or hybrid (default: ddp for workers > 1)")
    stages: Optional[int] = Field(None, gt=0, description="pipeline, model-parallel, hybrid: pipeline stages (default: --workers, or --workers / --dp for hybrid)")
    dp: Optional[int] = Field(None, gt=0, description="hybrid: data-parallel replicas of the pipeline; --dp x --stages = --workers")
    microbatches: int = Field(4, gt=0, description="pipeline, hybrid: micro-batches each batch is cut into; must divide --batch-size")
    pipeline_schedule: PipelineSchedule = Field("1f1b", description="pipeline, hybrid: gpipe (all forwards, then all backwards), 1f1b or interleaved (two stages per rank)")
    split: str = Field("auto", description="pipeline stages: auto (balanced by measured block time) or the names of the blocks that start stages 2..K, comma-separated")
    shard_unit: Optional[str] = Field(None, description="fsdp: the module class sharded as one unit (default: gpt blocks, ResNet stages, else each child of the model)")
    reshard_after_forward: bool = Field(True, description="fsdp: free gathered parameters after forward (ZeRO-3); false keeps them until backward (ZeRO-2-like, more memory, fewer all-gathers)")
    cpu_offload: bool = Field(False, description="fsdp: keep parameters, gradients and optimizer state in host memory (GPU runs)")
    memory_limit: Optional[str] = Field(None, description="bound each CPU rank's memory, e.g. 2G or 512M: a rank that needs more fails with an out-of-memory error")
    device: Device = Field("auto", description="where ranks compute: cuda (one GPU per rank), cpu (cores per rank, even on a GPU host), auto (cuda when GPUs are visible)")
    backend: Backend = Field("auto", description="torch.distributed backend: nccl on GPUs and gloo on CPU by default")
    allreduce: AllReduce = Field("auto", description="how CPU ranks on one host average gradients: shm (shared memory, x86-64 Linux), backend (the process group, e.g. gloo), auto (shm where it works)")
    bucket_cap_mb: float = Field(25.0, gt=0, description="DDP gradient bucket size in MB (DDP's default 25); smaller buckets start averaging earlier in backward")
    threads_per_worker: Optional[int] = Field(None, gt=0, description="CPU threads per rank (default: cores // workers)")
    allow_oversubscribe: bool = Field(False, description="allow more threads than cores (slow; for testing only)")

    # Batch, learning rate, optimizer.
    batch_size: int = Field(32, gt=0, description="samples per worker per micro-step")
    grad_accum: int = Field(1, gt=0, description="micro-steps per optimizer step (gradients are all-reduced on the last only)")
    lr: float = Field(0.001, gt=0, description="base learning rate, for --base-batch-size samples")
    lr_scaling: LRScaling = Field("linear", description="scale the LR with the global batch: linear (Goyal et al. 2017), sqrt, or none")
    base_batch_size: Optional[int] = Field(None, gt=0, description="the global batch --lr is meant for (default: --batch-size, i.e. one worker)")
    warmup_epochs: float = Field(0.0, ge=0, description="ramp the LR linearly from --lr to the scaled LR over these epochs")
    schedule: Schedule = Field("constant", description="LR schedule after warmup")
    lr_step_size: float = Field(30.0, gt=0, description="epochs between decays for --schedule step")
    lr_gamma: float = Field(0.1, gt=0, description="decay factor for --schedule step (per step) and exp (per epoch)")
    lr_decay_rate: float = Field(0.5, gt=0, description="--schedule inverse-time: lr / (1 + rate * epoch)")
    lr_power: float = Field(2.0, gt=0, description="--schedule poly: lr * (1 - t/T)^power")
    min_lr: float = Field(0.0, ge=0, description="floor of --schedule cosine and poly")
    optimizer: Optimizer = Field("sgd", description="sgd (momentum), adam, adamw, lars or lamb")
    momentum: float = Field(0.9, ge=0, lt=1, description="momentum of sgd and lars")
    weight_decay: float = Field(0.0, ge=0, description="weight decay (not applied to biases and norm layers)")
    epochs: int = Field(3, gt=0, description="passes over the training set")
    early_stop: int = Field(0, ge=0, description="stop when the validation loss has not improved for this many epochs (0: never); needs a validation split")

    # Compute.
    precision: Precision = Field("32", description="32, bf16 or fp16 autocast (fp16 uses a GradScaler on GPUs)")
    checkpoint_activations: bool = Field(False, description="recompute each block's activations in backward to save memory")
    compile: bool = Field(False, description="torch.compile the model (slow start, maybe faster steps)")
    augment: list[str] = Field(default_factory=list, description="batched on-device augmentation: any of flip,crop,jitter")
    loader_workers: int = Field(0, ge=0, description="> 0: feed batches through a DataLoader with this many worker processes instead of the in-memory path")

    # Run bookkeeping.
    seed: int = Field(0, description="seed of model init, shuffling and augmentation")
    run_dir: Optional[Path] = Field(None, description="run directory (default runs/<time>-<workload>-w<workers>)")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N epochs (0: never)")
    resume: bool = Field(False, description="continue the run in --run-dir from its checkpoint (same configuration)")
    log_every: int = Field(50, gt=0, description="optimizer steps between step events in metrics.jsonl (each reads the loss once)")
    monitor_hz: float = Field(2.0, gt=0, description="samples per second of the monitor (CPU, memory and GPU use of the host and each rank) into RUN_DIR/system.jsonl")
    quiet: bool = Field(False, description="no progress bar or table")
    tensorboard: Optional[Path] = Field(None, description="also write TensorBoard event files to this directory while training")
    mlflow: Optional[str] = Field(None, description="after training, log params, metrics and the report to this MLflow tracking URI (e.g. sqlite:///mlflow.db)")
    mlflow_experiment: str = Field("paratrain", description="MLflow experiment name")

    @field_validator("model", "dataset", "loss", mode="before")
    @classmethod
    def _callable_to_spec(cls, value: Any) -> Any:
        """`paratrain.train(model=make_net)`: a function or class becomes its `module:qualname`, which
        every rank imports (the run's config.json stays plain JSON)."""
        if value is None or isinstance(value, str) or not callable(value):
            return value
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
        if not module or "<" in qualname:
            raise ValueError(f"{qualname or value!r} is a lambda or is defined inside a function, which the ranks cannot "
                             "import; define it at the top level of a module")
        return f"{module}:{qualname}"

    @field_validator("augment", mode="before")
    @classmethod
    def _split_augment(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("synthetic_shape", mode="before")
    @classmethod
    def _split_shape(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.replace("x", ",").split(","))
            except ValueError:
                raise ValueError("expected C,H,W such as 3,32,32") from None
        return value

    @field_validator("memory_limit")
    @classmethod
    def _a_size(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            parse_size(value)
        return value

    @field_validator("augment")
    @classmethod
    def _known_augmentations(cls, value: list[str]) -> list[str]:
        known = ("flip", "crop", "jitter")
        for name in value:
            if name not in known:
                raise ValueError(f"unknown augmentation {name!r}; choose from {','.join(known)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        for name in ("model", "dataset", "loss"):
            spec = getattr(self, name)
            if self.workers > 1 and spec and spec.startswith("__main__:") and not hasattr(sys.modules["__main__"], "__file__"):
                raise ValueError(f"--{name} {spec.partition(':')[2]} is defined in a notebook or an interactive session, which "
                                 "spawned ranks cannot import; move it into a .py file beside the notebook and import it "
                                 "from there (or use --workers 1)")
        if self.strategy == "single" and self.workers != 1:
            raise ValueError("strategy 'single' runs one worker; use --strategy ddp for --workers > 1")
        if self.warmup_epochs >= self.epochs and self.warmup_epochs > 0:
            raise ValueError(f"--warmup-epochs ({self.warmup_epochs}) must be shorter than --epochs ({self.epochs})")
        return self

    @model_validator(mode="after")
    def _pipeline_layout(self) -> "TrainConfig":
        """The stages x replicas layout of pipeline, model-parallel and hybrid fits the ranks and the batch."""
        name = self.strategy_name
        if name not in STAGED_STRATEGIES:
            for given in ("stages", "dp"):
                if getattr(self, given) is not None:
                    raise ValueError(f"--{given} lays out pipeline stages; it applies to --strategy pipeline, model-parallel "
                                     f"or hybrid, not {name}")
            return self
        if self.dp is not None and name != "hybrid":
            raise ValueError(f"--dp replicates a pipeline; use --strategy hybrid --dp {self.dp} (--strategy {name} runs one pipeline)")
        if name == "hybrid" and self.dp is None and self.stages is None:
            raise ValueError(f"--strategy hybrid needs its layout: --dp D (replicas) and/or --stages K with D x K = --workers "
                             f"({self.workers}), e.g. --dp 2 --stages {max(2, self.workers // 2)}")
        stages = self.pipeline_stages
        replicas = (self.dp or self.workers // stages) if name == "hybrid" else 1
        if replicas * stages != self.workers:
            layout = f"--dp {replicas} x --stages {stages}" if name == "hybrid" else f"--stages {stages} (one rank per stage)"
            raise ValueError(f"{layout} needs {max(1, replicas) * stages} workers and --workers is {self.workers}; "
                             "make them match")
        if stages < 2:
            raise ValueError(f"--strategy {name} splits the model into at least 2 stages (got --stages {stages}); "
                             "with one stage use --strategy single or ddp")
        if name == "model-parallel":
            for given, value in (("microbatches", 1), ("pipeline_schedule", "gpipe")):
                # Compared with the default, not with the fields given: the ranks get every field.
                if getattr(self, given) not in (value, type(self).model_fields[given].default):
                    raise ValueError(f"--strategy model-parallel runs the whole batch as one micro-batch (GPipe); "
                                     f"for {flag(given)} use --strategy pipeline")
        elif self.batch_size % self.microbatches:
            raise ValueError(f"--microbatches {self.microbatches} does not divide --batch-size {self.batch_size}; "
                             f"the micro-batches must be equal: choose a batch that is a multiple of {self.microbatches}")
        elif self.pipeline_schedule == "1f1b" and self.microbatches < stages:
            raise ValueError(f"--pipeline-schedule 1f1b needs at least one micro-batch per stage: --microbatches "
                             f"{self.microbatches} < --stages {stages}; raise --microbatches or use gpipe")
        elif self.pipeline_schedule == "interleaved" and self.microbatches % max(1, self.microbatches // stages):
            raise ValueError(f"--pipeline-schedule interleaved runs --microbatches in rounds of --stages ({stages}); "
                             f"--microbatches {self.microbatches} does not fill them evenly: use a multiple of {stages}")
        if self.grad_accum > 1:
            raise ValueError(f"--strategy {name} accumulates gradients over its micro-batches within a step; instead of "
                             "--grad-accum raise --batch-size and --microbatches together")
        for given, wrong, fix in (("compile", True, "drop --compile"), ("precision", "fp16", "use --precision bf16")):
            if getattr(self, given) == wrong:
                why = ("compiles a whole model, and a stage is a part of one" if given == "compile" else
                       "needs one loss scaler whose skipped steps every stage agrees on")
                raise ValueError(f"{flag(given)} {str(wrong).lower()} is not supported with --strategy {name} ({why}); {fix}")
        return self

    # Derived values: computed here once so config.json, the ranks and the analysis agree.
    @property
    def strategy_name(self) -> str:
        return self.strategy or ("ddp" if self.workers > 1 else "single")

    @property
    def pipeline_stages(self) -> int:
        """Ranks one copy of the model is split across (1 unless the strategy splits layers)."""
        if self.strategy_name not in STAGED_STRATEGIES:
            return 1
        if self.stages is not None:
            return self.stages
        return self.workers // self.dp if self.dp else self.workers

    @property
    def data_parallel_size(self) -> int:
        """Replicas that each take a different share of the batch."""
        return max(1, self.workers // self.pipeline_stages)

    @property
    def global_batch_size(self) -> int:
        return self.data_parallel_size * self.batch_size * self.grad_accum

    @property
    def reference_batch_size(self) -> int:
        return self.base_batch_size or self.batch_size * self.grad_accum

    def identity(self) -> str:
        """A fingerprint of everything that shapes the training trajectory.

        A checkpoint may only be resumed by a run with the same identity; run-control fields
        (where to write, how often to log or checkpoint, the progress display) may differ.
        """
        # `device` is left out: "auto" resolves differently on different machines, so the checkpoint
        # records the device kind its ranks used and launch compares that instead.
        # Fields at their defaults are left out, so a new option added with a default that keeps the
        # old behaviour does not orphan the checkpoints written before it existed.
        payload = self.model_dump(mode="json", exclude={*RUN_CONTROL_FIELDS, "device", *self.reshardable_fields()},
                                  exclude_defaults=True)
        if self.reshardable_fields():
            payload["global_batch_size"] = self.global_batch_size
            payload["reference_batch_size"] = self.reference_batch_size
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def reshardable_fields(self) -> tuple[str, ...]:
        """Fields a resumed run may change because its checkpoint is resharded on load.

        fsdp checkpoints go through torch.distributed.checkpoint, which reshards on load: a run
        saved on N ranks resumes on M. How the global batch is split across the ranks may then
        change; the global batch and the batch its LR is scaled from (both in the identity) may not.
        """
        return ("workers", "batch_size", "base_batch_size") if self.strategy_name == "fsdp" else ()

    @property
    def memory_limit_bytes(self) -> Optional[int]:
        return parse_size(self.memory_limit) if self.memory_limit is not None else None


_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """'2G', '512M', '1.5G', '1048576' -> bytes (binary units; a trailing B or iB is allowed)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a size; write it like 2G, 512M or 1.5G")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML, TOML or JSON config file into a dict of TrainConfig keys (dashes allowed)."""
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist; pass an existing .yaml, .toml or .json file")
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    # UnicodeDecodeError (not UTF-8 text), json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors.
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(f"config file {path} does not parse: {first}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of option names to values")
    return {key.replace("-", "_"): value for key, value in data.items()}


def validate(model: type[BaseModel], values: dict[str, Any]) -> Any:
    """Build `model` from `values`, turning the first validation error into a one-line UsageError."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            raise UsageError(f"unknown option {flag(where)}; see --help for the options") from None
        got = error.get("input")
        shown = f" (got {got!r})" if where and not isinstance(got, dict) and "(got" not in message else ""
        prefix = f"{flag(where)}: " if where else ""
        raise UsageError(f"{prefix}{message}{shown}") from None


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


# The train flags that also apply to a study of a user's script (`scale --script`).
SCRIPT_STUDY_FLAGS = ("threads_per_worker", "allow_oversubscribe", "monitor_hz")


class ScaleConfig(BaseModel):
    """`paratrain scale`: the same training job on several worker counts."""

    model_config = ConfigDict(extra="forbid")

    workers: list[int] = Field(description="worker counts to run, e.g. 1,2,4")
    mode: Literal["weak", "strong"] = Field("weak", description="weak: the per-worker batch stays, the global batch grows with N; strong: the global batch stays and is split")
    repeats: int = Field(1, gt=0, description="runs per point; the table reports medians and spread")
    workload: list[str] = Field(default_factory=lambda: ["cifar10-cnn"], description="workload(s) to study, comma-separated or repeated; one line per workload in every plot")
    strategy: list[str] = Field(default_factory=list, description="strategies to compare, e.g. ddp,fsdp,pipeline: one line per workload and strategy, all measured against the same 1-worker run (default: the train default, ddp)")
    out: Path = Field(description="study directory: scaling.json, runs/, plots, report.html")
    resume: bool = Field(False, description="continue an interrupted study in --out, skipping finished points")
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags every point shares")
    script: Optional[Path] = Field(None, description="study your own torchrun-style script instead of a workload; it reports its throughput with paratrain.report(samples_per_s=...)")
    script_args: list[str] = Field(default_factory=list, description="arguments after -- passed to the script")

    @field_validator("workers", "workload", "strategy", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return [part.strip() for v in value for part in v.split(",") if part.strip()]
        return value

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
    def _script_flags(self) -> "ScaleConfig":
        if self.script is not None:
            if "workload" in self.model_fields_set:
                raise ValueError("--workload names a built-in workload; with --script the study runs your script, drop --workload")
            shared = [k for k in self.train if k not in SCRIPT_STUDY_FLAGS]
            if shared:
                raise ValueError(f"train flags ({', '.join(flag(k) for k in shared)}) apply to built-in workloads; "
                                 "with --script pass your script's own arguments after --")
            if self.strategy:
                raise ValueError("--strategy chooses paratrain's strategies for built-in workloads; your script "
                                 "parallelises itself, drop --strategy")
        if "single" in self.strategy:
            raise ValueError("--strategy single runs one worker, and it already is every line's 1-worker point; "
                             "list only strategies for more workers (e.g. ddp,fsdp)")
        if len(set(self.strategy)) != len(self.strategy):
            raise ValueError(f"strategies must not repeat (got {','.join(self.strategy)})")
        return self


class LaunchConfig(BaseModel):
    """`paratrain launch`: any torchrun-style script on N local ranks, into a run directory."""

    model_config = ConfigDict(extra="forbid")

    script: Path = Field(description="the program every rank runs: a .py file (run with this Python) or an executable")
    script_args: list[str] = Field(default_factory=list, description="arguments passed to the script")
    workers: int = Field(1, gt=0, description="ranks to start")
    threads_per_worker: Optional[int] = Field(None, gt=0, description="CPU threads per rank, pinned to their own cores (default: cores // ranks)")
    allow_oversubscribe: bool = Field(False, description="allow more threads than cores (slow; for testing only)")
    run_dir: Optional[Path] = Field(None, description="run directory (default runs/<time>-<script>-w<ranks>)")
    monitor_hz: float = TrainConfig.model_fields["monitor_hz"]
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables of the ranks")


class SweepConfig(BaseModel):
    """`paratrain sweep`: a hyperparameter search, N trials at once (inter-model parallelism)."""

    model_config = ConfigDict(extra="forbid")

    config: Optional[Path] = Field(None, description="the search space: Comet optimizer format (JSON, YAML, or JSON with # comments)")
    out: Optional[Path] = Field(None, description="sweep directory: sweep.json, study storage, trials/, plots, report.html")
    jobs: int = Field(1, gt=0, description="trials running at once, each on its own cores (or GPUs)")
    script: Optional[Path] = Field(None, description="your training program (any executable, or a .py run with this Python); "
                                                     "without it, trials are paratrain workloads built from the train flags")
    script_args: list[str] = Field(default_factory=list, description="arguments after -- passed to every trial before the parameters")
    param_style: Literal["space", "equals", "plain", "none"] = Field(
        "space", description="how parameters reach the script: --name value | --name=value | name=value | none (PARATRAIN_PARAMS only)")
    workers_per_trial: int = Field(1, gt=0, description="data-parallel workers (ranks) inside each trial")
    storage: Optional[str] = Field(None, description="Optuna storage URL shared by machines, e.g. postgresql://user@host/db "
                                                     "(default: a journal file in the sweep directory)")
    join: Optional[str] = Field(None, description="add workers to an existing sweep: its directory or storage URL")
    study_name: Optional[str] = Field(None, description="the study's name in the storage (default: the config's name)")
    pruner: Literal["median", "none"] = Field("median", description="stop trials whose intermediate metric is worse than "
                                                                      "the median of earlier trials at the same step")
    trial_timeout: Optional[float] = Field(None, gt=0, description="seconds after which a trial is stopped and recorded as failed")
    # Optuna's study.optimize(n_trials=, timeout=): limits on what this command starts; running trials finish.
    n_trials: Optional[int] = Field(None, gt=0, description="start at most this many trials in this command, then stop "
                                                            "(rerun to continue); running trials finish")
    timeout: Optional[float] = Field(None, gt=0, description="start no trial after this many seconds of this command; "
                                                             "running trials finish")
    allow_oversubscribe: bool = Field(False, description="allow more concurrent workers than cores/GPUs")
    quiet: bool = Field(False, description="no live table; one line per finished trial")
    train: dict[str, Any] = Field(default_factory=dict, description="the train flags every built-in trial shares")

    @model_validator(mode="after")
    def _consistent(self) -> "SweepConfig":
        if self.join is None and (self.config is None or self.out is None):
            raise ValueError("give the search-space file and --out DIR (or --join DIR_OR_URL to help a running sweep)")
        if self.join is not None and self.config is not None:
            raise ValueError("--join takes the running sweep's own search space; drop the CONFIG argument")
        if self.script is not None and self.train:
            names = ", ".join(flag(k) for k in self.train)
            raise ValueError(f"train flags ({names}) apply to built-in workloads; with --script pass them after --")
        return self
