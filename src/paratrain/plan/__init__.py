"""`paratrain plan`: will it fit, how fast, and how many devices before more stop paying.

The user's model is measured here on the meta device (profile.py), the device and its links come
from tables with sources (devices.py, links.py) or from this machine, and a model of memory
(memory.py) and step time (step_time.py) predicts every strategy on 1 ... N devices; measured runs
calibrate it (calibrate.py). The recommendation follows one rule: the model fits a device -> data
parallel; it does not -> shard, split the layers (--tp) or pipeline, whichever is fastest; none fits ->
hybrid. `--search` (search.py) also tries every layout with tensor parallelism and activation
checkpointing, and names the fastest that fits.
docs/planner.md explains the model, where it is known to be wrong, and how it compares with
measurements.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from paratrain.config import PlanConfig, TrainConfig
from paratrain.config.parallelism import TensorParallelOptions
from paratrain.errors import UsageError
from paratrain.formatting import rate, size
from paratrain.plan.devices import NODE_DEVICES, Device, get_device
from paratrain.plan.links import (
    DEFAULT_INTER_NODE,
    GLOO_COLLECTIVES,
    Link,
    commbench_link,
    custom_link,
    get_link,
    measured_gloo_links,
    shm_link,
)
from paratrain.plan.memory import USABLE_FRACTION, Layout, memory_per_device
from paratrain.plan.profile import ModelProfile, TensorParallelProfile, profile_model, profile_tensor_parallel
from paratrain.plan.regime import stops_paying
from paratrain.plan.search import CLOSE_CALL, Checkpointing, close_call, search
from paratrain.plan.step_time import Efficiency, Topology, bubble_fraction, layout_key, step_time
from paratrain.runs import RunDir
from paratrain.runs.records import Plan, Summary, checked

GPUS_PER_NODE = 8  # a DGX/HGX node: the default when --gpus-per-node is not given
CURVE_MAX_DEVICES = 4096  # the scaling plot's reach
PLAN_FILE = "plan.json"


def run_plan(cfg: PlanConfig) -> dict[str, Any]:
    """The plan as a JSON-ready dict: model, device, rows, recommendation, backend, curve."""
    from paratrain.plan import calibrate

    runs = calibrate.read_runs(cfg.calibrate) if cfg.calibrate else []
    device = get_device(cfg.device, cfg.precision, cfg.cache_dir)
    device.peak(cfg.precision)  # refuses a dtype the device lacks
    per_node = cfg.gpus_per_node or (_cores() if device.name == "cpu" else GPUS_PER_NODE)
    counts = [cfg.nodes * per_node] if cfg.nodes is not None else sorted(set(cfg.gpus))
    if cfg.global_batch is not None:
        for n in counts:
            # tensor-parallel groups share their samples: the batch is split over the groups
            replicas = n // cfg.tp if n % cfg.tp == 0 else n
            over = f"the {replicas} groups of --tp {cfg.tp} on {n} devices" if replicas < n else f"{n} devices"
            if cfg.mesh is not None:  # and a pipeline's stages: over the layout's replicas
                replicas = cfg.mesh[0] * cfg.mesh[1]
                over = f"the layout's {replicas} data-parallel replicas (--dp-replicate x --dp-shard)"
            if cfg.global_batch % replicas:
                raise UsageError(
                    f"--global-batch {cfg.global_batch} does not divide evenly over {over}; "
                    f"use a multiple of {replicas} (e.g. {cfg.global_batch // replicas * replicas or replicas})"
                )
    profile = profile_model(_train_config(cfg))
    if cfg.tp > 1:
        profile.tensor_parallel = profile_tensor_parallel(_train_config(cfg), _split(cfg, cfg.tp))
    topo = _topology(cfg, device, per_node, float(profile.param_bytes))
    momentum = TrainConfig.model_fields["momentum"].default
    eff = _published_efficiency(device, cfg.precision, profile.kind)
    if runs:
        # the tensor-parallel runs' splits, measured once each; the plan's own is measured already
        splits = {_split(cfg, cfg.tp).model_dump_json(): profile.tensor_parallel} if profile.tensor_parallel else {}
        # fitted without the ranks' arrival lag: an efficiency fitted on runs of several ranks holds their wait
        unlagged = replace(topo, gloo=replace(topo.gloo, arrival_lag=0.0)) if topo.gloo else topo
        eff = calibrate.fit(runs, lambda run, fitted: _run_timing(profile, run, device, cfg, unlagged, fitted, splits))

    stages, units = (cfg.mesh[3] if cfg.mesh else 1), len(profile.units)
    if stages > 1 and stages > units:
        raise UsageError(
            f"--pp {stages} is more pipeline stages than the model's {units} blocks; give at most --pp {units}"
            if units
            else f"--pp {stages}: the model cannot be cut into stages (its blocks applied in order do not give its "
            "output); drop --pp"
        )
    planner = _Planner(cfg, profile, device, topo, eff, momentum)
    top = max(counts)
    if not planner.layouts(top):
        raise UsageError(
            f"no layout of --strategy {','.join(cfg.strategy)} fits {top} devices: hybrid needs at least 4, a pipeline "
            f"at most one stage per block ({len(profile.units)} "
            f"here{'' if profile.units else ': its blocks applied in order do not give its output'}), hsdp more than "
            f"one node of {per_node}; add ddp, zero1 or fsdp, or change the device count"
        )
    wanted = sorted({1, *counts, *(2**i for i in range(1, top.bit_length()) if 2**i < top)})
    rows = [row for n in wanted for row in planner.rows(n)]
    curve_counts = sorted({*(2**i for i in range((max(top, CURVE_MAX_DEVICES)).bit_length())), *counts})
    curve = [planner.best(n) for n in curve_counts]
    flat = planner.stops_paying(curve_counts) if cfg.global_batch is not None else None
    recommendation = planner.recommend(top)
    if flat is not None and top > flat["devices"]:
        recommendation["reason"] += (
            f"; but at this batch more than {flat['devices']} devices do not pay: {flat['doubled']} run "
            f"{flat['gain']:.2f}x as fast as {flat['devices']} (below)"
        )
    found = _search(cfg, profile, device, topo, eff, momentum, top, per_node) if cfg.search else None
    return checked(
        Plan,
        {
            "model": _model_json(profile),
            "device": _device_json(device, cfg.precision, eff, per_node, topo),
            "optimizer": cfg.optimizer,
            "batch": {"per_device": cfg.batch_size, "global": cfg.global_batch},
            "rows": rows,
            "recommendation": recommendation,
            "backend": backend_guidance(device),
            "curve": curve,
            "pareto": pareto(curve),
            **({"stops_paying": flat} if flat is not None else {}),
            **({"search": found} if found is not None else {}),
        },
    )


def _search(
    cfg: PlanConfig,
    profile: ModelProfile,
    device: Device,
    topo: Topology,
    eff: Efficiency,
    momentum: float,
    devices: int,
    per_node: int,
) -> dict[str, Any]:
    """plan --search (search.py): each checkpointing choice and tensor-parallel degree measured as the table's
    own, every layout priced by the same planner."""

    def variant(choice: Checkpointing) -> PlanConfig:
        return cfg.model_copy(update={flag: value for flag, value in choice._asdict().items() if flag != "label"})

    given = Checkpointing(
        "given",
        cfg.checkpointing,
        cfg.checkpoint_activations,
        cfg.checkpoint_activations_every if cfg.checkpoint_activations else 1,
        cfg.checkpoint_activations_ops,
    )
    measured = {given[1:]: profile}

    def profiles(choice: Checkpointing) -> ModelProfile:
        if choice[1:] not in measured:
            measured[choice[1:]] = profile_model(_train_config(variant(choice)))
        return measured[choice[1:]]

    def split(choice: Checkpointing, degree: int) -> Any:
        return profile_tensor_parallel(_train_config(variant(choice)), _split(cfg, degree))

    def rows(measured_profile: ModelProfile, degree: int, n: int) -> list[dict[str, Any]]:
        planner = _Planner(cfg.model_copy(update={"tp": degree}), measured_profile, device, topo, eff, momentum)
        return planner.rows(n)

    return search(devices, per_node, profiles, split, rows, device.memory_bytes * USABLE_FRACTION)


def _model_json(profile: ModelProfile) -> dict[str, Any]:
    """What the plan measured of the model, on the meta device."""
    return {
        "name": profile.name,
        "params": profile.params,
        "flops_per_sample": profile.flops_per_sample,
        "convolution_flops_per_sample": profile.convolution_flops_per_sample,
        "kind": profile.kind,
        "tokens_per_sample": profile.tokens_per_sample,
        "recompute_flops_per_sample": profile.recompute_flops_per_sample,
        "activation_bytes_per_sample": profile.activation_bytes_per_sample,
        "activation_bytes_fixed": profile.activation_bytes_fixed,
        "loss_activation_bytes_per_sample": profile.loss_activation_bytes_per_sample,
        "memory_bound_bytes_per_sample": profile.memory_bound_bytes_per_sample,
        "memory_bound_bytes_fixed": profile.memory_bound_bytes_fixed,
        "recompute_memory_bound_bytes_per_sample": profile.recompute_memory_bound_bytes_per_sample,
        "param_bytes": profile.param_bytes,
        "buffer_bytes": profile.buffer_bytes,
        "largest_unit_bytes": profile.largest_unit_bytes,
        "pipeline_units": len(profile.units),
        "measured": "on the meta device, on this machine (profile.py)",
        **({"tensor_parallel": vars(profile.tensor_parallel)} if profile.tensor_parallel else {}),
    }


def _device_json(device: Device, precision: str, eff: Efficiency, per_node: int, topo: Topology) -> dict[str, Any]:
    """The device, its efficiency (published or calibrated from runs) and its links."""
    return {
        "name": device.name,
        "precision": precision,
        "peak_flops_per_s": device.peak(precision),
        "memory_bytes": device.memory_bytes,
        "usable_fraction": USABLE_FRACTION,
        "memory_bandwidth_bytes_per_s": device.memory_bandwidth,
        "efficiency": eff.compute,
        "efficiency_source": eff.source,
        # the memory-bound operators' bytes timed apart, at the memory bandwidth (step_time.py)
        "memory_bound_apart": eff.memory_bound_apart,
        "overhead_s": eff.overhead_s,
        "calibrated_by_devices": [
            {
                "devices": n,
                "efficiency": share,
                "fixed_compute_s": eff.fixed_compute_s(n),
                "overhead_s": eff.overhead_for(n),
                # a pipeline's stages: the compute without the wait for the other ranks
                "pipeline_efficiency": eff.pipeline_compute(n)[0],
                "pipeline_fixed_compute_s": eff.pipeline_compute(n)[1],
            }
            for n, share in eff.by_devices
        ],
        # each layout measured beyond the plain ones: its own cost a step, fixed and per sample of a replica
        "calibrated_layouts": [
            {"layout": c.layout, "devices": c.devices, "fixed_s": c.fixed_s, "per_sample_s": c.per_sample_s}
            for c in eff.layout_costs
        ],
        "per_node": per_node,
        "intra_node_link": _link_json(topo.intra),
        "inter_node_link": _link_json(topo.inter),
        **(
            {f"gloo_{op}_link": _link_json(getattr(topo.gloo, op)) for op in GLOO_COLLECTIVES}
            if topo.gloo is not None
            else {}
        ),
        "sources": device.sources,
    }


PARETO_SAMPLES = 10_000_000  # the work the Pareto plot prices: ten million samples


def pareto(curve: list[dict[str, Any]], samples: int = PARETO_SAMPLES) -> dict[str, Any]:
    """Device-hours against wall time for the same work at each device count (McCandlish et al. 2018's
    trade of compute against time), its frontier, and the point where it bends.

    The bend is the frontier point farthest *below* the straight line joining its ends, in log-log
    space (the knee, as Kneedle finds it: Satopää et al. 2011, the largest difference in the
    curve's own direction): before it, more devices cut the wall time at little extra cost; after
    it, each halving of the time costs ever more device-hours. Points above the line are a cost paid
    early and then no more (a full node's slower devices), not a knee; with none below, no bend.
    """
    import math

    points = [
        {
            "devices": c["devices"],
            "strategy": c["strategy"],
            "wall_hours": samples / c["samples_per_s"] / 3600,
            "device_hours": c["devices"] * samples / c["samples_per_s"] / 3600,
        }
        for c in curve
        if c.get("strategy") and c["samples_per_s"] > 0
    ]
    points.sort(key=lambda p: p["wall_hours"])
    frontier, cheapest = [], float("inf")
    # From the fastest: a point is on the frontier when no faster point costs less (equal cost stays:
    # perfect scaling is a flat stretch of the frontier, not a dominated one).
    for point in sorted(points, key=lambda p: (p["wall_hours"], p["device_hours"])):
        if point["device_hours"] <= cheapest * (1 + 1e-9):
            cheapest = min(cheapest, point["device_hours"])
            frontier.append(point)
    bend = None
    if len(frontier) >= 3:
        xy = [(math.log(p["wall_hours"]), math.log(p["device_hours"])) for p in frontier]
        (x0, y0), (x1, y1) = xy[0], xy[-1]
        # how far each point's cost lies below the line's at its wall time (the ends lie on it)
        below = [y0 + (y1 - y0) * (x - x0) / (x1 - x0) - y if x1 != x0 else 0.0 for x, y in xy]
        knee = max(range(len(frontier)), key=below.__getitem__)
        bend = frontier[knee]["devices"] if below[knee] > 1e-9 else None
    return {"samples": samples, "points": points, "frontier": [p["devices"] for p in frontier], "bend_devices": bend}


def _published_efficiency(device: Device, precision: str, kind: str) -> Efficiency:
    """The device table's figures for the model's kind. A model of matrix products (a transformer) takes
    the share of the peak such models reached on a whole node, where the table has one. Otherwise the
    convolutional network's: the share one device reaches, and from NODE_DEVICES devices on, that share
    times what each keeps when a whole node trains at once. Only 1 and NODE_DEVICES were published: the
    counts between are interpolated linearly, a guess that keeps the plan from predicting a sudden loss
    between 7 and 8 devices."""
    if kind == "matrix products" and precision in device.matrix_efficiency:
        return Efficiency(
            device.matrix_efficiency[precision],
            source=f"a model of matrix products: {device.sources.get(f'matrix_efficiency.{precision}', '')}",
            memory_bound_apart=True,
        )
    one = device.efficiency[precision]
    source = device.sources.get(f"efficiency.{precision}", "")
    if kind == "matrix products" and device.name != "cpu":
        source = f"no published figure for a model of matrix products on {device.name} {precision}, a CNN's: {source}"
    share = device.node_share.get(precision)
    if share is None:
        return Efficiency(one, source=source)
    kept = [(n, one * (1 - (1 - share) * (n - 1) / (NODE_DEVICES - 1))) for n in range(1, NODE_DEVICES + 1)]
    return Efficiency(
        one,
        source=f"{source}; x {share:.3f} from {NODE_DEVICES} devices on (linear from 1 to {NODE_DEVICES}): "
        f"{device.sources.get(f'node_share.{precision}', '')}",
        by_devices=tuple(kept),
    )


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _split(cfg: PlanConfig, degree: int) -> TensorParallelOptions:
    """The tensor parallelism the plan measures: the plan's own options at `degree`."""
    return TensorParallelOptions(
        tp=degree, tp_plan=cfg.tp_plan, sequence_parallel=cfg.sequence_parallel, loss_parallel=cfg.loss_parallel
    )


def _train_config(cfg: PlanConfig) -> TrainConfig:
    from paratrain.config import validate

    values = {
        k: getattr(cfg, k)
        for k in ("workload", "model", "dataset", "image_size", "seq_len", "num_classes", "cache_dir")
        if getattr(cfg, k) is not None
    }
    if cfg.precision in ("bf16", "fp16"):  # the memory-bound bytes are counted in 16 bits (tf32 and fp32: 32)
        values["precision"] = cfg.precision
    values["checkpoint_activations"] = cfg.checkpoint_activations
    values["checkpoint_activations_every"] = cfg.checkpoint_activations_every
    values["checkpoint_activations_ops"] = cfg.checkpoint_activations_ops
    if cfg.workload is None:
        from paratrain.workloads.gpt import PRESETS

        # A model without a workload: a gpt preset reads text, anything else images (--dataset to change it).
        values["workload"] = "synthetic-cnn"
        values.setdefault("dataset", "text" if cfg.model in PRESETS else "synthetic")
    profiled = validate(TrainConfig, values)
    # FSDP's units (--shard-unit), which train takes only with --strategy fsdp: the plan's fsdp layouts use them
    return profiled.model_copy(update={"shard_unit": cfg.shard_unit}) if cfg.shard_unit else profiled


def _topology(cfg: PlanConfig, device: Device, per_node: int, gradient_bytes: float) -> Topology:
    intra: Link = (
        shm_link(device.memory_bandwidth) if device.intra_node_link == "shm" else get_link(device.intra_node_link)
    )
    inter: Link = get_link(DEFAULT_INTER_NODE if device.name != "cpu" else "25gbe")
    if cfg.interconnect is not None:
        if cfg.interconnect.endswith(".json") or Path(cfg.interconnect).is_file():
            import json

            measured = commbench_link(Path(cfg.interconnect), gradient_bytes)
            nodes = json.loads(Path(cfg.interconnect).read_text()).get("nodes", 1)
            if nodes and int(nodes) > 1:
                inter = measured
            else:
                intra = measured
        else:
            inter = get_link(cfg.interconnect)
    if cfg.intra_node_gbps is not None:
        intra = custom_link("intra-node", cfg.intra_node_gbps)
    if cfg.inter_node_gbps is not None:
        inter = custom_link("inter-node", cfg.inter_node_gbps)
    gloo = measured_gloo_links(cfg.cache_dir) if device.intra_node_link == "shm" else None
    return Topology(per_node, intra, inter, gloo)


def _link_json(link: Link) -> dict[str, Any]:
    return {
        "name": link.name,
        "bandwidth_bytes_per_s": link.bandwidth,
        "latency_s": link.latency,
        "base_latency_s": link.base_latency,
        "source": link.source,
    }


def _run_timing(
    profile: ModelProfile,
    summary: Summary,
    device: Device,
    cfg: PlanConfig,
    topo: Topology,
    eff: Efficiency,
    splits: dict[str, TensorParallelProfile],
) -> dict[str, Any]:
    """The plan's step for a measured run's layout under `eff`, and the layout's key (step_time.layout_key): what
    calibration compares the run's with."""
    n, mesh = summary.workers, summary.layout or {}
    t, shards = mesh.get("tp", 1), mesh.get("dp_shard", 1)
    stages = mesh.get("pp") or (summary.pipeline or {}).get("stages", 1)  # a summary from before `layout`: its block's
    samples = summary.batch_size * (summary.grad_accum or 1)
    if t > 1:
        profile = replace(profile, tensor_parallel=_run_split(cfg, summary, t, splits))
    if stages > 1:  # the run's pipeline as the plan lays it out: its stages, replicas and micro-batches
        replicated, ran = mesh.get("dp_replicate", 1), summary.pipeline or {}
        name = staged_layout_name(replicated, shards, t)
        microbatches, schedule = ran.get("microbatches", stages), ran.get("schedule", "1f1b")
        shard = mesh_shard(replicated, shards, t)
        layout = Layout(name, n, replicated * shards, stages, microbatches, samples, schedule, shard=shard, tp=t)
    elif t > 1:
        name = "fsdp+tp" if n > t else "tp"
        layout = Layout(name, n, n // t, 1, 1, samples, tp=t, shard=mesh_shard(n // (t * shards), shards, t))
    else:
        shard = shards if summary.layout and summary.strategy == "fsdp" else None  # HSDP's
        layout = Layout(summary.strategy, n, n, 1, 1, samples, shard=shard)
    timing = step_time(profile, layout, device, cfg.precision, cfg.optimizer, topo, eff)
    return {**timing, "layout": layout_key(layout, profile.tensor_parallel)}


def staged_layout_name(replicas: int, shards: int, tp: int) -> str:
    """The plan's name of a pipeline laid out on a mesh of `replicas` x `shards` x `tp` x stages."""
    name = "pp+fsdp" if shards > 1 else "hybrid" if replicas > 1 else "pipeline"
    if tp > 1:  # replicas of split stages are FSDP2's over shards of one rank (hybrid.py): pp+fsdp+tp, shard 1
        name = {"pp+fsdp": "pp+fsdp+tp", "hybrid": "pp+fsdp+tp", "pipeline": "pp+tp"}[name]
    return name


def mesh_shard(replicas: int, shards: int, tp: int) -> int | None:
    """The `shard` of a Layout on that mesh: S where FSDP shards, 1 for replicas of split layers (FSDP2 over shards
    of one rank, `train`'s way), None where the layout does not shard."""
    return shards if shards > 1 else 1 if tp > 1 and replicas > 1 else None


def _run_split(
    cfg: PlanConfig, summary: Summary, degree: int, splits: dict[str, TensorParallelProfile]
) -> TensorParallelProfile:
    """The model split as the run split it (its degree and its tensor-parallel options in config.json), measured
    once for all the runs split alike (`splits`)."""
    ran = RunDir(Path(summary.run_dir or ".")).read_config()
    options = TensorParallelOptions(
        tp=degree, **{k: ran[k] for k in ("tp_plan", "sequence_parallel", "loss_parallel") if ran.get(k) is not None}
    )
    key = options.model_dump_json()
    if key not in splits:
        splits[key] = profile_tensor_parallel(_train_config(cfg), options)
    return splits[key]


class _Planner:
    def __init__(
        self, cfg: PlanConfig, profile: ModelProfile, device: Device, topo: Topology, eff: Efficiency, momentum: float
    ):
        self.cfg, self.profile, self.device, self.topo, self.eff, self.momentum = (
            cfg,
            profile,
            device,
            topo,
            eff,
            momentum,
        )
        self._base: float | None = None

    def global_batch(self, n: int) -> int:
        return self.cfg.global_batch if self.cfg.global_batch is not None else self.cfg.batch_size * n

    def layouts(self, n: int) -> list[Layout]:
        g = self.global_batch(n)
        if n == 1:
            return [Layout("single", 1, 1, 1, 1, g)]
        if self.cfg.mesh is not None:
            return [self._mesh(n, g, *self.cfg.mesh)] if n == math.prod(self.cfg.mesh) else []
        units = len(self.profile.units)
        out = []
        for name in self.cfg.strategy:
            if name in ("ddp", "zero1", "fsdp") and g % n == 0:
                out.append(Layout(name, n, n, 1, 1, g // n))
            elif name == "pipeline" and n <= units and g % n == 0:
                out.append(Layout(name, n, 1, n, max(self.cfg.microbatches, n), g))
            elif name == "hsdp" and n > self.topo.per_node and n % self.topo.per_node == 0 and g % n == 0:
                # a replica a node, its devices sharding within it: the gathers stay inside the node
                out.append(Layout("fsdp", n, n, 1, 1, g // n, shard=self.topo.per_node))
            elif name in ("hybrid", "pp+fsdp") and n >= 4:
                layout = self._hybrid(n, g, units, sharded=name == "pp+fsdp")
                if layout is not None:
                    out.append(layout)
        t = self.cfg.tp
        if t == 1 or n % t:
            return out
        groups = n // t  # tensor-parallel groups: the mesh's other dimensions
        if n == t:
            out.append(Layout("tp", n, 1, 1, 1, g, tp=t))
        elif g % groups == 0:
            out.append(Layout("fsdp+tp", n, groups, 1, 1, g // groups, tp=t))
        # each stage split T ways: one pipeline over every group, or (as train runs them) stages sharded
        if "pipeline" in self.cfg.strategy and 2 <= groups <= units and g % groups == 0:
            out.append(Layout("pp+tp", n, 1, groups, max(self.cfg.microbatches, groups), g, tp=t))
        if "pp+fsdp" in self.cfg.strategy and groups >= 4:
            layout = self._hybrid(n, g, units, sharded=True, tp=t)
            if layout is not None:
                out.append(layout)
        return out

    def _mesh(self, n: int, g: int, r: int, s: int, t: int, p: int) -> Layout:
        """The layout --dp-replicate R --dp-shard S --tp T --pp P names, as the strategy `train` runs it."""
        replicas = r * s
        shard = mesh_shard(r, s, t)
        if p > 1:
            name = staged_layout_name(r, s, t)
            return Layout(name, n, replicas, p, max(self.cfg.microbatches, p), g // replicas, shard=shard, tp=t)
        if s > 1 or (r > 1 and t > 1):
            # replicas of tensor-parallel groups (Megatron's layout) train as FSDP2 over shards of one rank
            name, reshard = "fsdp+tp" if t > 1 else "fsdp", self.cfg.reshard_after_forward
            return Layout(name, n, replicas, 1, 1, g // replicas, shard=s, tp=t, reshard_after_forward=reshard)
        return Layout("tp", n, 1, 1, 1, g, tp=t) if t > 1 else Layout("ddp", n, r, 1, 1, g // r)

    def _hybrid(self, n: int, g: int, units: int, sharded: bool, tp: int = 1) -> Layout | None:
        """The fewest stages (at least 2, dividing the N / T groups, at most the units) whose largest stage fits:
        replicated (hybrid), or sharded over the replicas (pp+fsdp; pp+fsdp+tp with each stage split T ways)."""
        groups = n // tp
        candidates = [k for k in range(2, min(units, groups // 2) + 1) if groups % k == 0 and g % (groups // k) == 0]

        def laid_out(k: int) -> Layout:
            replicas = groups // k
            name, shard = ("pp+fsdp" + ("+tp" if tp > 1 else ""), replicas) if sharded else ("hybrid", 1)
            return Layout(name, n, replicas, k, max(self.cfg.microbatches, k), g // replicas, shard=shard, tp=tp)

        for k in candidates:
            if self.memory(laid_out(k))["total_bytes"] <= self.device.memory_bytes * USABLE_FRACTION:
                return laid_out(k)
        return laid_out(candidates[-1]) if candidates else None

    def memory(self, layout: Layout) -> dict[str, Any]:
        return memory_per_device(
            self.profile, layout, self.cfg.optimizer, self.cfg.precision, self.device.runtime_bytes, self.momentum
        )

    def base_samples_per_s(self) -> float:
        if self._base is None:
            single = self.layouts(1)[0]
            self._base = self.global_batch(1) / self._timing(single)["step_time_s"]
        return self._base

    def _timing(self, layout: Layout) -> dict[str, Any]:
        return step_time(self.profile, layout, self.device, self.cfg.precision, self.cfg.optimizer, self.topo, self.eff)

    def row(self, layout: Layout) -> dict[str, Any]:
        timing, memory = self._timing(layout), self.memory(layout)
        samples = self.global_batch(layout.devices) / timing["step_time_s"]
        speedup = samples / self.base_samples_per_s()
        return {
            "devices": layout.devices,
            "nodes": -(-layout.devices // self.topo.per_node),
            "strategy": layout.name,
            "layout": layout.mesh(),
            "activation_checkpointing": self.cfg.checkpointing,
            "data_parallel": layout.data_parallel,
            "tp": layout.tp,
            "stages": layout.stages,
            "microbatches": layout.microbatches,
            "global_batch": self.global_batch(layout.devices),
            "step_time_s": timing["step_time_s"],
            "samples_per_s": samples,
            "speedup": speedup,
            "efficiency": speedup / layout.devices,
            "memory_per_device_bytes": memory["total_bytes"],
            "fits": memory["total_bytes"] <= self.device.memory_bytes * USABLE_FRACTION,
            "memory": memory,
            "time": timing,
            "bubble_fraction": bubble_fraction(layout.stages, layout.microbatches),
        }

    def rows(self, n: int) -> list[dict[str, Any]]:
        return [self.row(layout) for layout in self.layouts(n)]

    def best_row(self, n: int) -> dict[str, Any] | None:
        """The row of the fastest strategy that fits on N devices (the fastest of all when none fits)."""
        rows = self.rows(n)
        fitting = [r for r in rows if r["fits"]]
        return max(fitting or rows, key=lambda r: r["samples_per_s"]) if rows else None

    def stops_paying(self, counts: list[int]) -> dict[str, Any] | None:
        """At a fixed global batch: where more devices stop paying, and why (regime.py)."""
        return stops_paying([row for n in counts if (row := self.best_row(n)) is not None])

    def best(self, n: int) -> dict[str, Any]:
        best = self.best_row(n)
        if best is None:
            return {"devices": n, "strategy": None}
        keep = ("devices", "strategy", "step_time_s", "samples_per_s", "speedup", "efficiency", "fits", "global_batch")
        return {k: best[k] for k in keep}

    def recommend(self, n: int) -> dict[str, Any]:
        """One strategy for N devices by the rule, with the reason in numbers."""
        rows = {r["strategy"]: r for r in self.rows(n)}
        usable = self.device.memory_bytes * USABLE_FRACTION
        room = f"{size(usable)} usable of {size(self.device.memory_bytes)} per {self.device.name}"
        if n == 1:
            single = rows["single"]
            verdict = "fits" if single["fits"] else "does not fit"
            return {
                "devices": 1,
                "strategy": "single" if single["fits"] else None,
                "reason": f"one device: the model needs {size(single['memory_per_device_bytes'])} ({verdict}; {room})",
            }
        need = {name: r["memory_per_device_bytes"] for name, r in rows.items()}
        ddp = rows.get("ddp")
        if ddp is not None and ddp["fits"]:
            return self._pick(
                ddp,
                f"the model fits one device under ddp ({size(need['ddp'])} of {room}): data parallel; "
                f"predicted {rate(ddp['samples_per_s'])} samples/s, speedup {ddp['speedup']:.1f}, "
                f"efficiency {ddp['efficiency']:.2f} on {n} devices",
            )
        sharded = [
            rows[s]
            for s in ("zero1", "fsdp", "hsdp", "pipeline", "tp", "fsdp+tp", "pp+fsdp", "pp+tp", "pp+fsdp+tp")
            if s in rows and rows[s]["fits"]
        ]
        too_big = (
            f"ddp needs {size(need['ddp'])} per device, more than {room}"
            if "ddp" in need
            else "data parallel was not planned"
        )
        if sharded:
            best = max(sharded, key=lambda r: r["samples_per_s"])
            others = ", ".join(f"{r['strategy']} {rate(r['samples_per_s'])}" for r in sharded if r is not best)
            near = [r["strategy"] for r in sharded if r is not best and close_call(best, r)]
            return self._pick(
                best,
                f"{too_big}: shard, split the layers or pipeline; {best['strategy']} fits "
                f"({size(need[best['strategy']])}) "
                f"and is the fastest that does ({rate(best['samples_per_s'])} samples/s"
                + (f"; {others}" if others else "")
                + ")"
                + (
                    f"; {' and '.join(near)} within {CLOSE_CALL:.0%} of it, a close call the plan does not rank "
                    "reliably: run a few steps of each"
                    if near
                    else ""
                ),
            )
        hybrid = rows.get("hybrid")
        if hybrid is not None and hybrid["fits"]:
            return self._pick(
                hybrid,
                f"{too_big}, and neither sharding nor one pipeline fits: hybrid, {hybrid['data_parallel']} "
                f"replicas x {hybrid['stages']} stages, {size(need['hybrid'])} per device, "
                f"{rate(hybrid['samples_per_s'])} samples/s",
            )
        least = min(rows.values(), key=lambda r: r["memory_per_device_bytes"])
        return {
            "devices": n,
            "strategy": None,
            "reason": f"nothing planned fits: the smallest, {least['strategy']}, needs "
            f"{size(least['memory_per_device_bytes'])} per device ({room}); use more devices, a smaller --batch-size, "
            "activation checkpointing, or a device with more memory",
        }

    @staticmethod
    def _pick(row: dict[str, Any], reason: str) -> dict[str, Any]:
        return {
            "devices": row["devices"],
            "strategy": row["strategy"],
            "data_parallel": row["data_parallel"],
            "stages": row["stages"],
            "samples_per_s": row["samples_per_s"],
            "efficiency": row["efficiency"],
            "memory_per_device_bytes": row["memory_per_device_bytes"],
            "reason": reason,
        }


def backend_guidance(device: Device) -> dict[str, Any]:
    """Which torch.distributed back end, and what each lacks (PyTorch's torch.distributed docs, "Backends":
    the table of collectives per back end and device)."""
    import torch.distributed as dist

    return {
        "use": "nccl" if device.name != "cpu" else "gloo",
        "why": (
            "GPUs: NCCL is the fastest for GPU collectives and uses NVLink and InfiniBand directly"
            if device.name != "cpu"
            else "CPU ranks: Gloo (NCCL is GPU-only); paratrain averages gradients of CPU "
            "ranks on one host through shared memory"
        ),
        "backends": {
            "nccl": "GPU tensors only (no CPU collectives); collectives and point-to-point, over NVLink and InfiniBand",
            "gloo": "CPU: the collectives and point-to-point; GPU tensors: broadcast and all-reduce only (in the "
            "table of torch 2.3's docs; newer releases add some)",
            "mpi": (
                "available in this build"
                if dist.is_mpi_available()
                else "not in this build (needs torch built with MPI)"
            )
            + "; CPU collectives (GPU only with a CUDA-aware MPI); rides on the cluster's interconnect",
        },
    }
