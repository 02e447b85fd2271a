"""Model FLOPs and model FLOPs utilisation (MFU).

MFU (Chowdhery et al. 2022, PaLM, appendix B; nanoGPT's `estimate_mfu`) = the model FLOPs a run
achieved per second over the peak FLOP/s of the devices it used. "Model FLOPs" are those of one
forward and one backward pass, not what the hardware executed: activation recomputation does not
count, and neither do elementwise ops.

- FLOPs per sample: counted once per run by `torch.utils.flop_counter.FlopCounterMode` over the
  forward, loss and backward of one sample, on the *meta* device: shapes only, no arithmetic and
  no memory, so counting a 700 M-parameter model costs a second. A grouped convolution's backward
  is counted by paratrain's own formula (`flop_counter`): torch 2.13's counts it `groups` times over. On
  meta, attention runs as its
  math (two batched matmuls a head); the causal mask is not discounted, as in PaLM's formula.
- Peak of a GPU: the dense (no sparsity) figure of its data sheet for the math the run uses, from
  `GPU_PEAK_TFLOPS`, matched on whole words of torch.cuda.get_device_name() ("L4" is not "L40").
  bf16 and fp16 runs: the tensor-core figure. fp32 runs: convolutions run in TF32 on tensor cores
  when `torch.backends.cudnn.allow_tf32` (true by default) and matrix products when
  `torch.backends.cuda.matmul.allow_tf32` (false by default; `torch.set_float32_matmul_precision`
  "high" or "medium" sets it), each on the fp32 units otherwise. The peak is then the rate at
  which the run's own mix of FLOPs would run: FLOPs / (convolution FLOPs / convolution peak +
  other FLOPs / matmul peak). Unknown devices get no MFU rather than a guess.
- Peak of a CPU rank: measured on this machine with a square matrix product in the run's dtype,
  on the rank's threads and cores (the faster of torch.mm and F.linear, best of several timings),
  cached per CPU model, thread count, dtype and torch version in the cache directory (delete
  `cpu-peak.json` there to measure again).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from paratrain.workloads.objective import Inputs
from paratrain.workloads.samples import map_inputs

log = logging.getLogger("paratrain.rank")

# Data-sheet peaks in TFLOP/s, dense: (fp32, tf32, bf16, fp16); None where the GPU has no such unit.
# A pattern's words must all be words of torch.cuda.get_device_name() (lower-cased); the first
# matching row wins, so a variant comes before its family.
GPU_PEAK_TFLOPS: list[tuple[str, tuple[float | None, float | None, float | None, float | None], str]] = [
    ("h100 pcie", (51.0, 378.0, 756.0, 756.0), "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    # NVL: the sheet prints 835 TF32 and 1,671 bf16/fp16 TFLOP/s with sparsity, half that dense.
    ("h100 nvl", (60.0, 417.5, 835.5, 835.5), "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL)"),
    ("h100", (67.0, 494.7, 989.4, 989.4), "NVIDIA H100 Tensor Core GPU datasheet (SXM)"),
    ("h200 nvl", (60.0, 417.5, 835.5, 835.5), "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL)"),
    ("h200", (67.0, 494.7, 989.4, 989.4), "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    ("gh200", (67.0, 494.7, 989.4, 989.4), "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    ("a100", (19.5, 156.0, 312.0, 312.0), "NVIDIA A100 Tensor Core GPU datasheet"),
    ("v100 pcie", (14.0, None, None, 112.0), "NVIDIA V100 Tensor Core GPU datasheet (PCIe)"),
    ("v100", (15.7, None, None, 125.0), "NVIDIA V100 Tensor Core GPU datasheet (SXM2)"),
    ("l40s", (91.6, 183.0, 362.05, 362.05), "NVIDIA L40S datasheet"),
    ("l40", (90.5, 90.5, 181.0, 181.0), "NVIDIA L40 datasheet"),
    ("l4", (30.3, 60.0, 121.0, 121.0), "NVIDIA L4 Tensor Core GPU datasheet"),
    # AWS's A10G is a variant with its own clocks and no NVIDIA data sheet: no peak rather than A10's.
    ("a10g", (None, None, None, None), "no published data sheet"),
    ("a10", (31.2, 62.5, 125.0, 125.0), "NVIDIA A10 Tensor Core GPU datasheet"),
    ("rtx 4090", (82.6, 82.6, 165.2, 165.2), "NVIDIA Ada GPU architecture whitepaper (RTX 4090, FP32 accumulate)"),
    ("t4", (8.1, None, None, 65.0), "NVIDIA T4 Tensor Core GPU datasheet"),
]
DTYPES = {"32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_PEAK_FILE = "cpu-peak.json"


def _conv_backward_flops(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: list[bool],
    **_: Any,
) -> int:
    """A convolution's backward: its input gradient and its weight gradient each cost what the
    forward did. torch 2.13's own formula counts the weight gradient of a grouped convolution as if
    it had one group, `groups` times too many FLOPs (ResNeXt-101 32x4d's backward came out at 3.8x
    its forward instead of 2x); pytorch/pytorch#183405 (May 2026) divides it by the groups."""
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, with the convolution backward counted right for grouped convolutions."""
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops})


class FlopCount(NamedTuple):
    """FLOPs of one sample: all of them, and those of convolutions (which TF32 speeds up separately)."""

    total: int
    convolution: int


def count_flops_per_sample(
    module: nn.Module,
    objective: Callable[[Callable[..., Any], torch.Tensor, torch.Tensor], tuple[torch.Tensor, Any]],
    x: torch.Tensor,
    y: torch.Tensor,
) -> int | None:
    """FLOPs of forward + loss + backward for one sample; see `count_flops`."""
    count = count_flops(module, objective, x, y)
    return count.total if count is not None else None


def count_flops(
    module: nn.Module,
    objective: Callable[[Callable[..., Any], Inputs, torch.Tensor], tuple[torch.Tensor, Any]],
    x: Inputs,
    y: torch.Tensor,
) -> FlopCount | None:
    """FLOPs of forward + loss + backward for one sample (x, y have a batch dimension of 1).

    `objective(model, x, y)` returns (loss, output). Runs on meta copies of the parameters: the module's own
    tensors, gradients and buffers are left untouched. None if the model cannot run on meta
    (e.g. it reads tensor values in Python).
    """
    meta = {
        name: torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)
        for name, t in (*module.named_parameters(), *module.named_buffers())
    }

    def call(*args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(module, meta, args, kwargs)

    counter = flop_counter()
    try:
        with counter:
            objective(call, map_inputs(lambda t: t.to("meta"), x), y.to("meta"))[0].backward()
    except Exception as exc:  # a user model that needs real values: no FLOPs, no MFU
        log.warning("cannot count FLOPs on the meta device (%s: %s); no MFU for this run", type(exc).__name__, exc)
        return None
    return FlopCount(int(counter.get_total_flops()), convolution_flops(counter))


def convolution_flops(counter: FlopCounterMode) -> int:
    """Of what `counter` counted, the convolutions' FLOPs (forward and backward)."""
    by_op = counter.get_flop_counts().get("Global", {})
    return int(sum(n for op, n in by_op.items() if "convolution" in str(op)))


