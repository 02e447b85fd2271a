"""Tensor parallelism (--tp): ranks that split each layer's matmuls (torch.distributed.tensor.parallel).
Applied by engine/strategies/tensor.py; its planner cost is plan/step_time.py's and plan/memory.py's tp terms."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from paratrain.config.flags import flag

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig


class TensorParallelOptions(BaseModel):
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
    loss_parallel: bool = Field(
        False,
        description="--tp: also split the output layer by vocabulary and compute the cross-entropy on the split "
        "logits (torch's loss_parallel): each rank holds 1/T of the logits, and in the loss's backward four of its "
        "pieces against three whole logits unsplit (the model's plan has a loss-parallel form; gpt's does)",
    )


def check(config: TrainConfig) -> None:
    """--tp alone: every rank splits each layer (--tp = --workers, one replica); with --strategy fsdp, FSDP
    shards over --workers / --tp tensor-parallel groups; with --pp, each stage's layers are split (pipeline,
    or hybrid with sharded stages). --tp-plan and --sequence-parallel need --tp."""
    if config.tp == 1:
        if config.strategy == "tp":
            raise ValueError("--strategy tp is set by --tp N (N ranks split each layer); give --tp instead")
        for given in ("tp_plan", "sequence_parallel", "loss_parallel"):
            if getattr(config, given):
                raise ValueError(f"{flag(given)} goes with tensor parallelism; give --tp N too (N > 1)")
        return
    staged = config.strategy in ("pipeline", "hybrid")
    if config.strategy not in (None, "tp", "fsdp") and not staged:
        raise ValueError(
            f"--tp {config.tp} does not combine with --strategy {config.strategy} (its wrapper does not take "
            "tensor-parallel parameters); data parallelism over tensor-parallel groups is --strategy fsdp"
        )
    if config.strategy == "fsdp" and config.workers % config.tp:
        raise ValueError(
            f"--tp {config.tp} does not divide --workers {config.workers}: FSDP shards over groups of {config.tp} "
            "ranks; make --workers a multiple of --tp"
        )
    if config.strategy not in ("fsdp", "pipeline", "hybrid") and config.tp != config.workers:
        raise ValueError(
            f"--tp {config.tp} needs --workers {config.tp}: every rank of the run splits each layer; make them "
            "equal, or add --strategy fsdp to shard over several tensor-parallel groups"
        )
    if config.loss_parallel and config.loss is not None:
        raise ValueError(
            f"--loss-parallel computes the built-in cross-entropy on logits split by vocabulary, not --loss "
            f"{config.loss}; drop one of them"
        )
    for given, wrong, why in (
        ("precision", "fp16", "its loss scaler reads gradients that are split across ranks; use --precision bf16"),
        ("compile", True, "drop --compile"),
    ):
        if getattr(config, given) == wrong:
            raise ValueError(f"{flag(given)} {str(wrong).lower()} is not supported with --tp ({why})")
