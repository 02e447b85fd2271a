"""How devices talk: bandwidth per direction and a per-step latency for each kind of link, with sources.

A collective over a ring takes steps; each step pays the link's latency, and the bytes cross the
link at its bandwidth (the alpha-beta model; Patarasuk & Yuan 2009 for the ring, nccl-tests'
PERFORMANCE.md for the bus-bandwidth factors 2(n-1)/n and (n-1)/n). Bandwidths are per direction,
per device: the unidirectional share of the aggregate a data sheet quotes (NVLink's "600 GB/s" on
A100 counts both directions, so 300 GB/s each way). Latencies are NCCL's own model of itself
(NVIDIA/nccl src/graph/tuning.cc: `baseLat` ring/Simple 8.4 us per collective and `hwLat` ring/Simple
per step: NVLink 3.4 us, PCIe 5.7 us, network 9.6 us).

A `paratrain commbench` result (the alpha-beta fit measured on the user's own machine) replaces the
table's figures when given (`--interconnect PATH.json`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError

GB = 1e9
US = 1e-6
NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (ring, Simple protocol)"
NCCL_BASE_LATENCY_S = 8.4 * US  # baseLat[ring][Simple]: once per collective


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per direction, per device
    latency: float  # seconds per ring step
    source: str
    base_latency: float = NCCL_BASE_LATENCY_S  # seconds per collective


def _link(name: str, gbs: float, latency_us: float, kind: str, source: str) -> Link:
    return Link(
        name,
        gbs * GB,
        latency_us * US,
        f"bandwidth: {source}; latency: {NCCL_TUNING}, hwLat {kind} {latency_us:g} us per step",
    )


LINKS: dict[str, Link] = {
    "nvlink1": _link("nvlink1", 80, 3.4, "NVLink", "NVIDIA Tesla P100 data sheet: NVLink 160 GB/s bidirectional"),
    "nvlink2": _link("nvlink2", 150, 3.4, "NVLink", "NVIDIA Tesla V100 data sheet: NVLink 300 GB/s bidirectional"),
    "nvlink3": _link("nvlink3", 300, 3.4, "NVLink", "NVIDIA A100 data sheet: NVLink 600 GB/s bidirectional"),
    "nvlink4": _link("nvlink4", 450, 3.4, "NVLink", "NVIDIA H100 data sheet: NVLink 900 GB/s bidirectional"),
    "pcie3": _link("pcie3", 15.75, 5.7, "PCIe", "PCI Express Base Specification 3.0: 8 GT/s x16 lanes, 128b/130b"),
    "pcie4": _link("pcie4", 31.5, 5.7, "PCIe", "PCI Express Base Specification 4.0: 16 GT/s x16 lanes, 128b/130b"),
    "pcie5": _link("pcie5", 63.0, 5.7, "PCIe", "PCI Express Base Specification 5.0: 32 GT/s x16 lanes, 128b/130b"),
    "ib-edr": _link("ib-edr", 12.5, 9.6, "network", "InfiniBand Trade Association roadmap: EDR 100 Gb/s (4x)"),
    "ib-hdr": _link("ib-hdr", 25.0, 9.6, "network", "InfiniBand Trade Association roadmap: HDR 200 Gb/s (4x)"),
    "ib-ndr": _link("ib-ndr", 50.0, 9.6, "network", "InfiniBand Trade Association roadmap: NDR 400 Gb/s (4x)"),
    "25gbe": _link("25gbe", 3.125, 9.6, "network", "IEEE 802.3by: 25 Gb/s Ethernet"),
    "100gbe": _link("100gbe", 12.5, 9.6, "network", "IEEE 802.3bj: 100 Gb/s Ethernet"),
}
# CPU ranks of one host average gradients through shared memory (engine/shm_allreduce.py): the
# bandwidth is the core's own memory bandwidth (set per machine by devices.measure_cpu); the
# latency is the measured median of one average after 10 ms of compute, 0.16-0.18 ms
# (docs/benchmarks.md, benchmarks/allreduce_latency.py), charged once per collective.
SHM_LATENCY_S = 0.17e-3
SHM_SOURCE = "measured here: benchmarks/allreduce_latency.py, docs/benchmarks.md (0.16-0.18 ms after compute)"
# Every other collective of CPU ranks (FSDP's gathers and reduce-scatters, tensor parallelism's all-reduces,
# the pipeline's sends, hybrid's DDP) is torch.distributed's own, on gloo over the loopback, each collective at
# its own line as a step pays it: `paratrain commbench` on 2 ranks of this machine (gloo_links; the plan measures
# it once per machine). gloo's all-gather and reduce-scatter are not halves of its all-reduce: on the AVX2 machine
# (2026-11-30) 0.79 ms + bytes / 0.99 GB/s and 0.97 ms + bytes / 0.70 GB/s, the all-reduce 1.3 ms + bytes / 1.07 GB/s.
GLOO_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
DEFAULT_INTER_NODE = "ib-hdr"


def get_link(name: str) -> Link:
    if name not in LINKS:
        raise UsageError(f"unknown interconnect {name!r}; choose from {', '.join(LINKS)} or give a commbench JSON file")
    return LINKS[name]


def shm_link(memory_bandwidth: float) -> Link:
    return Link(
        "shm",
        memory_bandwidth / 2,
        0.0,
        f"bandwidth: half the core's measured copy bandwidth (each rank "
        f"reads its peers' gradients and writes the average); latency: {SHM_SOURCE}",
        base_latency=SHM_LATENCY_S,
    )


@dataclass(frozen=True)
class GlooLinks:
    """gloo's collectives between the CPU ranks of one host, each its own alpha-beta line; and how far the last rank
    to reach a collective lags the ranks' mean arrival, as a share of the compute before it (two cores never finish
    the same work at the same moment): every rank but the last waits that long, whatever the link."""

    all_reduce: Link
    all_gather: Link
    reduce_scatter: Link
    arrival_lag: float = 0.0


def gloo_links(result: dict[str, Any], path: Path) -> GlooLinks:
    """Each of GLOO_COLLECTIVES from a `paratrain commbench` result on gloo (`path` names it in the sources), as a
    training step pays it: the bandwidth of the line through the mean calls (a step pays every call of its loop),
    and the latency that puts that line through the last rank's mean call after compute (`after_compute`: the
    threads' wake-up, which calls back to back do not pay); and the ranks' arrival lag. As the ring formulas take
    it: the latency once per collective, beta (the algorithm bandwidth over the whole buffer) times the bus factor."""
    from paratrain.commbench import BUS_FACTOR

    ranks = int(result.get("ranks", 2))
    lines = {
        c["op"]: c
        for c in result.get("collectives", [])
        if c.get("path") == "gloo" and "mean_fit" in c and "after_compute" in c
    }
    missing = [op for op in GLOO_COLLECTIVES if op not in lines] + (
        ["the arrival lag"] if "arrival_lag" not in result else []
    )
    if missing:
        raise UsageError(
            f"{path}: no gloo {', '.join(missing)} timed after compute in this commbench result (an older "
            "paratrain's, or another backend's); delete it, and the plan measures gloo again"
        )

    def link(op: str) -> Link:
        beta, after = lines[op]["mean_fit"]["beta_bytes_per_s"], lines[op]["after_compute"]
        seconds_per_byte = 1 / float(beta) if beta else 0.0
        alpha = max(after["mean_seconds"] - after["bytes"] * seconds_per_byte, 0.0)
        bus = BUS_FACTOR[op](ranks)  # nccl-tests' factors: the ring's per-link share of the algorithm bandwidth
        return Link(
            f"gloo {op.replace('_', '-')}",
            bus / seconds_per_byte if seconds_per_byte else float("inf"),
            0.0,
            f"measured: paratrain commbench, {path} ({op} on {ranks} ranks: {alpha * 1e3:.2f} ms + bytes / "
            f"{(float(beta) if beta else float('inf')) / GB:.2f} GB/s, through its mean call after "
            f"{after['compute_s'] * 1e3:g} ms of compute, {after['mean_seconds'] * 1e3:.2f} ms at "
            f"{after['bytes'] / 2**20:g} MiB)",
            base_latency=alpha,
        )

    return GlooLinks(*(link(op) for op in GLOO_COLLECTIVES), arrival_lag=float(result["arrival_lag"]["share"]))


def measured_gloo_links(cache_dir: Path | None) -> GlooLinks:
    """gloo's links on this machine: `paratrain commbench` on 2 ranks, run once per machine and kept where commbench
    keeps its results (a result of this CPU measured by `paratrain commbench --workers 2` serves as well), as the
    CPU's peak is kept: a plan made twice must not differ by a noisy measurement."""
    from paratrain.commbench import default_path, run_commbench
    from paratrain.config import CommbenchConfig
    from paratrain.engine.flops import cpu_model

    path = default_path("gloo", "cpu", 2, cache_dir)
    try:
        result = json.loads(path.read_text())
        if result.get("cpu") == cpu_model():
            return gloo_links(result, path)
    except (OSError, ValueError, UsageError):
        pass
    from rich.console import Console

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cfg = CommbenchConfig(
        workers=2, out=path, min_size="4K", max_size="16M", seconds_per_size=0.1, allow_oversubscribe=cores < 2
    )
    measuring = f"measuring gloo's collectives here, once (paratrain commbench, about 20 s): {path}"
    with Console(stderr=True).status(measuring):
        return gloo_links(run_commbench(cfg), path)