def gpu_peak(device_name: str, precision: str, convolution_share: float = 0.0) -> tuple[float, str] | None:
    """(peak FLOP/s, source) of one GPU for the run's precision, or None if the table lacks it.
    `convolution_share`: the convolutions' share of the run's FLOPs (fp32 runs: TF32 may apply to
    them and to matrix products separately; see the module docstring)."""
    words = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    for pattern, (fp32, tf32, bf16, fp16), source in GPU_PEAK_TFLOPS:
        if not set(pattern.split()) <= words:
            continue
        if precision != "32":
            tflops = bf16 if precision == "bf16" else fp16
            return (
                (tflops * 1e12, f"{source}: {tflops:g} TFLOP/s {precision} tensor core, dense, for {device_name!r}")
                if tflops is not None
                else None
            )
        if fp32 is None:
            return None
        conv_tf32 = torch.backends.cudnn.allow_tf32 and tf32 is not None
        matmul_tf32 = torch.backends.cuda.matmul.allow_tf32 and tf32 is not None
        conv, matmul = (tf32 if conv_tf32 else fp32), (tf32 if matmul_tf32 else fp32)
        tflops = 1 / (convolution_share / conv + (1 - convolution_share) / matmul)
        return tflops * 1e12, (
            f"{source}: {tflops:.4g} TFLOP/s for {device_name!r} at this run's fp32 math: convolutions "
            f"({convolution_share:.0%} of the FLOPs) {conv:g} ({'TF32' if conv_tf32 else 'fp32'}), "
            f"the rest {matmul:g} ({'TF32' if matmul_tf32 else 'fp32'})"
        )
    return None


