"""`paratrain train`'s config: the sections (what to train, parallelism, optimisation, compute, the run's
records) composed into one model, whose checks run in a fixed order and whose fingerprint decides a resume.

Composed, not nested: each section is a model of its own in its own module (a parallelism's options and
checks in config/parallelism/<name>.py), and TrainConfig inherits them all, so flags, config files,
config.json and Python keywords keep one flat name per option (`--tp 2`, `tp: 2`, `TrainConfig(tp=2)`).
pydantic takes the fields of the bases last to first: the sections are listed in reverse of their order
in `paratrain train --help`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar

from pydantic import ConfigDict, ValidationError, model_validator

from paratrain.config import compute, optimisation, workload
from paratrain.config.compute import ComputeOptions
from paratrain.config.flags import CommandText
from paratrain.config.optimisation import OptimisationOptions
from paratrain.config.parallelism import (
    ParallelismOptions,
    layout,
    pipeline,
    placement,
    sharded,
    synchronisation,
    tensor,
)
from paratrain.config.parallelism.layout import (
    LAYOUT_FIELDS,
    SHARDED_CHECKPOINTS,
    STAGED_LAYOUT_FIELDS,
    STAGED_STRATEGIES,
)
from paratrain.config.run import RunOptions
from paratrain.config.workload import WorkloadOptions

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


class TrainConfig(RunOptions, ComputeOptions, OptimisationOptions, ParallelismOptions, WorkloadOptions):
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

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        # One order, so that a config with several faults is always told of the same one first.
        for check in (
            workload.check,
            layout.check,
            placement.check,
            optimisation.check,
            compute.check,
            optimisation.check_measurements,
            optimisation.check_batch_schedule,
            synchronisation.check,
            sharded.check,
            tensor.check,
            pipeline.check,
        ):
            check(self)
        return self

    @property
    def global_batch_size(self) -> int:
        return self.data_parallel_size * self.batch_size * self.grad_accum

    @property
    def measures_grad_noise(self) -> bool:
        """Whether the ranks measure the gradient noise: --grad-noise, or the adaptive batch that reads it."""
        return self.grad_noise or self.batch_schedule == "adaptive"

    @property
    def largest_global_batch(self) -> int:
        """Where --batch-schedule warmup or adaptive stops growing the global batch."""
        return self.max_global_batch or 8 * self.global_batch_size

    @property
    def largest_batch_size(self) -> int:
        """The largest per-rank batch --batch-schedule warmup or adaptive may grow to before accumulating."""
        return self.max_batch_size or self.batch_size

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
        # old behaviour does not orphan the checkpoints written before it existed. --activation-checkpointing
        # is another spelling of the --checkpoint-activations flags, which carry what it means.
        payload = self.model_dump(
            mode="json",
            exclude={*RUN_CONTROL_FIELDS, "device", "activation_checkpointing", *self.reshardable_fields()},
            exclude_defaults=True,
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
        """Whether a checkpoint that any layout of its kind loads, of the run whose config.json is `saved` and whose
        identity is `identity`, continues as this run: the same run laid out otherwise, with the same global batch
        and the same batch its LR is scaled from. Sharded checkpoints (torch.distributed.checkpoint, resharded on
        load): another strategy that shards, --tp, --dp-replicate, number of ranks. Pipelines' (the whole model):
        other stages, replicas, shards, --tp, micro-batches or schedule."""
        kinds = next((k for k in (SHARDED_CHECKPOINTS, STAGED_STRATEGIES) if self.strategy_name in k), None)
        if kinds is None:
            return False
        fields = type(self).model_fields
        laid_out = STAGED_LAYOUT_FIELDS if kinds is STAGED_STRATEGIES else LAYOUT_FIELDS
        layout = {k: saved.get(k, fields[k].default) for k in laid_out}
        try:
            as_saved = type(self).model_validate(self.model_dump() | layout)
        except ValidationError:
            return False
        return (
            as_saved.strategy_name in kinds
            and as_saved.identity() == identity
            and (as_saved.global_batch_size, as_saved.reference_batch_size)
            == (self.global_batch_size, self.reference_batch_size)
        )
