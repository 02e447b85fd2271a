"""How each rank computes: precision, activation checkpointing, compile, augmentation, data loading."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, field_validator

from paratrain.config.flags import comma_separated

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

Precision = Literal["32", "bf16", "fp16"]


class ComputeOptions(BaseModel):
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
    checkpoint_activations_ops: bool = Field(
        False,
        description="with --checkpoint-activations: inside each recomputed block keep the outputs of attention and "
        "of all but every second matrix product, and recompute only the rest (torchtitan's selective op "
        "checkpointing: more memory than whole blocks, less recompute)",
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

    @field_validator("augment", mode="before")
    @classmethod
    def _split_augment(cls, value: Any) -> Any:
        return comma_separated(value)

    @field_validator("augment")
    @classmethod
    def _known_augmentations(cls, value: list[str]) -> list[str]:
        known = ("flip", "crop", "jitter")
        for name in value:
            if name not in known:
                raise ValueError(f"unknown augmentation {name!r}; choose from {','.join(known)}")
        return value


def check(config: TrainConfig) -> None:
    """--checkpoint-activations-every and --checkpoint-activations-ops choose among the blocks and the ops
    --checkpoint-activations recomputes."""
    if config.checkpoint_activations_every > 1 and not config.checkpoint_activations:
        raise ValueError(
            f"--checkpoint-activations-every {config.checkpoint_activations_every} chooses which blocks "
            "--checkpoint-activations recomputes; add --checkpoint-activations"
        )
    if config.checkpoint_activations_ops and not config.checkpoint_activations:
        raise ValueError(
            "--checkpoint-activations-ops chooses what --checkpoint-activations recomputes inside a block; add "
            "--checkpoint-activations"
        )
