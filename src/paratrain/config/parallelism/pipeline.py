"""Pipeline parallelism: pipeline, model-parallel (one micro-batch) and hybrid (replicated pipelines), on
torch.distributed.pipelining's schedules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from paratrain.config.flags import flag
from paratrain.config.parallelism.layout import STAGED_STRATEGIES

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]


class PipelineOptions(BaseModel):
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


def check(config: TrainConfig) -> None:
    """The stages x replicas layout of pipeline, model-parallel and hybrid fits the ranks and the batch."""
    name = config.strategy_name
    if name not in STAGED_STRATEGIES:
        for given in ("stages", "dp"):
            if getattr(config, given) is not None:
                raise ValueError(
                    f"--{given} lays out pipeline stages; it applies to --strategy pipeline, model-parallel "
                    f"or hybrid, not {name}"
                )
        return
    if config.dp is not None and name != "hybrid":
        raise ValueError(
            f"--dp replicates a pipeline; use --strategy hybrid --dp {config.dp} (--strategy {name} runs one pipeline)"
        )
    if name == "hybrid" and config.dp is None and config.stages is None:
        raise ValueError(
            f"--strategy hybrid needs its layout: --dp D (replicas) and/or --stages K with D x K = --workers "
            f"({config.workers}), e.g. --dp 2 --stages {max(2, config.workers // 2)}"
        )
    stages = config.pipeline_stages
    replicas = (config.dp or config.workers // (stages * config.tp)) if name == "hybrid" else 1
    if replicas * stages * config.tp != config.workers:
        layout = (
            f"--dp {replicas} x --stages {stages}" if name == "hybrid" else f"--stages {stages} (one rank per stage)"
        )
        split = f" x --tp {config.tp}" if config.tp > 1 else ""
        raise ValueError(
            f"{layout}{split} needs {max(1, replicas) * stages * config.tp} workers and --workers is "
            f"{config.workers}; make them match"
        )
    if stages < 2:
        raise ValueError(
            f"--strategy {name} splits the model into at least 2 stages (got --stages {stages}); "
            "with one stage use --strategy single or ddp"
        )
    if config.dp_shard is not None and (config.dp_shard < 2 or replicas % config.dp_shard):
        raise ValueError(
            f"--dp-shard {config.dp_shard} shards each stage over that many of the pipeline's {replicas} replicas: "
            f"give a divisor of {replicas} from 2 up (or leave it out to replicate the stages whole)"
        )
    if name == "model-parallel":
        for given, value in (("microbatches", 1), ("pipeline_schedule", "gpipe")):
            # Compared with the default, not with the fields given: the ranks get every field.
            if getattr(config, given) not in (value, type(config).model_fields[given].default):
                raise ValueError(
                    f"--strategy model-parallel runs the whole batch as one micro-batch (GPipe); "
                    f"for {flag(given)} use --strategy pipeline"
                )
    elif config.batch_size % config.microbatches:
        raise ValueError(
            f"--microbatches {config.microbatches} does not divide --batch-size {config.batch_size}; "
            f"the micro-batches must be equal: choose a batch that is a multiple of {config.microbatches}"
        )
    elif config.pipeline_schedule == "1f1b" and config.microbatches < stages:
        raise ValueError(
            f"--pipeline-schedule 1f1b needs at least one micro-batch per stage: --microbatches "
            f"{config.microbatches} < --stages {stages}; raise --microbatches or use gpipe"
        )
    elif config.pipeline_schedule == "interleaved" and config.microbatches % max(1, config.microbatches // stages):
        raise ValueError(
            f"--pipeline-schedule interleaved runs --microbatches in rounds of --stages ({stages}); "
            f"--microbatches {config.microbatches} does not fill them evenly: use a multiple of {stages}"
        )
    if config.grad_accum > 1:
        raise ValueError(
            f"--strategy {name} accumulates gradients over its micro-batches within a step; instead of "
            "--grad-accum raise --batch-size and --microbatches together"
        )
    for given, wrong, fix in (("compile", True, "drop --compile"), ("precision", "fp16", "use --precision bf16")):
        if getattr(config, given) == wrong:
            why = (
                "compiles a whole model, and a stage is a part of one"
                if given == "compile"
                else "needs one loss scaler whose skipped steps every stage agrees on"
            )
            raise ValueError(
                f"{flag(given)} {str(wrong).lower()} is not supported with --strategy {name} ({why}); {fix}"
            )
