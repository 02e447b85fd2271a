"""The typed inputs of every command.

One pydantic model per command. Each field is a flag of its command: its name, type, default and
description are the flag's, so the model is the single place a flag is declared. The CLI is
generated from the models (cli.py, `add_config_flags`), config files (YAML, TOML, JSON) use the same
keys, and a model with a `train` field takes every train flag too, less those it sets itself
(`train_flags_left_out`). A field that is not a plain `--name VALUE` says how it appears with
`json_schema_extra=cli(...)`. Validation failures become one-line UsageErrors naming the flag.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import tomllib
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from paratrain.errors import UsageError

Precision = Literal["32", "bf16", "fp16"]
LRScaling = Literal["none", "linear", "sqrt"]
Schedule = Literal["constant", "step", "exp", "inverse-time", "poly", "cosine", "range-test"]
Optimizer = Literal["sgd", "adam", "adamw", "lars", "lamb"]
Backend = Literal["auto", "gloo", "nccl", "mpi"]
Device = Literal["auto", "cpu", "cuda"]
AllReduce = Literal["auto", "shm", "backend"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]
GradCompression = Literal["none", "fp16", "bf16", "powersgd"]
Reduce = Literal["allreduce", "ps"]
# Strategies that split the model's layers into stages, one per rank of a pipeline.
STAGED_STRATEGIES = ("pipeline", "model-parallel", "hybrid")
# Strategies whose checkpoints go through torch.distributed.checkpoint, which reshards them on load; and
# the fields that lay a run out on its ranks, which a resume of such a checkpoint may change.
SHARDED_CHECKPOINTS = ("fsdp", "tp")
LAYOUT_FIELDS = ("strategy", "workers", "tp", "dp_replicate", "batch_size", "base_batch_size")


def cli(**how: Any) -> dict[str, Any]:
    """How a field appears on the command line when not as `--field-name VALUE`, for
    `Field(..., json_schema_extra=cli(...))`. Keys: positional (an argument, not a flag); nargs ("?",
    "+", or "..." for everything after it, as torchrun takes a script's arguments); short ("-n");
    flag (its spelling when it differs: --no-probe turns off a field that is on by default); metavar;
    const (the value of a flag given without one); hidden (never a flag: set after `--`, or by Python)."""
    return {"cli": how}


def cli_options(field: Any) -> dict[str, Any]:
    """What `cli(...)` declared for a pydantic field (empty for a plain flag)."""
    extra = field.json_schema_extra
    return extra.get("cli", {}) if isinstance(extra, dict) else {}


def comma_separated(value: Any) -> Any:
    """A list flag's input: '1,2,4', or ['1,2', '4'] from a flag given twice, -> ['1', '2', '4']."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [part.strip() for v in value for part in v.split(",") if part.strip()]
    return value


@dataclass(frozen=True)
class CommandText:
    """A command's words on the command line: its one-line help (in `paratrain --help`), the
    description atop its own --help, and an example command line."""

    help: str
    description: str = ""
    example: str = ""


# Train flags that only a run across nodes takes; a study's and a sweep's runs are on this machine.
ACROSS_NODES = ("nodes", "node_rank", "rdzv", "rdzv_backend", "rdzv_timeout")
# Train flags that find-batch, noise-scale, lr-find and recommend set themselves on the runs they start.
BATCH_COMMAND_OWNED = ("run_dir", "resume", "quiet", "max_steps", "grad_noise", "schedule", "lr_end")


# Fields that say where and how to record a run, not what it trains: a resumed run may change them.
# --memory-limit too: a run that ran out of memory resumes with a higher limit.
RUN_CONTROL_FIELDS = (
    "run_dir",
    "resume",
    "quiet",
    "checkpoint_every",
    "log_every",
    "cache_dir",
    "tensorboard",
    "mlflow",
    "mlflow_experiment",
    "monitor_hz",
    "memory_limit",
    # Where the ranks run and how failures are handled do not change the trajectory.
    "nodes",
    "node_rank",
    "rdzv",
    "rdzv_backend",
    "rdzv_timeout",
    "max_restarts",
    "timeout",
)


class TrainConfig(BaseModel):
    """Everything `paratrain train` needs; `paratrain.train(TrainConfig(...))` takes the same."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    command_text: ClassVar[CommandText] = CommandText(
        help="train one workload on N workers and write a run directory",
        description="Train one workload on N workers (ranks) and write a run directory (config.json, metrics.jsonl, "
        "summary.json, logs/).",
    )
    # Sections of `paratrain train --help`, each starting at the named field.
    flag_sections: ClassVar[dict[str, str]] = {
        "workload": "what to train",
        "workers": "parallelism",
        "batch_size": "batch, learning rate and optimizer",
        "precision": "compute",
        "seed": "run directory and bookkeeping",
    }

    # What to train.
    workload: str = Field("cifar10-cnn", description="named workload (model + dataset); see `paratrain workloads`")
    model: str | None = Field(
        None, description="override the workload's model: a registered name or pkg.module:factory"
    )
    dataset: str | None = Field(
        None, description="override the workload's dataset: cifar10, synthetic, text or pkg.module:factory"
    )
    data_dir: Path | None = Field(
        None,
        description="CIFAR-10 as cifar-10-python.tar.gz / cifar-10-batches-py, or an image tree train|test/<class>/* "
        "(folder or .tar.gz); default: the bundled offline subset. Text workloads: a UTF-8 text file or a "
        "folder of them; default: Python's own sources",
    )
    cache_dir: Path | None = Field(
        None, description="where decoded datasets are cached (default $PARATRAIN_CACHE or ~/.cache/paratrain)"
    )
    image_size: int | None = Field(
        None, gt=0, description="resize images to this many pixels a side (on the device, per batch)"
    )
    synthetic_samples: int = Field(10000, gt=0, description="training samples of the synthetic dataset")
    synthetic_shape: tuple[int, int, int] = Field((3, 32, 32), description="C,H,W of the synthetic dataset")
    num_classes: int = Field(10, gt=1, description="classes of the synthetic dataset")
    limit_train: int | None = Field(None, gt=0, description="train on a class-balanced subset of this many samples")
    val_split: float = Field(
        0.0, ge=0.0, lt=1.0, description="carve this fraction of the training set out as a validation set (e.g. 0.2)"
    )
    seq_len: int | None = Field(
        None,
        gt=0,
        description="text workloads: tokens (bytes) per training window (default: the gpt preset's context, else 256)",
    )
    samples_per_epoch: int = Field(4096, gt=0, description="text workloads: random windows per epoch")
    eval_samples: int = Field(
        256,
        gt=0,
        description="text workloads: windows of each held-out text evaluated (evenly spaced, the same every epoch)",
    )
    n_layer: int | None = Field(None, gt=0, description="gpt models: transformer blocks (default: the preset's)")
    n_head: int | None = Field(
        None, gt=0, description="gpt models: attention heads; must divide --n-embd (default: the preset's)"
    )
    n_embd: int | None = Field(
        None, gt=0, description="gpt models: width of the residual stream (default: the preset's)"
    )
    loss: str | None = Field(
        None,
        description="the loss as pkg.module:fn, called fn(output, target) -> scalar tensor (default: the workload's; a "
        "model whose forward takes targets returns its own)",
    )

    # How to parallelise.
    workers: int = Field(1, gt=0, description="number of ranks (one per GPU, or per group of CPU cores)")
    strategy: str | None = Field(
        None,
        description="parallel strategy: single, ddp, zero1, fsdp, pipeline, model-parallel, hybrid or async-ps "
        "(default: ddp for workers > 1)",
    )
    tp: int = Field(
        1,
        gt=0,
        description="tensor parallelism: ranks that split each layer's matmuls (the model declares which layers; gpt "
        "does); --workers alone, or a divisor of it with --strategy fsdp",
    )
    tp_plan: str | None = Field(
        None,
        description="--tp: the plan as pkg.module:fn, called fn(model, degree) -> {module path: 'colwise', "
        "'rowwise' or 'replicated-input'} (default: the model's own tensor_parallel_plan method)",
    )
    sequence_parallel: bool = Field(
        False,
        description="--tp: also split the activations between the split layers by sequence (Korthikanti et al. "
        "2022): norms and residuals hold 1/T of the tokens, each all-reduce becomes an all-gather and a "
        "reduce-scatter (the model's plan has a sequence-parallel form; gpt's does)",
    )
    dp_replicate: int = Field(
        1,
        gt=0,
        description="fsdp: replicas of the sharded model (HSDP): FSDP shards over --workers / (R x --tp) ranks, and "
        "the R replicas all-reduce their gradients; in a layout (--dp-shard, --pp): the replicas of whatever the "
        "other dimensions lay out",
    )
    dp_shard: int | None = Field(
        None,
        gt=0,
        description="the ranks as a mesh, torchtitan's way (--dp-replicate R x --dp-shard S x --tp T x --pp P = "
        "--workers; the strategies are presets of it): S ranks FSDP shards each replica over (--dp-shard N is "
        "--strategy fsdp)",
    )
    pp: int | None = Field(
        None,
        gt=0,
        description="the mesh's pipeline stages (--pp P is --strategy pipeline --stages P; with --dp-replicate R, "
        "--strategy hybrid --dp R)",
    )
    stages: int | None = Field(
        None,
        gt=0,
        description="pipeline, model-parallel, hybrid: pipeline stages (default: --workers, or --workers / --dp for "
        "hybrid)",
    )
    dp: int | None = Field(
        None, gt=0, description="hybrid: data-parallel replicas of the pipeline; --dp x --stages = --workers"
    )
    microbatches: int = Field(
        4, gt=0, description="pipeline, hybrid: micro-batches each batch is cut into; must divide --batch-size"
    )
    pipeline_schedule: PipelineSchedule = Field(
        "1f1b",
        description="pipeline, hybrid: gpipe (all forwards, then all backwards), 1f1b or interleaved (two stages per "
        "rank)",
    )
    split: str = Field(
        "auto",
        description="pipeline stages: auto (balanced by measured block time) or the names of the blocks that start "
        "stages 2..K, comma-separated",
    )
    shard_unit: str | None = Field(
        None,
        description="fsdp: the module class sharded as one unit (default: gpt blocks, ResNet stages, else each "
        "child of the model)",
    )
    reshard_after_forward: bool = Field(
        True,
        description="fsdp: free gathered parameters after forward (ZeRO-3); false keeps them until backward "
        "(ZeRO-2-like, more memory, fewer all-gathers)",
    )
    cpu_offload: bool = Field(
        False, description="fsdp: keep parameters, gradients and optimizer state in host memory (GPU runs)"
    )
    memory_limit: str | None = Field(
        None,
        description="bound each CPU rank's memory, e.g. 2G or 512M: a rank that needs more fails with an out-of-memory "
        "error",
    )
    device: Device = Field(
        "auto",
        description="where ranks compute: cuda (one GPU per rank), cpu (cores per rank, even on a GPU host), auto "
        "(cuda when GPUs are visible)",
    )
    backend: Backend = Field("auto", description="torch.distributed backend: nccl on GPUs and gloo on CPU by default")
    allreduce: AllReduce = Field(
        "auto",
        description="how CPU ranks on one host average gradients: shm (shared memory, x86-64 Linux), backend (the "
        "process group, e.g. gloo), auto (shm where it works)",
    )
    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        description="DDP gradient bucket size in MB (DDP's default 25); smaller buckets start averaging earlier in "
        "backward",
    )
    threads_per_worker: int | None = Field(None, gt=0, description="CPU threads per rank (default: cores // workers)")
    allow_oversubscribe: bool = Field(False, description="allow more threads than cores (slow; for testing only)")

    # Across nodes, and surviving a lost worker (launch/nodes.py, docs/cluster.md).
    nodes: int = Field(
        1, gt=0, description="machines taking part; --workers counts the ranks of all of them and is split evenly"
    )
    node_rank: int | None = Field(
        None,
        ge=0,
        description="this machine's index, 0 .. --nodes - 1; node 0 hosts the rendezvous, holds global rank 0 and "
        "writes the run directory",
    )
    rdzv: str | None = Field(
        None,
        description="HOST:PORT of the rendezvous, an address of node 0 that every node can reach (needs --nodes > 1)",
    )
    rdzv_backend: Literal["c10d"] = Field(
        "c10d", description="torch elastic rendezvous backend (c10d: a TCP store hosted by node 0's agent)"
    )
    rdzv_timeout: float = Field(
        900.0, gt=0, description="seconds to wait for the rendezvous to be reached and for every node to join"
    )
    max_restarts: int = Field(
        0,
        description="when a rank dies, restart every rank up to this many times; each restart resumes from the last "
        "checkpoint",
    )
    timeout: float = Field(
        600.0,
        gt=0,
        description="seconds a collective may wait for a peer before the run fails naming the rank and what it was "
        "doing",
    )

    # Synchronising less, sending less, waiting less (engine/strategies/ddp.py, async_ps.py; docs/synchronisation.md).
    sync_every: int = Field(
        1,
        gt=0,
        description="ddp: local SGD: each rank steps on its own gradients and the parameters are averaged every H "
        "optimizer steps (1: gradients averaged every step, plain DDP)",
    )
    sync_warmup: int = Field(
        0,
        ge=0,
        description="ddp with --sync-every > 1: average gradients every step for the first S optimizer steps, then "
        "local SGD",
    )
    grad_compression: GradCompression = Field(
        "none",
        description="ddp: compress gradients before averaging: fp16 or bf16 (half the bytes; bf16 needs a CUDA "
        "build of torch), powersgd (low-rank, --powersgd-rank)",
    )
    powersgd_rank: int = Field(
        2,
        gt=0,
        description="--grad-compression powersgd: rank of each gradient matrix's approximation (2: one of the ranks "
        "Vogels et al. report on CIFAR-10)",
    )
    powersgd_start: int = Field(
        10,
        gt=1,
        description="--grad-compression powersgd: optimizer steps of uncompressed averaging first (at least 2: DDP "
        "rebuilds its buckets after step 1)",
    )
    reduce: Reduce = Field(
        "allreduce",
        description="ddp: allreduce (every rank sums), or ps: gradients reduced to rank 0, which broadcasts the "
        "average back (a synchronous parameter server)",
    )
    ps_ranks: int = Field(
        1,
        gt=0,
        description="async-ps: ranks that hold the parameters (sharded across them when > 1); the other --workers "
        "train",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="async-ps: a worker more than S updates ahead of the slowest waits (stale-synchronous, Ho et al. "
        "2013); default: fully asynchronous",
    )

    # Batch, learning rate, optimizer.
    batch_size: int = Field(32, gt=0, description="samples per worker per micro-step")
    grad_accum: int = Field(
        1, gt=0, description="micro-steps per optimizer step (gradients are all-reduced on the last only)"
    )
    lr: float = Field(0.001, gt=0, description="base learning rate, for --base-batch-size samples")
    lr_scaling: LRScaling = Field(
        "linear", description="scale the LR with the global batch: linear (Goyal et al. 2017), sqrt, or none"
    )
    base_batch_size: int | None = Field(
        None, gt=0, description="the global batch --lr is meant for (default: --batch-size, i.e. one worker)"
    )
    warmup_epochs: float = Field(
        0.0, ge=0, description="ramp the LR linearly from --lr to the scaled LR over these epochs"
    )
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
    early_stop: int = Field(
        0,
        ge=0,
        description="stop when the validation loss has not improved for this many epochs (0: never); needs a "
        "validation split",
    )

    # Measurements for choosing the batch and the LR (paratrain find-batch, noise-scale, lr-find; docs/batch-size.md).
    max_steps: int | None = Field(
        None,
        gt=0,
        description="stop after this many optimizer steps (the last epoch may be partial); schedules end there",
    )
    lr_end: float | None = Field(
        None,
        gt=0,
        description="--schedule range-test: the LR of the last step; the LR grows exponentially from --lr to it (an LR "
        "range test)",
    )
    grad_noise: bool = Field(
        False,
        description="record each step's squared gradient norms of a small and a big batch (ddp: this rank's gradient "
        "and the average; one worker: the first micro-batch and the whole --grad-accum step) into "
        "RUN_DIR/grad_noise/rank<R>.jsonl, for the gradient noise scale",
    )

    # Compute.
    precision: Precision = Field("32", description="32, bf16 or fp16 autocast (fp16 uses a GradScaler on GPUs)")
    checkpoint_activations: bool = Field(
        False, description="recompute each block's activations in backward to save memory"
    )
    checkpoint_activations_every: int = Field(
        1,
        ge=1,
        description="with --checkpoint-activations: recompute every Nth block only and keep the others' activations "
        "(torchtitan's selective layer checkpointing: N = 2 recomputes half the blocks)",
    )
    compile: bool = Field(False, description="torch.compile the model (slow start, maybe faster steps)")
    augment: list[str] = Field(
        default_factory=list, description="batched on-device augmentation: any of flip,crop,jitter"
    )
    loader_workers: int = Field(
        0,
        ge=0,
        description="> 0: feed batches through a DataLoader with this many worker processes instead of the in-memory "
        "path",
    )

    # Run bookkeeping.
    seed: int = Field(0, description="seed of model init, shuffling and augmentation")
    run_dir: Path | None = Field(None, description="run directory (default runs/<time>-<workload>-w<workers>)")
    checkpoint_every: str | int = Field(
        0, description="save a checkpoint every N epochs (N or Nepochs) or every N optimizer steps (Nsteps); 0: never"
    )
    resume: bool = Field(False, description="continue the run in --run-dir from its checkpoint (same configuration)")
    log_every: int = Field(
        50, gt=0, description="optimizer steps between step events in metrics.jsonl (each reads the loss once)"
    )
    monitor_hz: float = Field(
        2.0,
        gt=0,
        description="samples per second of the monitor (CPU, memory and GPU use of the host and each rank) into "
        "RUN_DIR/system.jsonl",
    )
    quiet: bool = Field(False, description="no progress bar or table")
    tensorboard: Path | None = Field(
        None, description="also write TensorBoard event files to this directory while training"
    )
    mlflow: str | None = Field(
        None,
        description="after training, log params, metrics and the report to this MLflow tracking URI (e.g. sqlite:///mlflow.db)",
    )
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
            raise ValueError(
                f"{qualname or value!r} is a lambda or is defined inside a function, which the ranks cannot "
                "import; define it at the top level of a module"
            )
        return f"{module}:{qualname}"

    @field_validator("augment", mode="before")
    @classmethod
    def _split_augment(cls, value: Any) -> Any:
        return comma_separated(value)

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
    def _a_size(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value

    @field_validator("checkpoint_every")
    @classmethod
    def _checkpoint_interval(cls, value: str | int) -> str | int:
        """N or Nepochs -> N (epochs, an int as before); Nsteps -> "Nsteps"."""
        match = re.fullmatch(r"\s*(\d+)\s*(epochs?|steps?)?\s*", str(value).lower())
        if isinstance(value, bool) or not match:
            raise ValueError(
                f"{value!r} is not an interval; write N or Nepochs (every N epochs) or Nsteps (every N optimizer steps)"
            )
        count, unit = int(match.group(1)), match.group(2) or "epochs"
        return f"{count}steps" if unit.startswith("step") and count else count

    @field_validator("max_restarts")
    @classmethod
    def _restarts(cls, value: int) -> int:
        if value < 0:
            raise ValueError(
                "must be 0 (a rank that dies ends the run) or more (restarts, each resuming from the last checkpoint)"
            )
        return value

    @field_validator("rdzv")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"{value!r} is not HOST:PORT; give node 0's address and a free port, e.g. 10.0.0.1:29400"
                )
        return value

    @field_validator("augment")
    @classmethod
    def _known_augmentations(cls, value: list[str]) -> list[str]:
        known = ("flip", "crop", "jitter")
        for name in value:
            if name not in known:
                raise ValueError(f"unknown augmentation {name!r}; choose from {','.join(known)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _layout_flags(cls, values: Any) -> Any:
        """--dp-shard and --pp (with --dp-replicate and --tp): the layout as a mesh, another spelling of the
        strategies, turned into theirs before the fields are validated, so that a run has one configuration
        whichever spelling it was given."""
        if not isinstance(values, dict) or (values.get("dp_shard") is None and values.get("pp") is None):
            return values
        values = dict(values)
        given = {k: values.get(k) for k in ("strategy", "stages", "dp") if values.get(k) is not None}
        if given:
            name, value = next(iter(given.items()))
            raise ValueError(f"--dp-shard and --pp lay the ranks out themselves; drop {flag(name)} {value}")
        try:
            r, s, t, p, workers = (
                int(default if value is None else value)
                for value, default in (
                    (values.pop(k, None), 1) for k in ("dp_replicate", "dp_shard", "tp", "pp", "workers")
                )
            )
        except (TypeError, ValueError):
            raise ValueError("--dp-replicate, --dp-shard, --tp, --pp and --workers take whole numbers") from None
        if min(r, s, t, p) < 1:
            raise ValueError("each dimension of the layout (--dp-replicate, --dp-shard, --tp, --pp) is at least 1")
        if r * s * t * p != workers:
            raise ValueError(
                f"the layout --dp-replicate {r} x --dp-shard {s} x --tp {t} x --pp {p} is {r * s * t * p} ranks and "
                f"--workers is {workers}; make the product of the layout --workers"
            )
        if p > 1 and (s > 1 or t > 1):
            raise ValueError(
                f"--pp with {'--dp-shard' if s > 1 else '--tp'} is not supported yet: a pipeline's stages are "
                "replicated whole (--pp with --dp-replicate), or the layers split and sharded without stages"
            )
        if t > 1 and s == 1 and r > 1:
            raise ValueError(
                "--dp-replicate with --tp needs --dp-shard S (S >= 2): data parallelism over tensor-parallel groups "
                "is FSDP's (DDP does not take split layers)"
            )
        values |= {"workers": workers, "tp": t}
        if p > 1:
            values |= {"strategy": "pipeline" if r == 1 else "hybrid", "stages": p}
            if r > 1:
                values["dp"] = r
        elif s > 1:
            values |= {"strategy": "fsdp", "dp_replicate": r}
        # otherwise replicas alone, or one tensor-parallel group: what --workers (and --tp) pick by default
        return values

    @property
    def mesh_layout(self) -> dict[str, int] | None:
        """The run's ranks as torchtitan's mesh: replicas x shards x tensor-parallel x pipeline stages, whichever
        spelling the run was given (None for async-ps, whose ranks are servers and workers)."""
        name, stages = self.strategy_name, self.pipeline_stages
        if name == "async-ps":
            return None
        if name == "fsdp":
            shard = self.workers // (self.dp_replicate * self.tp)
            return {"dp_replicate": self.dp_replicate, "dp_shard": shard, "tp": self.tp, "pp": 1}
        replicas = self.workers // (stages * self.tp)
        return {"dp_replicate": replicas, "dp_shard": 1, "tp": self.tp, "pp": stages}

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        for name in ("model", "dataset", "loss"):
            spec = getattr(self, name)
            if (
                self.workers > 1
                and spec
                and spec.startswith("__main__:")
                and not hasattr(sys.modules["__main__"], "__file__")
            ):
                raise ValueError(
                    f"--{name} {spec.partition(':')[2]} is defined in a notebook or an interactive session, which "
                    "spawned ranks cannot import; move it into a .py file beside the notebook and import it "
                    "from there (or use --workers 1)"
                )
        if self.strategy == "single" and self.workers != 1:
            raise ValueError("strategy 'single' runs one worker; use --strategy ddp for --workers > 1")
        if self.nodes > 1:
            if self.node_rank is None or self.rdzv is None:
                raise ValueError(
                    f"--nodes {self.nodes} needs --node-rank (0 .. {self.nodes - 1}, this machine's index) and "
                    "--rdzv HOST:PORT (node 0's address) on every node"
                )
            if self.node_rank >= self.nodes:
                raise ValueError(
                    f"--node-rank {self.node_rank} is out of range for --nodes {self.nodes}; number the nodes "
                    f"0 .. {self.nodes - 1}"
                )
            if self.workers % self.nodes:
                raise ValueError(
                    f"--workers {self.workers} (the ranks of all nodes) does not split evenly over --nodes "
                    f"{self.nodes}; use a multiple of {self.nodes}, e.g. --workers {self.nodes}"
                )
        elif self.node_rank or self.rdzv is not None:
            given = "--rdzv" if self.rdzv is not None else f"--node-rank {self.node_rank}"
            raise ValueError(
                f"{given} is for runs across machines; add --nodes N (and the other nodes' commands), or drop it"
            )
        if self.warmup_epochs >= self.epochs and self.warmup_epochs > 0:
            raise ValueError(f"--warmup-epochs ({self.warmup_epochs}) must be shorter than --epochs ({self.epochs})")
        if self.checkpoint_activations_every > 1 and not self.checkpoint_activations:
            raise ValueError(
                f"--checkpoint-activations-every {self.checkpoint_activations_every} chooses which blocks "
                "--checkpoint-activations recomputes; add --checkpoint-activations"
            )
        self._check_measurements()
        self._check_synchronisation()
        return self

    def _check_synchronisation(self) -> None:
        """--sync-every, --grad-compression and --reduce change DDP's averaging; --ps-ranks and
        --max-staleness lay out async-ps. Each applies where it means something, one at a time."""
        name, defaults = self.strategy_name, type(self).model_fields
        given = [
            f
            for f in (
                "sync_every",
                "sync_warmup",
                "grad_compression",
                "reduce",
                "powersgd_rank",
                "powersgd_start",
                "ps_ranks",
                "max_staleness",
            )
            if getattr(self, f) != defaults[f].default
        ]
        if self.reduce == "ps" and name in ("zero1", "fsdp"):
            raise ValueError(
                f"--reduce ps sends whole gradients to rank 0, and --strategy {name} shards them; use --strategy "
                "ddp --reduce ps"
            )
        ps_only = [f for f in given if f in ("ps_ranks", "max_staleness")]
        if name == "async-ps":
            if self.workers < 2:
                raise ValueError(
                    f"--strategy async-ps needs at least 2 ranks (--ps-ranks servers and at least one worker); "
                    f"use --workers {self.ps_ranks + 1} or more"
                )
            if self.ps_ranks >= self.workers:
                raise ValueError(
                    f"--ps-ranks {self.ps_ranks} leaves none of --workers {self.workers} to train; use --ps-ranks "
                    f"{self.workers - 1} or fewer (or more --workers)"
                )
            if self.checkpoint_every:
                raise ValueError(
                    "--checkpoint-every: async-ps keeps the optimizer state on its servers, which checkpoints do not "
                    "hold; drop --checkpoint-every"
                )
            wrong = [f for f in given if f not in ps_only]
            if wrong:
                raise ValueError(
                    f"{flag(wrong[0])} changes DDP's averaging and async-ps does not average; use --strategy ddp"
                )
            return
        if ps_only:
            raise ValueError(
                f"{flag(ps_only[0])} lays out a parameter server; it applies to --strategy async-ps, not {name}"
            )
        if given and name != "ddp":
            raise ValueError(
                f"{flag(given[0])} changes DDP's gradient averaging; it applies to --strategy ddp, not {name}"
            )
        if self.sync_warmup and self.sync_every == 1:
            raise ValueError(
                f"--sync-warmup {self.sync_warmup} is the synchronous start of local SGD; add --sync-every H (H > 1)"
            )
        if self.sync_every > 1 and (self.grad_compression != "none" or self.reduce != "allreduce"):
            other = "--grad-compression" if self.grad_compression != "none" else "--reduce ps"
            raise ValueError(
                f"--sync-every {self.sync_every} averages parameters, not gradients, after its warm-up; {other} "
                "would only touch the warm-up: choose one of them"
            )
        if self.grad_compression == "powersgd" and self.reduce == "ps":
            raise ValueError(
                "--grad-compression powersgd all-reduces its low-rank factors and has no reduce-to-one form; "
                "drop --reduce ps (or use --grad-compression fp16)"
            )
        if self.grad_compression != "powersgd" and {"powersgd_rank", "powersgd_start"} & set(given):
            raise ValueError(
                f"{flag(next(f for f in given if f.startswith('powersgd')))} applies to --grad-compression powersgd"
            )

    def _check_measurements(self) -> None:
        """The range-test schedule and the gradient-noise recording need the runs they can measure."""
        if (self.schedule == "range-test") != (self.lr_end is not None):
            raise ValueError(
                "--schedule range-test and --lr-end go together: the range test sweeps the LR from --lr to --lr-end"
            )
        if self.lr_end is not None and self.lr_end <= self.lr:
            raise ValueError(
                f"--lr-end {self.lr_end:g} must be above --lr {self.lr:g}: the range test raises the LR from one to "
                "the other"
            )
        if self.lr_end is not None and self.warmup_epochs > 0:
            raise ValueError("--schedule range-test sets every step's LR itself; drop --warmup-epochs")
        if not self.grad_noise:
            return
        if self.strategy_name not in ("single", "ddp", "zero1"):
            raise ValueError(
                f"--grad-noise measures through DDP's gradient averaging or gradient accumulation; use --strategy "
                f"ddp, zero1 or single, not {self.strategy_name}"
            )
        if self.sync_every > 1 or self.grad_compression == "powersgd":
            given = "--sync-every" if self.sync_every > 1 else "--grad-compression powersgd"
            raise ValueError(
                f"--grad-noise compares each rank's gradient with the exact average, which {given} replaces "
                "(local steps, or a low-rank approximation); drop one of them"
            )
        if self.workers == 1 and self.grad_accum < 2:
            raise ValueError(
                "--grad-noise on one worker compares a micro-batch with the whole step: add --grad-accum 2 or more "
                "(or use --workers 2)"
            )
        if self.precision == "fp16":
            raise ValueError(
                "--grad-noise reads gradients that fp16's loss scaling multiplies by a changing factor; use "
                "--precision bf16 or 32"
            )

    @model_validator(mode="after")
    def _mesh_layout(self) -> TrainConfig:
        """--tp T: alone, every rank splits each layer (T = --workers, one replica); with --strategy fsdp,
        FSDP shards over --workers / T tensor-parallel groups, in --dp-replicate R replicas (HSDP)."""
        if self.dp_replicate > 1:
            if self.strategy_name != "fsdp":
                raise ValueError(
                    f"--dp-replicate {self.dp_replicate} replicates a sharded model; it applies to --strategy fsdp "
                    f"(this run uses {self.strategy_name})"
                )
            if self.workers % (self.dp_replicate * self.tp):
                ranks = f"--dp-replicate {self.dp_replicate} x --tp {self.tp}" if self.tp > 1 else "--dp-replicate"
                raise ValueError(
                    f"{ranks} ({self.dp_replicate * self.tp}) does not divide --workers {self.workers}; each replica "
                    "shards over an equal number of ranks: make --workers a multiple of it"
                )
        if self.tp == 1:
            if self.strategy == "tp":
                raise ValueError("--strategy tp is set by --tp N (N ranks split each layer); give --tp instead")
            for given in ("tp_plan", "sequence_parallel"):
                if getattr(self, given):
                    raise ValueError(f"{flag(given)} goes with tensor parallelism; give --tp N too (N > 1)")
            return self
        if self.strategy not in (None, "tp", "fsdp"):
            raise ValueError(
                f"--tp {self.tp} does not combine with --strategy {self.strategy} (its wrapper does not take "
                "tensor-parallel parameters); data parallelism over tensor-parallel groups is --strategy fsdp"
            )
        if self.strategy == "fsdp" and self.workers % self.tp:
            raise ValueError(
                f"--tp {self.tp} does not divide --workers {self.workers}: FSDP shards over groups of {self.tp} "
                "ranks; make --workers a multiple of --tp"
            )
        if self.strategy != "fsdp" and self.tp != self.workers:
            raise ValueError(
                f"--tp {self.tp} needs --workers {self.tp}: every rank of the run splits each layer; make them "
                "equal, or add --strategy fsdp to shard over several tensor-parallel groups"
            )
        for given, wrong, why in (
            ("precision", "fp16", "its loss scaler reads gradients that are split across ranks; use --precision bf16"),
            ("compile", True, "drop --compile"),
        ):
            if getattr(self, given) == wrong:
                raise ValueError(f"{flag(given)} {str(wrong).lower()} is not supported with --tp ({why})")
        return self

    @model_validator(mode="after")
    def _pipeline_layout(self) -> TrainConfig:
        """The stages x replicas layout of pipeline, model-parallel and hybrid fits the ranks and the batch."""
        name = self.strategy_name
        if name not in STAGED_STRATEGIES:
            for given in ("stages", "dp"):
                if getattr(self, given) is not None:
                    raise ValueError(
                        f"--{given} lays out pipeline stages; it applies to --strategy pipeline, model-parallel "
                        f"or hybrid, not {name}"
                    )
            return self
        if self.dp is not None and name != "hybrid":
            raise ValueError(
                f"--dp replicates a pipeline; use --strategy hybrid --dp {self.dp} (--strategy {name} runs one "
                "pipeline)"
            )
        if name == "hybrid" and self.dp is None and self.stages is None:
            raise ValueError(
                f"--strategy hybrid needs its layout: --dp D (replicas) and/or --stages K with D x K = --workers "
                f"({self.workers}), e.g. --dp 2 --stages {max(2, self.workers // 2)}"
            )
        stages = self.pipeline_stages
        replicas = (self.dp or self.workers // stages) if name == "hybrid" else 1
        if replicas * stages != self.workers:
            layout = (
                f"--dp {replicas} x --stages {stages}"
                if name == "hybrid"
                else f"--stages {stages} (one rank per stage)"
            )
            raise ValueError(
                f"{layout} needs {max(1, replicas) * stages} workers and --workers is {self.workers}; make them match"
            )
        if stages < 2:
            raise ValueError(
                f"--strategy {name} splits the model into at least 2 stages (got --stages {stages}); "
                "with one stage use --strategy single or ddp"
            )
        if name == "model-parallel":
            for given, value in (("microbatches", 1), ("pipeline_schedule", "gpipe")):
                # Compared with the default, not with the fields given: the ranks get every field.
                if getattr(self, given) not in (value, type(self).model_fields[given].default):
                    raise ValueError(
                        f"--strategy model-parallel runs the whole batch as one micro-batch (GPipe); "
                        f"for {flag(given)} use --strategy pipeline"
                    )
        elif self.batch_size % self.microbatches:
            raise ValueError(
                f"--microbatches {self.microbatches} does not divide --batch-size {self.batch_size}; "
                f"the micro-batches must be equal: choose a batch that is a multiple of {self.microbatches}"
            )
        elif self.pipeline_schedule == "1f1b" and self.microbatches < stages:
            raise ValueError(
                f"--pipeline-schedule 1f1b needs at least one micro-batch per stage: --microbatches "
                f"{self.microbatches} < --stages {stages}; raise --microbatches or use gpipe"
            )
        elif self.pipeline_schedule == "interleaved" and self.microbatches % max(1, self.microbatches // stages):
            raise ValueError(
                f"--pipeline-schedule interleaved runs --microbatches in rounds of --stages ({stages}); "
                f"--microbatches {self.microbatches} does not fill them evenly: use a multiple of {stages}"
            )
        if self.grad_accum > 1:
            raise ValueError(
                f"--strategy {name} accumulates gradients over its micro-batches within a step; instead of "
                "--grad-accum raise --batch-size and --microbatches together"
            )
        for given, wrong, fix in (("compile", True, "drop --compile"), ("precision", "fp16", "use --precision bf16")):
            if getattr(self, given) == wrong:
                why = (
                    "compiles a whole model, and a stage is a part of one"
                    if given == "compile"
                    else "needs one loss scaler whose skipped steps every stage agrees on"
                )
                raise ValueError(
                    f"{flag(given)} {str(wrong).lower()} is not supported with --strategy {name} ({why}); {fix}"
                )
        return self

    # Derived values: computed here once so config.json, the ranks and the analysis agree.
    @property
    def workers_per_node(self) -> int:
        return self.workers // self.nodes

    @property
    def checkpoint_every_steps(self) -> int:
        """Optimizer steps between checkpoints (0: checkpoints are per epoch, or none)."""
        return int(self.checkpoint_every[:-5]) if isinstance(self.checkpoint_every, str) else 0

    @property
    def checkpoint_every_epochs(self) -> int:
        return self.checkpoint_every if isinstance(self.checkpoint_every, int) else 0

    @property
    def strategy_name(self) -> str:
        return self.strategy or ("tp" if self.tp > 1 else "ddp" if self.workers > 1 else "single")

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
        if self.strategy_name == "async-ps":
            return 1  # every update applies one worker's batch: the LR is scaled for that batch
        return max(1, self.workers // (self.pipeline_stages * self.tp))

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
        payload = self.model_dump(
            mode="json", exclude={*RUN_CONTROL_FIELDS, "device", *self.reshardable_fields()}, exclude_defaults=True
        )
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

    def resumes_at_another_layout(self, saved: dict[str, Any], identity: str) -> bool:
        """Whether a sharded checkpoint (torch.distributed.checkpoint, resharded on load) of the run whose
        config.json is `saved` and whose identity is `identity` continues as this run: the same run laid out
        otherwise (another strategy that shards, --tp, --dp-replicate, number of ranks), with the same global
        batch and the same batch its LR is scaled from."""
        if self.strategy_name not in SHARDED_CHECKPOINTS:
            return False
        fields = type(self).model_fields
        layout = {k: saved.get(k, fields[k].default) for k in LAYOUT_FIELDS}
        try:
            as_saved = type(self).model_validate(self.model_dump() | layout)
        except ValidationError:
            return False
        return (
            as_saved.strategy_name in SHARDED_CHECKPOINTS
            and as_saved.identity() == identity
            and (as_saved.global_batch_size, as_saved.reference_batch_size)
            == (self.global_batch_size, self.reference_batch_size)
        )

    @property
    def memory_limit_bytes(self) -> int | None:
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
    if path.is_dir():
        raise UsageError(f"config file {path} is a directory; pass a .yaml, .toml or .json file")
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
        # Every missing required option in one message, so a user fixes them in one go.
        missing = [flag(".".join(str(part) for part in e["loc"])) for e in exc.errors() if e["type"] == "missing"]
        if missing:
            raise UsageError(
                f"missing required option{'s' if len(missing) > 1 else ''} {', '.join(missing)}; see --help"
            ) from None
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
PLAN_STRATEGIES = ("ddp", "zero1", "fsdp", "pipeline", "hybrid")


class PlanConfig(BaseModel):
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
    num_classes: int = Field(10, gt=1, description="classes of the model's output (image models)")
    device: str = Field(description="accelerator: p100, v100, a100, h100, l4, t4, or cpu (this machine, measured)")
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
        default_factory=lambda: list(PLAN_STRATEGIES),
        description="strategies to plan, comma-separated (default: all of ddp,zero1,fsdp,pipeline,hybrid)",
    )
    tp: int = Field(
        1,
        gt=0,
        description="also plan tensor parallelism of this degree, measured with the model's own plan (gpt has one): "
        "a 'tp' row on T devices, 'fsdp+tp' rows sharding over N/T groups",
    )
    tp_plan: str | None = TrainConfig.model_fields["tp_plan"]
    sequence_parallel: bool = TrainConfig.model_fields["sequence_parallel"]
    checkpoint_activations: bool = TrainConfig.model_fields["checkpoint_activations"]
    checkpoint_activations_every: int = TrainConfig.model_fields["checkpoint_activations_every"]
    search: bool = Field(
        False,
        description="also search, on the largest device count, every strategy with tensor parallelism of each degree "
        "within a node and activation checkpointing none, every 2nd block or every block: the fastest layout that "
        "fits, the runner-up and why",
    )
    optimizer: Optimizer = Field(
        "adam", description="the optimizer whose state is counted: sgd (momentum), adam, adamw, lars, lamb"
    )
    microbatches: int = Field(4, gt=0, description="pipeline and hybrid: micro-batches per step (at least the stages)")
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
        None, gt=0, description="bandwidth between nodes, Gb/s per direction (default: the --interconnect's)"
    )
    calibrate: list[Path] = Field(
        default_factory=list,
        description="run directories measured here whose compute efficiency, overhead and synchronisation the plan "
        "uses",
        json_schema_extra=cli(nargs="+", metavar="RUN_DIR"),
    )
    out: Path | None = Field(None, description="also write plan.json, the plots and report.html into this directory")
    cache_dir: Path | None = TrainConfig.model_fields["cache_dir"]

    @field_validator("gpus", "strategy", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return comma_separated(value)

    @model_validator(mode="after")
    def _consistent(self) -> PlanConfig:
        if (self.workload is None) == (self.model is None):
            raise ValueError("give the model to plan: --workload NAME or --model NAME_OR_FACTORY (one of them)")
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
        for given in ("tp_plan", "sequence_parallel"):
            if getattr(self, given) and self.tp == 1 and not self.search:
                raise ValueError(f"{flag(given)} goes with tensor parallelism; give --tp N (N > 1) or --search too")
        unknown = [s for s in self.strategy if s not in PLAN_STRATEGIES]
        if unknown or not self.strategy:
            raise ValueError(
                f"unknown strategy {unknown[0] if unknown else '(none)'!r}; choose from {','.join(PLAN_STRATEGIES)}"
            )
        return self


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
    allow_oversubscribe: bool = Field(False, description="allow more threads than cores (slow; for testing only)")
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