def cpu_peak(precision: str, cache_dir: Path, size: int = 1024, seconds: float = 0.5) -> tuple[float, str]:
    """(peak FLOP/s, method) of this process's CPU threads, measured once and cached."""
    threads = torch.get_num_threads()

    def measure() -> tuple[float, str]:
        dtype = DTYPES[precision]
        a = torch.randn(size, size, device="cpu").to(dtype)
        b = torch.randn(size, size, device="cpu").to(dtype)
        # Both products: on CPUs without native bf16 matmul, F.linear (x·Wᵀ, what nn.Linear runs)
        # takes a much faster kernel than torch.mm, and a peak below what the model reaches is no peak.
        # A product that is several times slower on a small probe is not timed at full size: bf16
        # torch.mm took 3-8 s per 1024² product here, which made the first bf16 run wait a minute.
        probe = {
            product: _time_once(product, a[:128, :128].contiguous(), b[:128, :128].contiguous())
            for product in (F.linear, torch.mm)
        }
        fastest = min(probe.values())
        best = float("inf")
        for product in (p for p in probe if probe[p] <= 4 * fastest):
            for _ in range(2):
                product(a, b)
            deadline, repeats = time.perf_counter() + seconds / 2, 0
            while time.perf_counter() < deadline or repeats < 3:
                start = time.perf_counter()
                product(a, b)
                best = min(best, time.perf_counter() - start)
                repeats += 1
        return 2 * size**3 / best, (
            f"measured: {size}x{size} {dtype} matrix product (the faster of torch.mm and F.linear, best of at least 3 "
            f"repeats over {seconds} s), {threads} thread(s), {cpu_model()}, torch {torch.__version__}"
        )

    return _measured_once(cache_dir, f"{cpu_model()}|threads={threads}|{precision}|torch {torch.__version__}", measure)


def cpu_copy_bandwidth(cache_dir: Path, mib: int = 64) -> tuple[float, str]:
    """(bytes/s, method) one thread moves copying a tensor larger than its caches (read and write
    counted) on this process's threads, measured once and cached: a plan made twice must not differ
    by a noisy copy."""
    threads = torch.get_num_threads()

    def measure() -> tuple[float, str]:
        src = torch.ones(mib * 2**20 // 4)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
        return 2 * mib * 2**20 / best, (
            f"measured: a {mib} MiB float32 tensor copied, {threads} thread(s), best of 5, {cpu_model()}"
        )

    return _measured_once(
        cache_dir, f"{cpu_model()}|threads={threads}|copy {mib} MiB|torch {torch.__version__}", measure
    )


def _measured_once(cache_dir: Path, key: str, measure: Callable[[], tuple[float, str]]) -> tuple[float, str]:
    """(value, how it was measured) from CPU_PEAK_FILE under `key`, or measured now and added to it
    (an entry of an older paratrain, without `value`, is measured again)."""
    path = Path(cache_dir) / CPU_PEAK_FILE
    entry = _read_json(path).get(key, {})
    if "value" in entry:
        return entry["value"], entry["source"]
    value, source = measure()
    cached = _read_json(path)  # again: another process may have added its own entry meanwhile
    cached[key] = {"value": value, "source": source, "measured_unix_time": time.time()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cached, indent=2) + "\n")
    os.replace(tmp, path)
    return value, source


def _time_once(product: Any, a: torch.Tensor, b: torch.Tensor) -> float:
    product(a, b)  # warm-up: the first call picks and primes the kernel
    start = time.perf_counter()
    product(a, b)
    return time.perf_counter() - start


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def mfu(
    flops_per_sample: int | None, samples_per_s: float, peak_per_device: float | None, devices: int
) -> float | None:
    """Achieved model FLOP/s over the peak of all devices used."""
    if not flops_per_sample or not peak_per_device:
        return None
    return flops_per_sample * samples_per_s / (peak_per_device * devices)
