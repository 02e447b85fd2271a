"""Sharded data parallelism (--strategy fsdp, FSDP2; zero1 shards only the optimizer state) and its
replicas (--dp-replicate: HSDP)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from paratrain.config.flags import flag

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig


class ShardedOptions(BaseModel):
    dp_replicate: int = Field(
        1,
        gt=0,
        description="fsdp: replicas of the sharded model (HSDP): FSDP shards over --workers / (R x --tp) ranks, and "
        "the R replicas all-reduce their gradients; in a layout (--dp-shard, --pp): the replicas of whatever the "
        "other dimensions lay out",
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


def check(config: TrainConfig) -> None:
    """FSDP's own flags go with --strategy fsdp, which takes no fp16 loss scaler; --dp-replicate R replicates a
    sharded model: fsdp only, in equal replicas. (--cpu-offload on CPU ranks is refused where the device is
    known: engine/strategies/__init__.py's check_fsdp.)"""
    given = config.model_fields_set
    fsdp_only = [name for name in ("shard_unit", "cpu_offload") if name in given and getattr(config, name)]
    if "reshard_after_forward" in given and not config.reshard_after_forward:
        fsdp_only.append("reshard_after_forward")
    if fsdp_only and config.strategy_name != "fsdp":
        raise ValueError(f"{flag(fsdp_only[0])} applies to --strategy fsdp (this run uses {config.strategy_name})")
    if config.strategy_name == "fsdp" and config.precision == "fp16":
        raise ValueError(
            "--precision fp16 with --strategy fsdp is not supported (it would need a sharded loss scaler); "
            "use --precision bf16"
        )
    if config.dp_replicate > 1:
        if config.strategy_name != "fsdp":
            raise ValueError(
                f"--dp-replicate {config.dp_replicate} replicates a sharded model; it applies to --strategy fsdp "
                f"(this run uses {config.strategy_name})"
            )
        if config.workers % (config.dp_replicate * config.tp):
            ranks = f"--dp-replicate {config.dp_replicate} x --tp {config.tp}" if config.tp > 1 else "--dp-replicate"
            raise ValueError(
                f"{ranks} ({config.dp_replicate * config.tp}) does not divide --workers {config.workers}; each replica "
                "shards over an equal number of ranks: make --workers a multiple of it"
            )
