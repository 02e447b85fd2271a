"""The accelerators a plan can target: peak FLOP/s by dtype, memory, memory bandwidth, each with its source.

GPU figures are the vendors' data-sheet figures, dense (without the 2:4 sparsity that the newer
data sheets quote as the headline), for the SXM form factor where there are several. They are
peaks: no training reaches them, so a plan multiplies them by an achievable-efficiency factor
(`efficiency`), which is calibrated: from published measurements by default (the table below says
which) or from runs measured here (`paratrain plan --calibrate RUN_DIRS...`).

`cpu` is this machine, measured, not looked up: one rank per core, as paratrain runs CPU ranks
(docs/scaling.md), so a "device" is one core: its matrix-product peak (engine/flops.py's probe on one
thread), its share of the host's memory and a memory bandwidth timed here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from paratrain.errors import UsageError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
GB = 1e9
TFLOPS = 1e12

# Data sheets, named by document (NVIDIA's product data sheets; the figures are those printed there).
P100_DS = "NVIDIA Tesla P100 data sheet (SXM2, NVLink)"
V100_DS = "NVIDIA Tesla V100 GPU data sheet (SXM2)"
A100_DS = "NVIDIA A100 Tensor Core GPU data sheet (SXM4 80GB)"
A100_40GB_DS = "NVIDIA A100 Tensor Core GPU data sheet (SXM4 40GB)"
H100_DS = "NVIDIA H100 Tensor Core GPU data sheet (SXM5)"
H200_DS = "NVIDIA H200 Tensor Core GPU data sheet (H200 SXM)"
GH200_DS = "NVIDIA GH200 Grace Hopper Superchip data sheet (96GB HBM3; its GPU computes as H100 SXM)"
L4_DS = "NVIDIA L4 Tensor Core GPU data sheet"
T4_DS = "NVIDIA T4 Tensor Core GPU data sheet"

# The achievable share of the peak for dense training, from published measurements of ResNet-50
# v1.5 training in PyTorch (NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/
# resnet50v1.5/README.md, "Training performance results", 1 GPU, pytorch-21.03 container), at
# 24.3 GFLOPs per 224 px image (forward + backward, counted here by torch.utils.flop_counter on
# paratrain's resnet50v2 at 224 px, 1,000 classes: pre-activation, 25.5 M parameters; v1.5 has
# 25.6 M and the same convolutions, placed differently):
#   A100 80GB: TF32 938 img/s -> 22.8 of 156 TFLOP/s = 0.146; AMP 2,470 img/s -> 60.0 of 312 = 0.192
#   V100 16GB: FP32 367 img/s -> 8.9 of 15.7 TFLOP/s = 0.568;  AMP 1,200 img/s -> 29.2 of 125 = 0.233
# A convolutional network leaves tensor cores far from their peak; a transformer's matrix products reach
# more, so a model whose FLOPs are mostly matrix products takes the figures below instead.
DLE_RESNET50 = "NVIDIA DeepLearningExamples ResNet-50 v1.5 PyTorch README, 1-GPU training throughput"
FLOPS_PER_IMAGE_RESNET50 = 24.3e9

# Eight devices of a node training at once each run slower than one alone, beyond any communication:
# the same README's 8-GPU rows give the share of the 1-GPU speed each GPU keeps (8-GPU img/s / 8 x
# 1-GPU img/s): A100 TF32 7,248 / 8 x 938 = 0.966, AMP 16,621 / 8 x 2,470 = 0.841; V100 FP32 2,855 /
# 8 x 367 = 0.972, AMP 8,322 / 8 x 1,200 = 0.867. The loss is not the links (a ring all-reduce of
# ResNet-50's gradients over NVLink takes under 1 % of a step) nor an input pipeline at its limit:
# ResNeXt-101 and SE-ResNeXt-101, at half ResNet-50's images per second, keep the same shares in the
# sibling READMEs (docs/planner.md tests the plan on them). NVIDIA does not say what it is; it grows
# with mixed precision. Published at 1 and 8 GPUs only (the plan interpolates between: plan/__init__.py).
DLE_RESNET50_NODE = "NVIDIA DeepLearningExamples ResNet-50 v1.5 PyTorch README, 8-GPU against 1-GPU training throughput"
NODE_DEVICES = 8

# The achievable share of the peak of a model's matrix products (a transformer's), from MosaicML's published
# MPT training benchmarks (mosaicml/llm-foundry, scripts/train/benchmarking/README.md): MPT-7B, sequence
# 2,048, 8 GPUs, FSDP FULL_SHARD, amp_bf16, micro-batch 6, no activation checkpointing, the table row for each
# GPU. The share at which the plan of that run (benchmarks/mpt.py's MPT-7B) gives its published tokens/s per
# GPU, with its memory-bound operators' bytes (norms, GELU, residual adds, the loss: profile.py) timed apart at
# the device's memory bandwidth, so that a model with more of them (Llama's eager RMSNorm, SwiGLU, rotary
# positions and 128k-word loss) is not credited with MPT's speed: benchmarks/matrix_efficiency.py derives them,
# and predicts the same tables' other rows with them (13B, 30B, longer sequences, checkpointed: docs/planner.md).
# The 8 GPUs of a node trained together, so no node share applies on top. fp16 runs on the same tensor cores
# at the same peak and takes the bf16 figure; there is no published fp32/tf32 figure (those precisions keep the
# convolutional network's).
LLM_FOUNDRY_MPT = "MosaicML llm-foundry MPT training benchmarks (scripts/train/benchmarking/README.md)"
_A100_MATRIX = {"bf16": 0.671, "fp16": 0.671}
_A100_MATRIX_SOURCE = (
    f"{LLM_FOUNDRY_MPT}, A100 80GB table: MPT-7B, sequence 2,048, 8 GPUs, FSDP, bf16, no activation "
    "checkpointing, 4,641 tokens/s a GPU (64.23 % MFU), net of its memory-bound operators' time "
    "(benchmarks/matrix_efficiency.py); fp16 taken as bf16 (same tensor-core peak)"
)
_H100_MATRIX = {"bf16": 0.495, "fp16": 0.495}
_H100_MATRIX_SOURCE = (
    f"{LLM_FOUNDRY_MPT}, H100 80GB BF16 table: MPT-7B, sequence 2,048, 8 GPUs, FSDP, no activation "
    "checkpointing, 10,643 tokens/s a GPU (46.44 % MFU), net of its memory-bound operators' time "
    "(benchmarks/matrix_efficiency.py); fp16 taken as bf16 (same tensor-core peak)"
)


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: dict[str, float | None]  # FLOP/s by precision; None where the device has no such unit
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    intra_node_link: str  # the links.py name of how devices of one node are joined
    efficiency: dict[str, float]  # achievable share of the peak, by precision (a convolutional network's)
    # by precision: the share of that speed each device keeps when NODE_DEVICES of a node train at once
    node_share: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # figure -> where it comes from
    overlap: bool = True  # communication runs beside compute (own copy engines, NCCL streams)
    runtime_bytes: float = 0.0  # memory the process holds before any model
    # by precision: the share of the peak a model of matrix products (a transformer) reaches, measured on
    # a whole node (no node share on top); precisions without one take `efficiency`
    matrix_efficiency: dict[str, float] = field(default_factory=dict)

    def peak(self, precision: str) -> float:
        value = self.peak_flops.get(precision)
        if value is None:
            have = ", ".join(p for p, v in self.peak_flops.items() if v is not None)
            raise UsageError(f"{self.name} has no {precision} units; choose --precision from {have}")
        return value


def _gpu(
    name: str,
    sheet: str,
    fp32: float,
    tf32: float | None,
    bf16: float | None,
    fp16: float | None,
    memory_gb: float,
    bandwidth_gbs: float,
    link: str,
    efficiency: dict[str, float],
    efficiency_source: str,
    node_share: dict[str, float],
    node_share_source: str,
    matrix_efficiency: dict[str, float] | None = None,
    matrix_efficiency_source: str = "",
) -> Device:
    flops = {
        "fp32": fp32 * TFLOPS,
        "tf32": tf32 * TFLOPS if tf32 else None,
        "bf16": bf16 * TFLOPS if bf16 else None,
        "fp16": fp16 * TFLOPS if fp16 else None,
    }
    sources = {f"peak_flops.{p}": f"{sheet}: {v / TFLOPS:g} TFLOP/s dense" for p, v in flops.items() if v is not None}
    sources["memory_bytes"] = f"{sheet}: {memory_gb:g} GB"
    sources["memory_bandwidth"] = f"{sheet}: {bandwidth_gbs:g} GB/s"
    sources["intra_node_link"] = f"{sheet}: {link}"
    for precision in efficiency:
        sources[f"efficiency.{precision}"] = efficiency_source
    for precision in node_share:
        sources[f"node_share.{precision}"] = node_share_source
    for precision in matrix_efficiency or {}:
        sources[f"matrix_efficiency.{precision}"] = matrix_efficiency_source
    return Device(
        name,
        flops,
        memory_gb * GB,
        bandwidth_gbs * GB,
        link,
        efficiency,
        node_share,
        sources,
        matrix_efficiency=dict(matrix_efficiency or {}),
    )


_A100_EFF = {"fp32": 0.568, "tf32": 0.146, "bf16": 0.192, "fp16": 0.192}
_A100_EFF_SOURCE = (
    f"{DLE_RESNET50}: A100 TF32 938 img/s = 0.146, AMP 2,470 img/s = 0.192 of the peak; "
    "fp32 (no TF32) taken from V100's 0.568"
)
_V100_EFF = {"fp32": 0.568, "fp16": 0.233}
_V100_EFF_SOURCE = f"{DLE_RESNET50}: V100 FP32 367 img/s = 0.568, AMP 1,200 img/s = 0.233 of the peak"
_A100_NODE = {"fp32": 0.972, "tf32": 0.966, "bf16": 0.841, "fp16": 0.841}
_A100_NODE_SOURCE = (
    f"{DLE_RESNET50_NODE}: A100 TF32 7,248 / 8 x 938 = 0.966, AMP 16,621 / 8 x 2,470 = 0.841; "
    "fp32 (no TF32) taken from V100's 0.972"
)
_V100_NODE = {"fp32": 0.972, "fp16": 0.867}
_V100_NODE_SOURCE = f"{DLE_RESNET50_NODE}: V100 FP32 2,855 / 8 x 367 = 0.972, AMP 8,322 / 8 x 1,200 = 0.867"
_ASSUMED = "no published measurement used: assumed equal to {0}'s share for the same kind of unit ({1}); calibrate"

GPUS: dict[str, Device] = {
    "p100": _gpu(
        "p100",
        P100_DS,
        10.6,
        None,
        None,
        21.2,
        16,
        732,
        "nvlink1",
        {"fp32": 0.568, "fp16": 0.233},
        _ASSUMED.format("V100", DLE_RESNET50),
        dict(_V100_NODE),
        _ASSUMED.format("V100", DLE_RESNET50_NODE),
    ),
    "v100": _gpu(
        "v100",
        V100_DS,
        15.7,
        None,
        None,
        125.0,
        16,
        900,
        "nvlink2",
        _V100_EFF,
        _V100_EFF_SOURCE,
        _V100_NODE,
        _V100_NODE_SOURCE,
    ),
    "a100": _gpu(
        "a100",
        A100_DS,
        19.5,
        156.0,
        312.0,
        312.0,
        80,
        2039,
        "nvlink3",
        _A100_EFF,
        _A100_EFF_SOURCE,
        _A100_NODE,
        _A100_NODE_SOURCE,
        _A100_MATRIX,
        _A100_MATRIX_SOURCE,
    ),
    "h100": _gpu(
        "h100",
        H100_DS,
        67.0,
        494.7,
        989.4,
        989.4,
        80,
        3350,
        "nvlink4",
        dict(_A100_EFF),
        _ASSUMED.format("A100", DLE_RESNET50),
        dict(_A100_NODE),
        _ASSUMED.format("A100", DLE_RESNET50_NODE),
        _H100_MATRIX,
        _H100_MATRIX_SOURCE,
    ),
    # The A100 of 40 GB: the 80 GB part's units at its lower memory bandwidth; measured shares assumed the same.
    "a100-40gb": _gpu(
        "a100-40gb",
        A100_40GB_DS,
        19.5,
        156.0,
        312.0,
        312.0,
        40,
        1555,
        "nvlink3",
        dict(_A100_EFF),
        _ASSUMED.format("A100 80GB", DLE_RESNET50),
        dict(_A100_NODE),
        _ASSUMED.format("A100 80GB", DLE_RESNET50_NODE),
        dict(_A100_MATRIX),
        _ASSUMED.format("A100 80GB", LLM_FOUNDRY_MPT),
    ),
    # H100 SXM's units with more, faster memory (HBM3e); no published training measurement of its own is used.
    "h200": _gpu(
        "h200",
        H200_DS,
        67.0,
        494.7,
        989.4,
        989.4,
        141,
        4800,
        "nvlink4",
        dict(_A100_EFF),
        _ASSUMED.format("A100", DLE_RESNET50),
        dict(_A100_NODE),
        _ASSUMED.format("A100", DLE_RESNET50_NODE),
        dict(_H100_MATRIX),
        _ASSUMED.format("H100", LLM_FOUNDRY_MPT),
    ),
    # One GPU per superchip; GPUs of several superchips join over NVLink (GH200 NVL2, NVLink Switch systems).
    "gh200": _gpu(
        "gh200",
        GH200_DS,
        67.0,
        494.7,
        989.4,
        989.4,
        96,
        4000,
        "nvlink4",
        dict(_A100_EFF),
        _ASSUMED.format("A100", DLE_RESNET50),
        dict(_A100_NODE),
        _ASSUMED.format("A100", DLE_RESNET50_NODE),
        dict(_H100_MATRIX),
        _ASSUMED.format("H100", LLM_FOUNDRY_MPT),
    ),
    "l4": _gpu(
        "l4",
        L4_DS,
        30.3,
        60.0,
        121.0,
        121.0,
        24,
        300,
        "pcie4",
        dict(_A100_EFF),
        _ASSUMED.format("A100", DLE_RESNET50),
        dict(_A100_NODE),
        _ASSUMED.format("A100", DLE_RESNET50_NODE),
        dict(_A100_MATRIX),
        _ASSUMED.format("A100", LLM_FOUNDRY_MPT),
    ),
    "t4": _gpu(
        "t4",
        T4_DS,
        8.1,
        None,
        None,
        65.0,
        16,
        320,
        "pcie3",
        {"fp32": 0.568, "fp16": 0.233},
        _ASSUMED.format("V100", DLE_RESNET50),
        dict(_V100_NODE),
        _ASSUMED.format("V100", DLE_RESNET50_NODE),
    ),
}
DEVICE_NAMES = (*GPUS, "cpu")

# What a CPU rank holds besides its model's tensors while it trains: the interpreter, torch, paratrain, the
# process group. Measured here as its peak less the memory block's figures, files' pages left out as the
# peak leaves them (docs/strategies.md, "Memory per rank", with the command): 233-238 MiB on a ddp rank of a
# small model, 237 MiB before a tensor-parallel rank materialised its model (2026-11-29).
CPU_RUNTIME_BYTES = 240 * 2**20
# Without calibration, a CPU rank is assumed to reach this share of its matrix-product peak over a
# whole training step (the CNNs and gpt models measured here spread widely around it: calibrate).
CPU_DEFAULT_EFFICIENCY = 0.3


def get_device(name: str, precision: str = "fp32", cache_dir: Path | None = None) -> Device:
    key = name.lower()
    if key == "cpu":
        return measure_cpu(precision, cache_dir)
    if key not in GPUS:
        raise UsageError(f"unknown device {name!r}; choose from {', '.join(DEVICE_NAMES)}")
    return GPUS[key]


def measure_cpu(precision: str = "fp32", cache_dir: Path | None = None) -> Device:
    """One core of this machine as a device: its peak measured on one thread (in `precision`; CPUs have
    no TF32 and torch no fast fp16 CPU matmul), its share of the host's memory."""
    import psutil

    from paratrain.engine.flops import cpu_copy_bandwidth, cpu_peak
    from paratrain.workloads.datasets import default_cache_dir

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if precision not in ("fp32", "bf16"):
        raise UsageError(f"cpu has no {precision} units; choose --precision from fp32, bf16")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank per core: the peak of one core's thread
    try:
        peak, how = cpu_peak("32" if precision == "fp32" else precision, cache_dir or default_cache_dir())
        bandwidth, bandwidth_how = cpu_copy_bandwidth(cache_dir or default_cache_dir())
    finally:
        torch.set_num_threads(threads)
    total = psutil.virtual_memory().total
    flops: dict[str, float | None] = {"fp32": None, "tf32": None, "bf16": None, "fp16": None}
    flops[precision] = peak
    sources = {
        f"peak_flops.{precision}": how,
        "memory_bytes": f"measured: this host's {total / 2**30:.1f} GiB (psutil) shared by {cores} core(s), one rank "
        "each",
        "memory_bandwidth": bandwidth_how,
        "intra_node_link": "paratrain's shared-memory averaging between CPU ranks of one host "
        "(engine/shm_allreduce.py)",
        "runtime_bytes": "measured here: a rank's interpreter with torch, paratrain and its process group, "
        "docs/strategies.md (Memory per rank)",
        f"efficiency.{precision}": f"default {CPU_DEFAULT_EFFICIENCY}: an assumption; calibrate with --calibrate "
        "RUN_DIRS",
    }
    return Device(
        "cpu",
        flops,
        total / cores,
        bandwidth,
        "shm",
        {precision: CPU_DEFAULT_EFFICIENCY},
        sources=sources,
        overlap=False,
        runtime_bytes=CPU_RUNTIME_BYTES,
    )