def custom_link(name: str, gbits: float) -> Link:
    """A link given as --intra-node-gbps / --inter-node-gbps (gigabits per second, per direction)."""
    latency = 3.4 * US if name == "intra-node" else 9.6 * US
    return Link(
        name, gbits * GB / 8, latency, f"bandwidth: given on the command line ({gbits:g} Gb/s); latency: {NCCL_TUNING}"
    )


def commbench_link(path: Path, message_bytes: float) -> Link:
    """The alpha-beta fit `paratrain commbench` saved (schema paratrain.commbench/1, docs/synchronisation.md):
    its `fit` block, the all-reduce on the path DDP averages with, t(bytes) = alpha_s + bytes / beta_bytes_per_s
    on `ranks` ranks; where the fit has regimes, the one a message of `message_bytes` (the gradients a
    step averages) falls in. A file without them is refused.
    """
    from paratrain.commbench import regime_for

    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"--interconnect {path}: cannot read a commbench result ({type(exc).__name__}: {exc})"
        ) from None
    fit: dict[str, Any] | None = data.get("fit", data) if isinstance(data, dict) else None
    if not isinstance(fit, dict) or "alpha_s" not in fit or "beta_bytes_per_s" not in fit:
        raise UsageError(
            f"--interconnect {path}: not a commbench result (it needs alpha_s and beta_bytes_per_s); "
            "run paratrain commbench, or name a link from the table"
        )
    ranks = int(fit.get("ranks", data.get("ranks", 2)))
    line = regime_for(fit["regimes"], message_bytes) if fit.get("regimes") else fit
    # commbench's beta is the all-reduce's algorithm bandwidth; the ring's per-link bandwidth is
    # that times the bus factor 2(n-1)/n (nccl-tests PERFORMANCE.md). No beta: the fit found no
    # bandwidth term (latency-bound at every size measured).
    beta = line["beta_bytes_per_s"]
    bus = float(beta) * 2 * (ranks - 1) / ranks if beta else float("inf")
    regime = (
        f", the regime of {message_bytes / 2**20:,.1f} MiB messages"
        if fit.get("regimes") and len(fit["regimes"]) > 1
        else ""
    )
    return Link(
        f"commbench:{Path(path).name}",
        bus,
        0.0,
        f"measured: paratrain commbench {path} (alpha {line['alpha_s'] * 1e6:.1f} us, {ranks} ranks{regime})",
        base_latency=float(line["alpha_s"]),
    )
