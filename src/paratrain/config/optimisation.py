"""The batch, the learning rate and its schedule, the optimizer, and the measurement runs that choose them
(find-batch, noise-scale, lr-find)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

LRScaling = Literal["none", "linear", "sqrt"]
Schedule = Literal["constant", "step", "exp", "inverse-time", "poly", "cosine", "range-test"]
Optimizer = Literal["sgd", "adam", "adamw", "lars", "lamb"]
BatchSchedule = Literal["fixed", "warmup", "adaptive"]
# Strategies whose global batch can grow by accumulating more micro-steps per optimizer step (a pipeline
# accumulates over its micro-batches within a step; async-ps applies each worker's batch on its own).
GROWABLE = ("single", "ddp", "zero1", "fsdp")


class OptimisationOptions(BaseModel):
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
        0.0, ge=0, description="ramp the LR linearly from --lr up to the scaled LR over these epochs (up only)"
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
    batch_schedule: BatchSchedule = Field(
        "fixed",
        description="the global batch over the run: fixed; warmup (doubled at even intervals over "
        "--batch-ramp-epochs up to --max-global-batch); adaptive (doubled when that raises the goodput: the throughput "
        "measured in the run times the statistical efficiency from its gradient noise scale, Pollux and McCandlish "
        "et al. 2018); it grows by the per-rank batch up to "
        "--max-batch-size, then by gradient accumulation, and the LR follows the global batch by --lr-scaling",
    )
    max_global_batch: int | None = Field(
        None,
        gt=0,
        description="--batch-schedule warmup or adaptive: the largest global batch (default: 8 x the starting one)",
    )
    max_batch_size: int | None = Field(
        None,
        gt=0,
        description="--batch-schedule warmup or adaptive: the largest per-rank batch the schedule may grow to before "
        "it accumulates (the batch that fits: find-batch's largest, or its knee for speed; default: --batch-size, "
        "growth by accumulation only)",
    )
    batch_ramp_epochs: float = Field(
        1.0, gt=0, description="--batch-schedule warmup: epochs over which the global batch grows to its largest"
    )
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


def check_batch_schedule(config: TrainConfig) -> None:
    """A growing batch needs a strategy that accumulates, room to grow, and (adaptive) the noise it reads."""
    if config.batch_schedule == "fixed":
        # Compared with the defaults, not with the fields given: the ranks get every field.
        for given in ("max_global_batch", "max_batch_size", "batch_ramp_epochs"):
            if getattr(config, given) != type(config).model_fields[given].default:
                raise ValueError(f"--{given.replace('_', '-')} applies to --batch-schedule warmup or adaptive")
        return
    chosen = f"--batch-schedule {config.batch_schedule}"
    if config.strategy_name not in GROWABLE:
        why = (
            "its updates apply one worker's batch each"
            if config.strategy_name == "async-ps"
            else "a pipeline accumulates over its micro-batches"
        )
        raise ValueError(
            f"{chosen} grows the batch by accumulating micro-steps, which --strategy {config.strategy_name} does "
            f"not do ({why}); use ddp, zero1, fsdp or one worker"
        )
    if config.max_global_batch is not None and config.max_global_batch < 2 * config.global_batch_size:
        raise ValueError(
            f"--max-global-batch {config.max_global_batch} leaves no room to grow from the starting global batch "
            f"{config.global_batch_size} (the batch doubles): give at least {2 * config.global_batch_size}"
        )
    if config.max_batch_size is not None and config.max_batch_size < 2 * config.batch_size:
        raise ValueError(
            f"--max-batch-size {config.max_batch_size} leaves the per-rank batch no room to grow from --batch-size "
            f"{config.batch_size} (it doubles): give at least {2 * config.batch_size}, or leave it out to grow by "
            "accumulation only"
        )
    if config.schedule == "range-test":
        raise ValueError(f"{chosen} changes the batch the range test's LR is meant for; use --batch-schedule fixed")
    if config.batch_schedule == "adaptive":
        _check_noise_measurement(config, chosen)


def check(config: TrainConfig) -> None:
    """The warm-up ends before the run does."""
    if config.warmup_epochs >= config.epochs and config.warmup_epochs > 0:
        raise ValueError(f"--warmup-epochs ({config.warmup_epochs}) must be shorter than --epochs ({config.epochs})")


def check_measurements(config: TrainConfig) -> None:
    """The range-test schedule and the gradient-noise recording need the runs they can measure."""
    if (config.schedule == "range-test") != (config.lr_end is not None):
        raise ValueError(
            "--schedule range-test and --lr-end go together: the range test sweeps the LR from --lr to --lr-end"
        )
    if config.lr_end is not None and config.lr_end <= config.lr:
        raise ValueError(
            f"--lr-end {config.lr_end:g} must be above --lr {config.lr:g}: the range test raises the LR from one to "
            "the other"
        )
    if config.lr_end is not None and config.warmup_epochs > 0:
        raise ValueError("--schedule range-test sets every step's LR itself; drop --warmup-epochs")
    if config.grad_noise:
        _check_noise_measurement(config, "--grad-noise")


def _check_noise_measurement(config: TrainConfig, asked: str) -> None:
    """What the in-run gradient noise measurement needs, for --grad-noise and the adaptive batch that reads it."""
    if config.strategy_name not in ("single", "ddp", "zero1", "fsdp"):
        raise ValueError(
            f"{asked} measures the gradient noise through DDP's gradient averaging, FSDP's reduce-scatter or "
            f"gradient accumulation; use --strategy ddp, zero1, fsdp or single, not {config.strategy_name}"
        )
    if config.strategy_name == "fsdp":
        # Where FSDP hands over no rank's whole local gradient (engine/grad_noise.py reads it at the reduce-scatter).
        if config.workers == 1:
            raise ValueError(
                f"{asked} with fsdp reads each rank's gradient as FSDP reduce-scatters it, and one worker has no "
                "reduce-scatter; use --strategy single with --grad-accum 2 or more, or --workers 2"
            )
        if config.tp > 1:
            raise ValueError(
                f"{asked} with fsdp needs each rank's whole gradient, which --tp {config.tp} splits across ranks; "
                "drop --tp"
            )
        if config.dp_replicate == config.workers:
            raise ValueError(
                f"{asked}: with --dp-replicate {config.dp_replicate} on {config.workers} workers no rank shards "
                "with another and FSDP reduce-scatters nothing to measure; use --strategy ddp"
            )
    if config.sync_every > 1 or config.grad_compression == "powersgd":
        given = "--sync-every" if config.sync_every > 1 else "--grad-compression powersgd"
        raise ValueError(
            f"{asked} compares each rank's gradient with the exact average, which {given} replaces "
            "(local steps, or a low-rank approximation); drop one of them"
        )
    if config.workers == 1 and config.grad_accum < 2:
        raise ValueError(
            f"{asked} on one worker compares a micro-batch with the whole step: add --grad-accum 2 or more "
            "(or use --workers 2)"
        )
    if config.precision == "fp16":
        raise ValueError(
            f"{asked} reads gradients that fp16's loss scaling multiplies by a changing factor; use "
            "--precision bf16 or 32"
        )
