"""Step time: compute plus the communication that compute does not hide.

- Compute: FLOPs per sample x the rank's samples / (peak x achievable efficiency), plus, when
  calibrated from runs at two or more batch sizes, a fixed cost per step (dispatching operators,
  launching kernels: what makes small batches run further from the peak). Backward is taken as
  2/3 of it (twice the forward's FLOPs). Where the efficiency is the matrix products' alone (the
  published transformer figures, derived net of MPT's own), the memory-bound operators' bytes
  (norms, activations, residual adds, casts: profile.py) are added at the device's memory bandwidth,
  in proportion to the FLOPs wherever the work is divided (stages, splits, recompute).
- Optimizer: memory-bound: the bytes it reads and writes per parameter byte (SGD with momentum:
  parameter, gradient, buffer read, buffer and parameter written = 5; Adam-like: 7) over the
  device's memory bandwidth; sharded strategies step 1/N of the parameters.
- Collectives (alpha-beta; Patarasuk & Yuan 2009, nccl-tests PERFORMANCE.md, Calculon):
  ring all-reduce of S bytes on n ranks: base + 2(n−1)·latency + 2(n−1)/n · S / bandwidth;
  all-gather and reduce-scatter: base + (n−1)·latency + (n−1)/n · S / bandwidth (S the whole), each on
  its own link where the two are measured apart (gloo);
  across nodes, hierarchical: reduce-scatter inside each node, all-reduce of the node's 1/g share
  across nodes, all-gather inside the node (the inter-node link carries 1/g of the bytes).
- CPU ranks of one host: ddp's and zero1's gradient average over shared memory (paratrain's own path), every
  other layout's collectives over gloo on the loopback, each at its own line as `paratrain commbench` measured
  it on this machine (links.py); and at its collectives every rank waits for the last to arrive, a share of the
  compute before them that commbench measures too (the arrival lag; in a pipeline, the bubble instead; none where
  the efficiency was calibrated on runs of several ranks, which hold that wait).
- Overlap: where the device communicates beside compute (GPUs: NCCL runs on its own streams), each
  collective is priced against the compute that runs beside it, unit by unit (overlap.py): DDP's buckets
  as backward fills them, FSDP's gathers one unit ahead of its forward and backward and its
  reduce-scatters after each unit's backward, the first gather and the last reduce-scatters exposed.
  CPU ranks here average once the backward is done (engine/strategies/ddp.py), and every other
  collective blocks them, so nothing is hidden. With --precision bf16, FSDP gathers the parameters in
  bf16 and reduce-scatters the gradients in float32 (its policy).
- ZeRO-1 broadcasts the updated parameters after the step (an all-gather, exposed).
- HSDP (`--dp-replicate R --dp-shard S`): FSDP's collectives over the S ranks of a shard group, then
  the all-reduce of each rank's 1/S of the gradients across the R replicas (torch's HSDP), over the
  link between the replicas' nodes once a shard group fills a node.
- Tensor parallelism (`tp`, `fsdp+tp`): the FLOPs of the split modules over T devices, the rest on
  each; the all-reduces of activations the split model issues (counted with their sizes on the meta
  device, profile.py; in 16 bits under a 16-bit --precision) exposed: a layer waits for its sum;
  with sequence parallelism, all-gathers and reduce-scatters in their place;
- Pipelines: (M + K − 1) slots of one micro-batch on the slowest stage (the bubble (K−1)/(M+K−1)
  of GPipe and 1F1B), computed at the calibrated efficiency without the wait for other ranks that whole-step
  layouts fold into theirs (the bubble and the slowest stage are the pipeline's waits), plus the
  activations and their gradients sent between stages (exposed on CPU, only in the fill and drain
  where the device overlaps); `hybrid` adds the all-reduce of a
  stage's gradients across its replicas, after the last micro-batch; `pp+fsdp` instead gathers the
  stage's parameters for every micro-batch's backward and the first one's forward (FSDP reshards
  after forward; torch's PipelineStage keeps them gathered from a backward to the next forward), M + 1
  all-gathers, and reduce-scatters its gradients once, after the last micro-batch; on a device that
  overlaps, all of it but two units' gathers hides behind the stage's compute. Split stages (`pp+tp`,
  `pp+fsdp+tp`: --pp with --tp) run their split FLOPs 1/T each and wait in every slot for their share of
  the group's collectives (by the stage's split FLOPs), and gather and step only their pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from paratrain.plan.devices import Device
from paratrain.plan.links import GlooLinks, Link
from paratrain.plan.memory import Layout, gathered_scale, stage_bounds, unit_param_bytes
from paratrain.plan.overlap import ShardedUnit, ddp_comm_s, ddp_exposed_s, fsdp_exposed_s
from paratrain.plan.profile import ModelProfile, TensorParallelProfile

BACKWARD_SHARE = 2 / 3
OPTIMIZER_TRAFFIC = {"sgd": 5, "lars": 5, "adam": 7, "adamw": 7, "lamb": 7}
# the layouts whose collectives on CPU ranks go through paratrain's shared-memory average (engine/strategies/ddp.py)
SHARED_MEMORY_AVERAGED = ("single", "ddp", "zero1")


@dataclass(frozen=True)
class Topology:
    """Where the devices are: `per_node` devices share the intra-node link; nodes share the inter-node one."""

    per_node: int
    intra: Link
    inter: Link
    # CPU ranks: the links of torch.distributed's own collectives (gloo), where the gradient average of ddp and
    # zero1 takes another path (paratrain's shared memory: `intra`). None on GPUs: NCCL carries everything.
    gloo: GlooLinks | None = None
    # Within a node, the links of all-gathers and reduce-scatters where they differ from the all-reduce's `intra`
    # (gloo's are each measured apart: its all-gather and reduce-scatter are not halves of its all-reduce).
    intra_gather: Link | None = None
    intra_scatter: Link | None = None


def ring_allreduce_s(size: float, ranks: int, link: Link) -> float:
    if ranks <= 1 or size <= 0:
        return 0.0
    return link.base_latency + 2 * (ranks - 1) * link.latency + 2 * (ranks - 1) / ranks * size / link.bandwidth


def ring_allgather_s(size: float, ranks: int, link: Link) -> float:
    """All-gather (or reduce-scatter) of `size` bytes in all, each rank holding 1/ranks of them."""
    if ranks <= 1 or size <= 0:
        return 0.0
    return link.base_latency + (ranks - 1) * link.latency + (ranks - 1) / ranks * size / link.bandwidth


def allreduce_s(size: float, ranks: int, per_node: int, topo: Topology) -> float:
    """All-reduce over `ranks` laid out `per_node` to a node: a ring in one node, hierarchical across nodes."""
    if ranks <= per_node:
        return ring_allreduce_s(size, ranks, topo.intra)
    nodes = -(-ranks // per_node)
    return 2 * ring_allgather_s(size, per_node, topo.intra) + ring_allreduce_s(size / per_node, nodes, topo.inter)


def allgather_s(size: float, ranks: int, per_node: int, topo: Topology) -> float:
    intra = topo.intra_gather or topo.intra
    if ranks <= per_node:
        return ring_allgather_s(size, ranks, intra)
    nodes = -(-ranks // per_node)
    return ring_allgather_s(size, per_node, intra) + ring_allgather_s(size / per_node, nodes, topo.inter)


def reducescatter_s(size: float, ranks: int, per_node: int, topo: Topology) -> float:
    """Reduce-scatter of `size` bytes in all: the all-gather's ring run backwards, on the reduce-scatter's link."""
    return allgather_s(size, ranks, per_node, replace(topo, intra_gather=topo.intra_scatter))


@dataclass(frozen=True)
class LayoutCost:
    """A layout's own cost a step beyond the plan's model of it, fitted from its runs (calibrate.py): its
    machinery's per-step work that no FLOP, byte or link count gives (FSDP2's and DTensor's Python on every
    step), and per sample of a replica's batch (tensor-parallel matrices too narrow for the whole ones' share
    of the peak)."""

    layout: str  # as layout_key names it
    devices: int
    fixed_s: float
    per_sample_s: float


def layout_key(layout: Layout, split: TensorParallelProfile | None) -> str:
    """The layout as calibration tells layouts apart: a plan row's name; for split models their degree and
    which collectives the split issues (sequence parallelism's gathers, a vocabulary-split loss); for pipelines
    their stages and micro-batches (a pipeline's own cost is paid per micro-batch and stage: its sends and
    receives, its schedule's Python)."""
    kinds = []
    if layout.tp > 1 and split is not None:
        kinds.append(f"tp {layout.tp}")
        kinds += ["sequence parallel"] if split.gather_scatters else []
        kinds += ["loss parallel"] if split.loss_split > 1 else []
    if layout.stages > 1:
        kinds.append(f"{layout.stages} stages, {layout.microbatches} micro-batches")
    return f"{layout.name} ({', '.join(kinds)})" if kinds else layout.name


@dataclass(frozen=True)
class Efficiency:
    """What the compute reaches, and the per-step costs a model of FLOPs and bytes leaves out."""

    compute: float  # achievable share of the peak
    overhead_s: float = 0.0  # per step: data, bookkeeping, the optimizer's own (calibrated)
    source: str = ""
    # Calibrated per device count: CPU ranks of one host share its memory bandwidth, so two ranks each
    # compute slower than one alone, and wait for each other; N devices take the share measured at
    # the largest count <= N.
    by_devices: tuple[tuple[int, float], ...] = ()
    # Compute seconds a step costs whatever its batch (dispatching each operator, launching each
    # kernel), per device count; fitted only from runs at two or more batch sizes.
    fixed_by_devices: tuple[tuple[int, float], ...] = ()
    # The per-step overhead per device count: the optimizer's share of it is slower on two CPU ranks,
    # which share the host's memory bandwidth (a 2.6 M-parameter MLP's SGD step: 2.7 ms on one rank
    # alone, 3-4 ms on each of two).
    overhead_by_devices: tuple[tuple[int, float], ...] = ()
    # Calibrated per device count with the wait for the other ranks left out (the runs' compute alone):
    # (devices, share of the peak, fixed seconds a step). A pipeline's stages wait for each other in its bubble
    # and behind its slowest stage, both priced apart, so its slots take these (docs/planner.md: with the wait
    # in, pipelines of gpt-tiny and of an MLP were planned up to 23 % slow, without it up to 14 % fast).
    # Empty: the figures above.
    without_waiting_by_devices: tuple[tuple[int, float, float], ...] = ()
    # The share is the matrix products' alone, derived net of the memory-bound operators' time: those run
    # apart, at the device's memory bandwidth (the model's bytes, profile.py). A share measured on the whole
    # step of this model (calibrated) or carried over whole (a CNN's) holds their time already.
    memory_bound_apart: bool = False
    # Calibrated: each layout measured beyond the plain ones, its own cost per device count
    layout_costs: tuple[LayoutCost, ...] = ()

    def compute_for(self, devices: int) -> float:
        return _at_most(self.by_devices, devices, self.compute)

    def fixed_compute_s(self, devices: int) -> float:
        return _at_most(self.fixed_by_devices, devices, 0.0)

    def pipeline_compute(self, devices: int) -> tuple[float, float]:
        """(share of the peak, fixed seconds a step) of a pipeline's stages: without the wait for the other
        ranks where calibrated so, else as every layout's."""
        measured = [(share, fixed) for count, share, fixed in self.without_waiting_by_devices if count <= devices]
        return measured[-1] if measured else (self.compute_for(devices), self.fixed_compute_s(devices))

    def overhead_for(self, devices: int) -> float:
        return _at_most(self.overhead_by_devices, devices, self.overhead_s)

    def layout_cost_s(self, layout: str, devices: int, samples: float) -> float:
        """The layout's own cost a step at `samples` a replica, as measured on the largest count <= `devices`."""
        measured = [c for c in self.layout_costs if c.layout == layout and c.devices <= devices]
        if not measured:
            return 0.0
        cost = max(measured, key=lambda c: c.devices)
        return cost.fixed_s + cost.per_sample_s * samples


def _at_most(by_count: tuple[tuple[int, float], ...], devices: int, default: float) -> float:
    measured = [value for count, value in by_count if count <= devices]
    return measured[-1] if measured else default


def step_time(
    profile: ModelProfile,
    layout: Layout,
    device: Device,
    precision: str,
    optimizer: str,
    topo: Topology,
    eff: Efficiency,
) -> dict[str, Any]:
    """Seconds per optimizer step and where they go."""
    if topo.gloo is not None and layout.strategy not in SHARED_MEMORY_AVERAGED:
        gloo = topo.gloo
        topo = replace(topo, intra=gloo.all_reduce, intra_gather=gloo.all_gather, intra_scatter=gloo.reduce_scatter)
    share, fixed = (
        eff.pipeline_compute(layout.devices)
        if layout.stages > 1
        else (eff.compute_for(layout.devices), eff.fixed_compute_s(layout.devices))
    )
    speed = device.peak(precision) * share
    n = layout.data_parallel
    grads = profile.param_bytes * profile.trainable_share  # a frozen parameter has no gradient, no optimizer step
    traffic = OPTIMIZER_TRAFFIC[optimizer]
    if eff.memory_bound_apart:  # each FLOP of work brings its memory-bound operators' bytes
        speed = 1 / (1 / speed + profile.memory_bound_bytes_per_flop / device.memory_bandwidth)
        fixed += profile.memory_bound_bytes_fixed / device.memory_bandwidth
    if layout.stages > 1:
        compute, comm, exposed, optimizer_s = _pipeline(profile, layout, device, topo, speed, traffic, fixed, precision)
    elif layout.tp > 1:
        compute, comm, exposed, optimizer_s = _tensor_parallel(
            profile, layout, device, topo, speed, traffic, fixed, precision
        )
    else:
        compute = fixed + profile.work_per_sample * layout.replica_batch / speed
        backward = BACKWARD_SHARE * compute
        shard = n if layout.strategy == "zero1" else layout.shards
        optimizer_s = traffic * grads / shard / device.memory_bandwidth
        comm, exposed = _data_parallel_comm(profile, layout, device, topo, compute, backward, precision)
    waits_calibrated = any(1 < count <= layout.devices for count, _ in eff.by_devices)
    if topo.gloo is not None and layout.devices > 1 and layout.stages == 1 and not waits_calibrated:
        # CPU ranks: at each collective every rank but the last waits for it (a pipeline's waits are its bubble);
        # an efficiency calibrated on runs of several ranks holds that wait already
        lag = topo.gloo.arrival_lag * compute
        comm, exposed = comm + lag, exposed + lag
    overhead = eff.overhead_for(layout.devices)
    overhead += eff.layout_cost_s(layout_key(layout, profile.tensor_parallel), layout.devices, layout.replica_batch)
    total = compute + exposed + optimizer_s + overhead
    return {
        "step_time_s": total,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "optimizer_s": optimizer_s,
        "overhead_s": overhead,
    }


def _data_parallel_comm(
    profile: ModelProfile,
    layout: Layout,
    device: Device,
    topo: Topology,
    compute: float,
    backward: float,
    precision: str,
) -> tuple[float, float]:
    n, per_node = layout.data_parallel, topo.per_node
    size = float(profile.param_bytes)
    if n <= 1:
        return 0.0, 0.0
    if layout.strategy in ("ddp", "zero1"):
        size *= profile.trainable_share  # the gradients, and zero1's updated parameters: those that train

        def bucket_s(bytes_: float) -> float:
            return allreduce_s(bytes_, n, per_node, topo)

        if device.overlap:  # DDP's buckets, each all-reduced as backward fills it (overlap.py)
            comm, exposed = ddp_comm_s(size, bucket_s), ddp_exposed_s(size, bucket_s, backward)
        else:  # CPU ranks average the gradients in one call once backward is done (engine/strategies/ddp.py)
            comm = exposed = bucket_s(size)
        if layout.strategy == "zero1":
            broadcast = allgather_s(size, n, per_node, topo)
            comm, exposed = comm + broadcast, exposed + broadcast
        return comm, exposed
    # fsdp: each unit gathered before its forward (in bf16 under --precision bf16) and, with resharding, again
    # before its backward; its float32 gradients reduce-scattered after it (HSDP: then all-reduced across the
    # replicas), priced unit by unit against the compute beside them (overlap.py)
    root, units = _sharded_units(profile, layout, topo, 1, precision, compute, 1.0)
    return _sharded_comm(root, units, layout.reshard_after_forward, device.overlap)


def _sharded_units(
    profile: ModelProfile,
    layout: Layout,
    topo: Topology,
    stride: int,
    precision: str,
    compute: float,
    held: float,
) -> tuple[ShardedUnit, list[ShardedUnit]]:
    """FSDP's root and units (profile.fsdp_units; a model without units is its root alone), each with its
    collectives over the shard group, whose ranks the mesh puts `stride` apart (the dimensions inside it:
    tensor-parallel groups), its replicas a shard group apart, and with its share of the step's compute.
    `held`: the share of each unit a rank's group holds (fsdp+tp: its split share)."""
    shards = layout.shards
    replicas = layout.data_parallel // shards
    in_node, across = max(topo.per_node // stride, 1), max(topo.per_node // (stride * shards), 1)
    scale = gathered_scale(precision)

    def unit(param_bytes: float, work_share: float) -> ShardedUnit:
        size = param_bytes * held
        return ShardedUnit(
            gather_s=allgather_s(size * scale, shards, in_node, topo),
            scatter_s=reducescatter_s(size, shards, in_node, topo) + allreduce_s(size / shards, replicas, across, topo),
            forward_s=(1 - BACKWARD_SHARE) * compute * work_share,
            backward_s=BACKWARD_SHARE * compute * work_share,
        )

    (root_bytes, root_share), *rest = profile.fsdp_units or ((float(profile.param_bytes), 1.0),)
    return unit(root_bytes, root_share), [unit(size, share) for size, share in rest]


def _sharded_comm(
    root: ShardedUnit, units: list[ShardedUnit], reshard_after_forward: bool, overlap: bool
) -> tuple[float, float]:
    """(all, exposed) seconds of FSDP's collectives in a step: the root gathered once (FSDP2 keeps it from forward
    to backward), the units once more with resharding, every gradient reduce-scattered once; where the device
    does not communicate beside its compute (CPU ranks), all of it exposed."""
    gathers = 2 if reshard_after_forward else 1
    comm = root.gather_s + root.scatter_s + sum(gathers * u.gather_s + u.scatter_s for u in units)
    return comm, (fsdp_exposed_s(root, units, reshard_after_forward) if overlap else comm)


def _sharded_collectives_s(
    size: float, layout: Layout, stride: int, per_node: int, topo: Topology, gathers: int, precision: str
) -> float:
    """FSDP's collectives of `size` bytes of float32 state for one step: the gradients' reduce-scatter and
    `gathers` all-gathers of the parameters (in bf16 under --precision bf16) over the shard group, then, with
    HSDP, the all-reduce of each rank's shard of the gradients across its replicas (torch's HSDP). The mesh
    puts a shard group's ranks `stride` apart (the dimensions inside it: tensor-parallel groups, pipeline
    stages) and its replicas a shard group apart."""
    shards = layout.shards
    replicas = layout.data_parallel // shards
    in_node = max(per_node // stride, 1)
    scale = gathered_scale(precision)
    sharded = reducescatter_s(size, shards, in_node, topo) + gathers * allgather_s(size * scale, shards, in_node, topo)
    return sharded + allreduce_s(size / shards, replicas, max(per_node // (stride * shards), 1), topo)


def _pipeline(
    profile: ModelProfile,
    layout: Layout,
    device: Device,
    topo: Topology,
    speed: float,
    traffic: int,
    fixed: float,
    precision: str,
) -> tuple[float, float, float, float]:
    k, m, t = layout.stages, layout.microbatches, layout.tp
    micro = layout.replica_batch / m
    bounds = stage_bounds(profile, k)
    held = unit_param_bytes(profile, layout)
    stage_params = [sum(held[a:b]) for a, b in bounds]
    # A slot runs one stage (about 1/k of the model's operators) on one micro-batch; split stages run the
    # FLOPs inside their split layers 1/T each and wait for the group's collectives of the micro-batch.
    # With --checkpoint-activations the recompute is spread over the stages as their FLOPs are.
    split = profile.tensor_parallel if t > 1 else None
    split_flops = list(split.unit_split_flops_per_sample) if split else [0.0] * len(profile.units)
    stage_flops = [
        sum(u["flops_per_sample"] - s + s / t for u, s in zip(profile.units[a:b], split_flops[a:b])) for a, b in bounds
    ]
    slowest = max(range(k), key=lambda i: stage_flops[i])
    slot = fixed / k + stage_flops[slowest] * micro * profile.work_per_sample / max(profile.flops_per_sample, 1) / speed
    compute = (m + k - 1) * slot
    comm = exposed = 0.0
    if split is not None:  # the slowest stage's share of the split model's collectives, by its split FLOPs
        a, b = bounds[slowest]
        share = sum(split_flops[a:b]) / (sum(split_flops) or 1)
        comm = exposed = (m + k - 1) * _split_collectives_s(split, micro, share, topo, precision)
    # Bytes handed between neighbouring stages per micro-batch: the output of the last unit of each stage
    # (every rank of a split stage hands the whole output to its peer of the next, beside the others).
    handed = max([profile.units[b - 1]["output_bytes_per_sample"] for a, b in bounds[:-1]] or [0]) * micro
    link = topo.intra if k * t <= topo.per_node else topo.inter
    hop = link.base_latency + link.latency + handed / link.bandwidth
    sends = 2 * (k - 1) if device.overlap else 2 * (m + k - 1)
    comm, exposed = comm + sends * hop, exposed + sends * hop
    optimizer_s = traffic * max(stage_params) * profile.trainable_share / layout.shards / device.memory_bandwidth
    # replicas of a stage are k x T ranks apart (the mesh's order: replicas, shards, stages, tensor-parallel
    # groups innermost), so a node holds per_node / (k x T) of them
    per_node = max(topo.per_node // (k * t), 1)
    if layout.shards > 1:
        # the stage's gathers for every micro-batch's backward and the first forward, one reduce-scatter
        sharded = _sharded_collectives_s(float(max(stage_params)), layout, k * t, topo.per_node, topo, m + 1, precision)
        unit = max(held) * gathered_scale(precision)
        hidden = max(sharded - compute, 2 * allgather_s(unit, layout.shards, per_node, topo))
        comm, exposed = comm + sharded, exposed + (hidden if device.overlap else sharded)
    elif layout.data_parallel > 1:
        # the stage's gradients across its replicas, after the last micro-batch
        reduce = allreduce_s(max(stage_params) * profile.trainable_share, layout.data_parallel, per_node, topo)
        comm, exposed = comm + reduce, exposed + reduce
    return compute, comm, exposed, optimizer_s


def _tensor_parallel(
    profile: ModelProfile,
    layout: Layout,
    device: Device,
    topo: Topology,
    speed: float,
    traffic: int,
    fixed: float,
    precision: str,
) -> tuple[float, float, float, float]:
    """The split FLOPs divided over the group, the rest on every rank; the group's all-reduces of activations
    (as measured: count and bytes) exposed, since nothing else runs while a layer waits for its sum; with
    fsdp over the groups, fsdp's collectives over the data-parallel ranks on the rank's share."""
    split = profile.tensor_parallel
    assert split is not None
    t, n = layout.tp, layout.data_parallel
    share = split.split_flops_share
    compute = fixed + profile.work_per_sample * layout.replica_batch * (1 - share + share / t) / speed
    comm = exposed = _split_collectives_s(split, layout.replica_batch, 1.0, topo, precision)
    optimizer_s = traffic * split.param_bytes * profile.trainable_share / layout.shards / device.memory_bandwidth
    if layout.strategy == "fsdp+tp" and n > 1:
        # fsdp's gathers and reduce-scatters of the rank's split share of each unit, over ranks t apart
        root, units = _sharded_units(
            profile, layout, topo, t, precision, compute, split.param_bytes / profile.param_bytes
        )
        fsdp, hidden = _sharded_comm(root, units, layout.reshard_after_forward, device.overlap)
        comm, exposed = comm + fsdp, exposed + hidden
    return compute, comm, exposed, optimizer_s


def _split_collectives_s(
    split: TensorParallelProfile, samples: float, share: float, topo: Topology, precision: str
) -> float:
    """Seconds of `share` of the collectives a tensor-parallel group issues for `samples` samples: the all-reduces
    of activations (as measured: count and bytes), with sequence parallelism all-gathers and reduce-scatters in
    their place; all exposed, since nothing else runs while a layer waits for its sum."""
    t = split.degree
    per_node = min(topo.per_node, t)  # a group's ranks are consecutive: on one node while t <= per node
    # the activations summed are in 16 bits under autocast (measured on float32 meta tensors)
    sixteen = 0.5 if precision in ("bf16", "fp16") else 1.0
    each = sixteen * split.allreduce_bytes_per_sample * samples / max(split.allreduces, 1)
    seconds = split.allreduces * allreduce_s(each, t, per_node, topo)
    # sequence parallelism: an all-gather or reduce-scatter each, (n-1)/n of the whole tensor a ring pass; as many
    # of one as of the other (each region's gather into a column-parallel layer, its scatter out of a row-parallel)
    whole = sixteen * split.gather_scatter_bytes_per_sample * samples / max(split.gather_scatters, 1)
    pair = allgather_s(whole, t, per_node, topo) + reducescatter_s(whole, t, per_node, topo)
    seconds += split.gather_scatters * pair / 2
    return share * seconds


def bubble_fraction(stages: int, microbatches: int) -> float | None:
    return (stages - 1) / (microbatches + stages - 1) if stages > 1 else None
