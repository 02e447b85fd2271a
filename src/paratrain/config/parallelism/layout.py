"""The run's ranks as a layout: how many, which strategy, and the same as torchtitan's mesh (replicas x
shards x tensor-parallel x pipeline stages). The strategies are presets of the mesh; `_layout_flags` turns
the mesh flags into them, so a run has one configuration whichever spelling it was given."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, model_validator

from paratrain.config.flags import flag

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

# Strategies that split the model's layers into stages, one per rank of a pipeline.
STAGED_STRATEGIES = ("pipeline", "model-parallel", "hybrid")
# Strategies whose checkpoints go through torch.distributed.checkpoint, which reshards them on load; and
# the fields that lay a run out on its ranks, which a resume of such a checkpoint may change.
SHARDED_CHECKPOINTS = ("fsdp", "tp")
LAYOUT_FIELDS = ("strategy", "workers", "tp", "dp_replicate", "batch_size", "base_batch_size")
# A pipeline's checkpoint.pt holds the whole model, keyed by its names (engine/strategies/pipeline.py): any
# layout of pipeline stages takes it; and the fields that lay a pipeline out.
STAGED_LAYOUT_FIELDS = (*LAYOUT_FIELDS, "stages", "dp", "dp_shard", "microbatches", "pipeline_schedule", "split")
# Strategy names that are presets of another strategy's flags, turned into them before validation.
STRATEGY_PRESETS = {"hsdp": "fsdp"}


class LayoutOptions(BaseModel):
    """--workers and --strategy, or the mesh: --dp-shard and --pp (with --dp-replicate and --tp)."""

    # How to parallelise.
    workers: int = Field(1, gt=0, description="number of ranks (one per GPU, or per group of CPU cores)")
    strategy: str | None = Field(
        None,
        description="parallel strategy: single, ddp, zero1, fsdp, hsdp (fsdp with --dp-replicate R; R defaults to "
        "--nodes, a replica a node), pipeline, model-parallel, hybrid or async-ps (default: ddp for workers > 1)",
    )
    dp_shard: int | None = Field(
        None,
        gt=0,
        description="the ranks as a mesh, torchtitan's way (--dp-replicate R x --dp-shard S x --tp T x --pp P = "
        "--workers; the strategies are presets of it): S ranks FSDP shards each replica over (--dp-shard N is "
        "--strategy fsdp; with --pp P, --strategy hybrid whose stages FSDP shards over S of its --dp replicas)",
    )
    pp: int | None = Field(
        None,
        gt=0,
        description="the mesh's pipeline stages (--pp P is --strategy pipeline --stages P; with --dp-replicate R, "
        "--strategy hybrid --dp R)",
    )

    @model_validator(mode="before")
    @classmethod
    def _layout_flags(cls, values: Any) -> Any:
        """--dp-shard and --pp (with --dp-replicate and --tp), or --dp-replicate alone without a strategy
        (torchtitan's DDP): the layout as a mesh, another spelling of the strategies, turned into theirs before
        the fields are validated, so that a run has one configuration whichever spelling it was given."""
        if not isinstance(values, dict):
            return values
        if values.get("strategy") == "hsdp":
            return _hsdp(values)
        replicas_alone = values.get("strategy") is None and values.get("dp_replicate") not in (None, 1)
        if values.get("dp_shard") is None and values.get("pp") is None and not replicas_alone:
            return values
        if values.get("strategy") == "hybrid" and values.get("pp") is None:
            return values  # hybrid's own spelling: --dp-shard S shards each stage over S of its --dp replicas
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
        values |= {"workers": workers, "tp": t}
        if p > 1:
            values |= {"strategy": "pipeline" if r * s == 1 else "hybrid", "stages": p}
            if r * s > 1:
                values["dp"] = r * s
            if s > 1:  # FSDP within each stage, over S of the pipeline's replicas (engine/strategies/hybrid.py)
                values["dp_shard"] = s
        elif s > 1 or (r > 1 and t > 1):
            # Megatron's layout too, replicas of tensor-parallel groups (--dp-replicate R --tp T): FSDP2 over a
            # (R, 1) mesh, whose shards of one rank are whole replicas that all-reduce their gradients, as DDP's
            # (DDP itself cannot hold the split layers: engine/strategies/fsdp.py)
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
        replicas, shards = self.workers // (stages * self.tp), self.dp_shard or 1
        return {"dp_replicate": replicas // shards, "dp_shard": shards, "tp": self.tp, "pp": stages}

    @property
    def strategy_name(self) -> str:
        return self.strategy or ("tp" if self.tp > 1 else "ddp" if self.workers > 1 else "single")

    @property
    def pipeline_stages(self) -> int:
        """Stages one copy of the model is cut into (1 unless the strategy cuts it)."""
        if self.strategy_name not in STAGED_STRATEGIES:
            return 1
        if self.stages is not None:
            return self.stages
        return self.workers // (self.dp * self.tp) if self.dp else self.workers // self.tp

    @property
    def data_parallel_size(self) -> int:
        """Replicas that each take a different share of the batch."""
        if self.strategy_name == "async-ps":
            return 1  # every update applies one worker's batch: the LR is scaled for that batch
        return max(1, self.workers // (self.pipeline_stages * self.tp))


def _hsdp(values: dict[str, Any]) -> dict[str, Any]:
    """--strategy hsdp, a preset of the mesh: fsdp whose shards are replicated --dp-replicate R times; without R,
    a replica a node, its ranks sharding within it (FSDP's HYBRID_SHARD), so the gathers stay inside a node."""
    replicas = values.get("dp_replicate")
    if replicas is None or int(replicas) == 1:
        nodes = int(values.get("nodes") or 1)
        if nodes == 1:
            raise ValueError(
                "--strategy hsdp replicates FSDP's shards: give --dp-replicate R (R >= 2, dividing --workers), or "
                "run on --nodes N > 1 (a replica a node); on one node without R it would be --strategy fsdp"
            )
        replicas = nodes
    return {**values, "strategy": STRATEGY_PRESETS["hsdp"], "dp_replicate": replicas}


def check(config: TrainConfig) -> None:
    """A strategy that fits the number of ranks."""
    if config.strategy == "single" and config.workers != 1:
        raise ValueError("strategy 'single' runs one worker; use --strategy ddp for --workers > 1")
