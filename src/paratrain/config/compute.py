"""How each rank computes: precision, activation checkpointing, compile, augmentation, data loading."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator, model_validator

from paratrain.config.flags import comma_separated

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

Precision = Literal["32", "bf16", "fp16"]
ActivationCheckpointing = Literal["none", "selective", "full"]
# torchtitan's selective checkpointing by default recomputes every second block (selective_ac_option "2").
SELECTIVE_EVERY = 2


class CheckpointingFlags(BaseModel):
    """Activation checkpointing in paratrain's flags or torchtitan's modes, read as one (train's and plan's)."""

    if TYPE_CHECKING:  # the fields, declared by ComputeOptions (and reused by PlanConfig)
        checkpoint_activations: bool
        checkpoint_activations_every: int
        checkpoint_activations_ops: bool

    @model_validator(mode="before")
    @classmethod
    def _activation_checkpointing(cls, values: Any) -> Any:
        return checkpointing_flags(values)

    @property
    def checkpointing(self) -> ActivationCheckpointing:
        """none, selective or full, whichever spelling was given."""
        return checkpointing_mode(
            self.checkpoint_activations, self.checkpoint_activations_every, self.checkpoint_activations_ops
        )


class ComputeOptions(CheckpointingFlags):
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
    activation_checkpointing: ActivationCheckpointing | None = Field(
        None,
        description="torchtitan's modes: none; full (every block recomputed in backward, as --checkpoint-activations); "
        "selective (every second block, or what --checkpoint-activations-every and "
        "--checkpoint-activations-ops choose) (default: what --checkpoint-activations says)",
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


def checkpointing_mode(on: bool, every: int, ops: bool) -> ActivationCheckpointing:
    """torchtitan's name for what --checkpoint-activations and its two choices recompute."""
    return ("selective" if every > 1 or ops else "full") if on else "none"


def checkpointing_flags(values: Any) -> Any:
    """--activation-checkpointing (torchtitan's spelling) says what --checkpoint-activations with its two
    choices (paratrain's) says: the mode given becomes those flags before the fields are validated, so that
    the engine and the plan read one spelling (checkpointing_mode names the mode back)."""
    if not isinstance(values, dict) or values.get("activation_checkpointing") is None:
        return values
    try:
        on = TypeAdapter(bool).validate_python(values.get("checkpoint_activations", False))
        every = TypeAdapter(int).validate_python(values.get("checkpoint_activations_every", 1))
        ops = TypeAdapter(bool).validate_python(values.get("checkpoint_activations_ops", False))
    except ValidationError:
        return values  # the fields' own validation names the bad value
    chosen = every > 1 or ops
    mode = values["activation_checkpointing"]
    if mode == "none" and (on or chosen):
        given = "--checkpoint-activations" if on else "--checkpoint-activations-every/--checkpoint-activations-ops"
        raise ValueError(f"--activation-checkpointing none contradicts {given}; give one of them")
    if mode == "full" and chosen:
        raise ValueError(
            "--activation-checkpointing full recomputes every block whole; --checkpoint-activations-every and "
            "--checkpoint-activations-ops choose a selective mode: give --activation-checkpointing selective"
        )
    if mode in ("full", "selective"):
        values = {**values, "checkpoint_activations": True}
        if mode == "selective" and not chosen:
            values["checkpoint_activations_every"] = SELECTIVE_EVERY
    return values


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
