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
# the pipeline's sends, hybrid's DDP) is torch.distributed's own, on gloo over the loopback: an all-reduce
# between 2 ranks of this host, a core each, measured (benchmarks/gloo_link.py, 3 runs 2026-11-27: alpha
# 0.285-0.299 ms, beta 1.25-1.42 GB/s; the medians), charged once per collective. A fifth of the shared-memory
# average's bandwidth here, and twice its latency.
GLOO_LATENCY_S = 0.296e-3
GLOO_BANDWIDTH = 1.34 * GB
GLOO_SOURCE = "measured here: benchmarks/gloo_link.py (2 ranks, a core each: 0.285-0.299 ms, 1.25-1.42 GB/s)"
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


def gloo_link() -> Link:
    return Link("gloo", GLOO_BANDWIDTH, 0.0, GLOO_SOURCE, base_latency=GLOO_LATENCY_S)


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
