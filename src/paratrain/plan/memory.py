"""Memory per device for each strategy, in the terms of summary.json's `memory` block.

What a rank holds, as paratrain's strategies hold it (docs/strategies.md):
- parameters and gradients: float32, whatever `--precision` (autocast computes in 16 bits and keeps
  the weights and their gradients in 32; DDP's gradients live in its buckets, one copy);
- optimizer state per parameter byte: SGD with momentum and LARS keep one buffer (1x), Adam, AdamW
  and LAMB two moments (2x) and a 4-byte step counter per tensor;
- `ddp`: everything whole on every rank; `zero1`: the optimizer state split N ways
  (ZeroRedundancyOptimizer); `fsdp`: parameters, gradients and optimizer state split N ways, plus
  the gathered parameters of the units in flight (two units when resharding after forward:
  the one running and the one prefetched; the whole model when not), in bf16 with --precision bf16;
- `pipeline`/`hybrid`: a stage's layers and their state; the stages are cut where the pipeline's
  `--split auto` would cut them when the blocks' times follow their FLOPs (balanced_starts over
  the units' FLOPs), so the heaviest stage is the one reported;
- `pp+fsdp` (`--pp K --dp-shard S`): hybrid's stages, each stage's state split S ways, plus the whole
  stage gathered with its gradients, as torch's PipelineStage holds it by the last backward, in bf16
  with --precision bf16;
- HSDP (`--dp-replicate R --dp-shard S`, and with --tp or --pp): fsdp's split over the S ranks of a
  shard group, whatever the R replicas of it;
- activations: the saved tensors of the rank's share of the batch (profile.py measures bytes per
  sample); a pipeline stage holds its units' share of the model's (each unit's saved bytes measured
  apart, profile.py), the last stage also the loss's, for each micro-batch in flight: min(M, K − i)
  for stage i of 1F1B, all M for GPipe. With
  16-bit precisions the model's saved activations are taken as half (autocast saves most in 16 bits;
  the fp32 ones it keeps inside the model, norms and softmax, make this an underestimate), the
  loss's as measured (autocast computes it in float32);
- transient: what the loss's backward holds beyond what it saved, at its peak (torch's MemTracker on
  the loss alone, profile.py): for a language model three [tokens x vocabulary] float32 tensors a
  sample, on a pipeline's last stage only, for one micro-batch;
- `tp` (tensor parallelism, `--tp T`): what one rank holds as measured with the model split T ways
  by its own plan (profile.py): its pieces of the split layers and the rest whole, the activations
  it saves for the group's batch; `fsdp+tp` splits that model state over the data-parallel ranks;
  `pp+tp` and `pp+fsdp+tp` (`--pp K --tp T [--dp-shard S]`): the pipeline's stages, each unit's
  parameters as a rank of the split unit holds them (measured unit by unit), the split model's
  activations by the stage's share of the whole model's saved bytes;
- `runtime_bytes`: what the process holds before any model (a CPU rank's interpreter, ~300 MiB).
A device fits when the total is at most USABLE_FRACTION of its memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paratrain.plan.profile import ModelProfile

OPTIMIZER_STATES = {"sgd": 1, "lars": 1, "adam": 2, "adamw": 2, "lamb": 2}
STEP_COUNTER_BYTES = {"sgd": 0, "lars": 0, "adam": 4, "adamw": 4, "lamb": 4}
# Room left for the CUDA context, the allocator's fragmentation and library workspaces: an
# assumption (10 %), not a measurement.
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Layout:
    """How N devices are used by one strategy."""

    strategy: str
    devices: int
    data_parallel: int  # replicas that each take a different share of the batch
    stages: int  # pipeline stages per replica (1 for whole-model strategies)
    microbatches: int  # per step, per replica (1 for whole-model strategies)
    replica_batch: int  # samples per replica per step
    schedule: str = "1f1b"
    reshard_after_forward: bool = True
    tp: int = 1  # devices of a tensor-parallel group: devices = data_parallel x stages x tp
    # the data-parallel ranks FSDP splits the state over, where the layout names it: fewer than data_parallel
    # for HSDP (shards of `shard` ranks replicated data_parallel / shard times); pp+fsdp names all of them
    shard: int | None = None

    @property
    def shards(self) -> int:
        """Ranks each parameter is split over: `shard` where named, else every data-parallel rank for fsdp and
        fsdp+tp, and 1 (nothing split) for the other strategies."""
        if self.shard is not None:
            return self.shard
        return self.data_parallel if self.strategy in ("fsdp", "fsdp+tp") else 1

    @property
    def name(self) -> str:
        """The strategy as a plan's row names it: fsdp whose shards are replicated is hsdp; fsdp+tp whose shards
        are of one rank is ddp+tp (Megatron's data parallelism over tensor-parallel groups)."""
        if self.strategy in ("fsdp+tp", "pp+fsdp+tp") and self.shards == 1 < self.data_parallel:
            return {"fsdp+tp": "ddp+tp", "pp+fsdp+tp": "hybrid+tp"}[self.strategy]
        return "hsdp" if self.strategy == "fsdp" and self.shards < self.data_parallel else self.strategy

    def mesh(self) -> dict[str, int]:
        """The layout as torchtitan's mesh, as a run's summary.json names it (`layout`)."""
        return {
            "dp_replicate": self.data_parallel // self.shards,
            "dp_shard": self.shards,
            "tp": self.tp,
            "pp": self.stages,
        }


def sixteen_bit_activations(per_sample: float, loss: float, scale: float) -> float:
    """Activation bytes a sample under the precision: the model's saved tensors scaled (halved in 16 bits),
    the loss's kept (autocast computes the loss in float32: a language model's log-softmax over its whole
    vocabulary is the largest of them)."""
    return (per_sample - loss) * scale + loss


def transient_bytes(profile: ModelProfile, samples: float, layout: Layout) -> float:
    """What backward holds beyond the saved tensors at its peak, for `samples` samples at once (profile.py's
    MemTracker reading): taken whole in 16 bits too, as the loss's (autocast computes the loss and the first
    of its gradients in float32; the rest of them, in 16 bits, are overestimated 2x). With tensor parallelism,
    the split model's reading: split by vocabulary (--loss-parallel), a rank holds its piece of the loss's
    [tokens x vocabulary] tensors."""
    measured = profile.tensor_parallel if layout.tp > 1 else profile
    return measured.transient_bytes_fixed + measured.transient_bytes_per_sample * samples


def gathered_scale(precision: str) -> float:
    """FSDP's gathered parameters per float32 byte: with --precision bf16 it gathers them in bf16
    (MixedPrecisionPolicy(param_dtype=bf16), as engine/strategies/fsdp.py and torchtitan apply it)."""
    return 0.5 if precision == "bf16" else 1.0


def optimizer_bytes(param_bytes: float, tensors: float, optimizer: str, momentum: float = 0.9) -> float:
    states = OPTIMIZER_STATES[optimizer]
    if optimizer == "sgd" and momentum == 0:
        states = 0
    return states * param_bytes + STEP_COUNTER_BYTES[optimizer] * tensors


def unit_param_bytes(profile: ModelProfile, layout: Layout) -> list[float]:
    """What a rank of a stage holds of each pipeline unit's parameters: the unit whole, or with the stages split
    (--pp with --tp), its piece as measured (profile.py's profile_tensor_parallel)."""
    split = profile.tensor_parallel if layout.tp > 1 else None
    if split is None:
        return [float(u["param_bytes"]) for u in profile.units]
    assert split.degree == layout.tp and len(split.unit_param_bytes) == len(profile.units), "measured as planned"
    return list(split.unit_param_bytes)


def stage_bounds(profile: ModelProfile, stages: int) -> list[tuple[int, int]]:
    """The [start, end) unit ranges of each stage, balanced by FLOPs as `--split auto` balances time."""
    from paratrain.engine.strategies.pipeline_split import balanced_starts

    costs = [max(float(u["flops_per_sample"]), 1.0) for u in profile.units]
    starts = balanced_starts(costs, stages)
    return list(zip(starts, [*starts[1:], len(costs)]))


def memory_per_device(
    profile: ModelProfile,
    layout: Layout,
    optimizer: str,
    precision: str,
    runtime_bytes: float = 0.0,
    momentum: float = 0.9,
) -> dict[str, Any]:
    """The largest rank's figures, in bytes: parameters, gradients, optimizer, activations, gathered
    (FSDP's parameters in flight), buffers, runtime and their total."""
    n = layout.data_parallel
    act_scale = 0.5 if precision in ("bf16", "fp16") else 1.0
    per_sample = sixteen_bit_activations(
        profile.activation_bytes_per_sample, profile.loss_activation_bytes_per_sample, act_scale
    )
    fixed = profile.activation_bytes_fixed * act_scale
    if layout.stages > 1:
        figures, buffers = _largest_stage(profile, layout, optimizer, precision, momentum)
    elif layout.tp > 1:
        figures = _tensor_parallel(profile, layout, optimizer, act_scale, momentum, gathered_scale(precision))
        buffers = float(profile.buffer_bytes)
    else:
        figures = _whole_model(profile, layout, optimizer, per_sample, fixed, momentum)
        if layout.strategy == "zero1":
            figures = _zero1(figures, n)
        elif layout.strategy == "fsdp":
            in_flight = 2 * profile.largest_unit_bytes if layout.reshard_after_forward else profile.param_bytes
            figures = _sharded(figures, layout.shards, in_flight * gathered_scale(precision))
        buffers = float(profile.buffer_bytes)
    if layout.stages == 1:  # a pipeline's: its last stage's, for one micro-batch (_largest_stage)
        figures["transient_bytes"] = transient_bytes(profile, layout.replica_batch, layout)
    figures["buffers_bytes"] = buffers
    figures["runtime_bytes"] = runtime_bytes
    figures["total_bytes"] = sum(figures.values())
    return figures


def _whole_model(
    profile: ModelProfile, layout: Layout, optimizer: str, per_sample: float, fixed: float, momentum: float
) -> dict[str, float]:
    """A rank that holds the whole model (ddp's; zero1 and fsdp then split its state): its parameters,
    gradients and optimizer state, and the activations of its share of the batch."""
    params, trained = float(profile.param_bytes), profile.trainable_share
    return {
        "parameters_bytes": params,
        "gradients_bytes": params * trained,
        "optimizer_bytes": optimizer_bytes(params * trained, profile.param_tensors * trained, optimizer, momentum),
        "activations_bytes": fixed + per_sample * layout.replica_batch,
        "gathered_bytes": 0.0,
    }


def _zero1(figures: dict[str, float], ranks: int) -> dict[str, float]:
    """ZeRO stage 1 (ZeroRedundancyOptimizer): the optimizer state split over the ranks."""
    return figures | {"optimizer_bytes": figures["optimizer_bytes"] / ranks}


def _sharded(figures: dict[str, float], ranks: int, in_flight: float) -> dict[str, float]:
    """FSDP over `ranks`: the parameters, gradients and optimizer state split over them, plus the parameters
    gathered in flight (`in_flight` bytes: the units running and prefetched); over one rank, nothing is split."""
    if ranks == 1:
        return figures
    split = {key: figures[key] / ranks for key in ("parameters_bytes", "gradients_bytes", "optimizer_bytes")}
    return figures | split | {"gathered_bytes": in_flight}


def _tensor_parallel(
    profile: ModelProfile, layout: Layout, optimizer: str, act_scale: float, momentum: float, gather_scale: float
) -> dict[str, float]:
    """A rank of a tensor-parallel group as measured (profile.py profile_tensor_parallel): its pieces of the
    split layers and the rest whole, the activations it saves for the group's batch; with fsdp over the
    groups, its model state split over the data-parallel ranks too, plus the units in flight."""
    split = profile.tensor_parallel
    assert split is not None and split.degree == layout.tp, "the plan measures the degree it plans"
    trained = profile.trainable_share
    figures = {
        "parameters_bytes": float(split.param_bytes),
        "gradients_bytes": split.param_bytes * trained,
        "optimizer_bytes": optimizer_bytes(
            split.param_bytes * trained, split.param_tensors * trained, optimizer, momentum
        ),
        "activations_bytes": act_scale * split.activation_bytes_fixed
        + sixteen_bit_activations(split.activation_bytes_per_sample, split.loss_activation_bytes_per_sample, act_scale)
        * layout.replica_batch,
        "gathered_bytes": 0.0,
    }
    if layout.strategy != "fsdp+tp":
        return figures
    # the largest unit's split share, twice (running and prefetched), as fsdp's; kept from forward to backward, all
    gathered = 2 * profile.largest_unit_bytes if layout.reshard_after_forward else profile.param_bytes
    in_flight = gathered * split.param_bytes / profile.param_bytes * gather_scale
    return _sharded(figures, layout.shards, in_flight)


def _largest_stage(
    profile: ModelProfile, layout: Layout, optimizer: str, precision: str, momentum: float
) -> tuple[dict[str, float], float]:
    """The heaviest stage's figures (the first of equals) and its share of the buffers."""
    stages = stage_memory(profile, layout, optimizer, precision, momentum)
    return max(stages, key=lambda stage: sum(stage.values())), float(profile.buffer_bytes) / layout.stages


def stage_memory(
    profile: ModelProfile, layout: Layout, optimizer: str, precision: str, momentum: float = 0.9
) -> list[dict[str, float]]:
    """Each pipeline stage's figures for a rank of it, in bytes, first stage first (memory_per_device reports the
    heaviest). A stage holds what its units save of the model's saved tensors (measured unit by unit: profile.py)
    for each micro-batch in flight, and the last stage also what the loss saves; with --tp, the split model's
    activations by the stage's share of the whole model's saved bytes."""
    act_scale = 0.5 if precision in ("bf16", "fp16") else 1.0
    split = profile.tensor_parallel if layout.tp > 1 else None
    measured = split or profile  # the activations a rank of the (split) stage saves
    loss_per_sample = measured.loss_activation_bytes_per_sample
    per_sample = (
        sixteen_bit_activations(measured.activation_bytes_per_sample, loss_per_sample, act_scale) - loss_per_sample
    )
    fixed = measured.activation_bytes_fixed * act_scale
    gather_scale = gathered_scale(precision)
    saved = [float(u["saved_bytes_per_sample"]) for u in profile.units]
    shared = [float(u["input_saved_bytes_per_sample"]) for u in profile.units]  # with the unit before

    def saved_by(start: int, end: int) -> float:
        """What units [start, end) save together: a tensor two neighbours save (one's output, the other's
        input) once within a stage, and in each of two stages that they are cut between."""
        return sum(saved[start:end]) - sum(shared[start + 1 : end])

    whole_model = saved_by(0, len(saved)) or 1.0
    micro = layout.replica_batch / layout.microbatches
    held = unit_param_bytes(profile, layout)
    stages = []
    for index, (start, end) in enumerate(stage_bounds(profile, layout.stages)):
        units = profile.units[start:end]
        whole = float(sum(u["param_bytes"] for u in units))
        params = float(sum(held[start:end]))
        share = saved_by(start, end) / whole_model
        last = index == layout.stages - 1
        in_flight = (
            layout.microbatches if layout.schedule == "gpipe" else min(layout.microbatches, layout.stages - index)
        )
        tensors = profile.param_tensors * whole / max(profile.param_bytes, 1)  # split tensors are still tensors
        trained = profile.trainable_share
        stage = {
            "parameters_bytes": params,
            "gradients_bytes": params * trained,
            "optimizer_bytes": optimizer_bytes(params * trained, tensors * trained, optimizer, momentum),
            "activations_bytes": share * fixed + (share * per_sample + last * loss_per_sample) * micro * in_flight,
            "gathered_bytes": 0.0,
            # the loss runs on the last stage, one micro-batch's backward at a time
            "transient_bytes": transient_bytes(profile, micro, layout) if last else 0.0,
        }
        if layout.shards > 1:  # pp+fsdp: the stage sharded over its replicas
            # torch's PipelineStage keeps each unit gathered from its first backward to the step's end, beside its
            # whole gradient, and reduce-scatters once (stage.py: backward_maybe_with_nosync, perform_reduce_grad):
            # by the last backward the whole stage is gathered, whatever the micro-batches
            stage = _sharded(stage, layout.shards, params * (1 + trained) * gather_scale)
        stages.append(stage)
    return stages
