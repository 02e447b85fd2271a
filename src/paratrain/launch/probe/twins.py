"""Copies of the model's own layers, timed under a changed condition: the probe's measured counterfactuals.

At the calibration step the probe notes each leaf layer a training forward calls and what it was called
with (shapes, dtypes and devices: no tensor of the step is kept, so no activation outlives its step), then
times copies of those layers, forward and backward, on fresh inputs of those shapes: at a larger batch (the
small-batch check's slope), on other thread counts (the oversubscription check's slow-down), in float32
(the price of a model run in float64), under autocast to bfloat16 (the price of an autocast that disabled
itself).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

# The larger batch, as a multiple of the script's; the doctor predicts no further than it measured
# (a layer bound by reading its weights at a small batch becomes bound by arithmetic at a large one).
CALIBRATION_FACTOR = 16
# Copies of layers beyond this many bytes of parameters are not made (a large model's layers are timed in
# part: the checks use ratios of the timed layers, which a part estimates as well as the whole).
TWIN_BYTES = 256 * 2**20
# On a GPU the copies take device memory beside the script's: no more than this share of what is free then
# (a model near the device's limit gets its layers timed in part, or none).
GPU_FREE_SHARE = 0.25
# An integer input (token ids, indices) this small is kept as it was, since its values index something;
# floating inputs are drawn afresh.
KEEP_INTEGER_NUMEL = 1 << 20


def input_spec(torch: Any, value: Any) -> Any:
    """What a layer was called with, without keeping its tensors: (shape, dtype, device, requires_grad) for a
    floating tensor, a copy of a small integer tensor, other values as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point() or value.is_complex():
        return ("tensor", tuple(value.shape), value.dtype, value.device, value.requires_grad)
    if value.numel() <= KEEP_INTEGER_NUMEL:
        return value.detach().clone()
    return ("integers", tuple(value.shape), value.dtype, value.device, int(value.max()) + 1)


def thread_penalty(torch: Any, threads: int, fair: int, size: int = 192, repeats: int = 5) -> float:
    """How much slower a matrix product runs on `threads` threads than on `fair` ones, here and now:
    the oversubscription check's measured slow-down (the median of `repeats` rounds of 8 products each,
    about 10 ms in all on a free core)."""
    a = torch.randn(size, size)

    def best(n: int) -> float:
        torch.set_num_threads(n)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(8):
                torch.mm(a, a)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    try:
        best(fair)  # warm-up: first-call allocations
        return best(threads) / best(fair)
    finally:
        torch.set_num_threads(threads)


class LayerTwins:
    """Copies of the model's own leaf layers with the shapes of the inputs they got in one training step,
    timed (forward and backward) under a changed condition. Layers that cannot run alone (keyword inputs,
    sharded parameters, collectives inside) are left out. Randomness is restored after each timing, so the
    script's random stream is unchanged."""

    def __init__(self, torch: Any, layers: list[tuple[Any, tuple[Any, ...]]], batch: int):
        import copy

        self.torch, self.batch, self.twins = torch, batch, []
        self.params: list[set[int]] = []  # per twin: its original layer's parameters (ids)
        copied, budget = 0, copy_budget(torch, layers)
        self.layers = len(layers)
        for layer, specs in layers:
            size = sum(p.numel() * p.element_size() for p in layer.parameters())
            if copied + size > budget or _issues_collectives(layer):
                continue
            try:
                self.twins.append((copy.deepcopy(layer), specs))
                self.params.append({id(p) for p in layer.parameters()})
                copied += size
            except Exception:
                continue
        self.cuda = _cuda_device(torch, self.twins) is not None

    def _inputs(self, specs: tuple[Any, ...], grow: int, dtype: Any) -> tuple[Any, ...]:
        torch, out = self.torch, []
        for s in specs:
            if isinstance(s, tuple) and s and s[0] in ("tensor", "integers"):
                kind, shape, spec_dtype, device = s[:4]
                shape = (shape[0] * grow, *shape[1:]) if shape and shape[0] == self.batch else shape
                if kind == "tensor":
                    value = torch.randn(shape, dtype=dtype or spec_dtype, device=device)
                    # a copy of a leaf, as a layer inside a model gets: in-place layers (ReLU(inplace=True))
                    # cannot write into a leaf that requires grad
                    out.append(value.requires_grad_().clone() if s[4] else value)
                else:
                    out.append(torch.randint(0, max(1, s[4]), shape, dtype=spec_dtype, device=device))
            elif isinstance(s, torch.Tensor) and s.dim() and s.shape[0] == self.batch:
                out.append(torch.cat([s] * grow))
            else:
                out.append(s)
        return tuple(out)

    def _once(self, layer: Any, args: tuple[Any, ...]) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        started = time.perf_counter()
        out = layer(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(out, self.torch.Tensor) and out.requires_grad:
            out.float().sum().backward()
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - started

    def _plain(self, threads: int | None = None) -> contextlib.ExitStack:
        """The layers' own cost: without the modes a script may leave on around its steps (anomaly detection,
        autocast), which the doctor prices as the step's excess over this; on `threads` threads if given."""
        torch, plain = self.torch, contextlib.ExitStack()
        plain.enter_context(torch.autograd.set_detect_anomaly(False))
        plain.enter_context(torch.autocast("cuda" if self.cuda else "cpu", enabled=False))
        before = torch.get_num_threads()
        plain.callback(torch.set_num_threads, before)
        if threads is not None:
            torch.set_num_threads(threads)
        return plain

    def seconds(
        self, grow: int = 1, threads: int | None = None, dtype: Any = None, repeats: int = 3, autocast: Any = None
    ) -> float:
        """Forward and backward of every layer that runs, the batch `grow` times larger, on `threads`
        threads, in `dtype` (layer and inputs), or under autocast to `autocast` on the layers' device: each layer
        warmed up once (a new shape allocates and picks kernels), then the median. Each layer alone pays a
        backward pass of its own, which it shares inside the model (`launch_s`)."""
        import copy

        total, rng = 0.0, self.torch.get_rng_state()
        try:
            with self._plain(threads) as plain:
                if autocast is not None:
                    plain.enter_context(self.torch.autocast("cuda" if self.cuda else "cpu", dtype=autocast))
                for layer, specs in self.twins:
                    try:
                        run = copy.deepcopy(layer).to(dtype) if dtype is not None else layer
                        args = self._inputs(specs, grow, dtype)
                        self._once(run, args)
                        total += statistics.median(self._once(run, args) for _ in range(repeats))
                    except Exception:
                        continue
        finally:
            self.torch.set_rng_state(rng)
        return total

    def launch_s(self, repeats: int = 21) -> float:
        """What each layer timed alone pays that it shares inside the model: a backward pass of its own
        (autograd's engine started and finished, a loss reduced, the clock read), timed on a one-element layer
        that computes nothing, on the layers' device. For many tiny layers this is most of their time alone
        (a 64-wide Linear: 85 us alone, 34 of them this), so the doctor nets it out of `seconds()`."""
        torch = self.torch
        device = next(
            (s[3] for _, specs in self.twins for s in specs if isinstance(s, tuple) and s and s[0] == "tensor"),
            torch.device("cpu"),
        )
        with self._plain():
            leaf = torch.ones(1, device=device, requires_grad=True)
            times = [self._once(lambda x: x * 1.0, (leaf,)) for _ in range(repeats + 1)][1:]
        return statistics.median(times)

    def needless_backward_s(self, needless: set[int], repeats: int = 3) -> float | None:
        """Backward of the layers whose parameters all get gradients nobody uses (`Facts.needless_gradients`):
        each such layer forward and backward, less forward alone and less the backward pass of its own it pays
        alone. What freezing them could save at most (a frozen backbone before every trainable layer needs no
        backward at all; one between them still passes gradients through). None when no such layer ran alone."""
        torch, total, timed, rng = self.torch, 0.0, 0, self.torch.get_rng_state()
        launch = self.launch_s()
        try:
            with self._plain():
                for (layer, specs), params in zip(self.twins, self.params):
                    if not params or not params <= needless:
                        continue
                    try:
                        args = self._inputs(specs, 1, None)
                        self._once(layer, args)
                        both = statistics.median(self._once(layer, args) for _ in range(repeats))
                        with torch.no_grad():
                            alone = statistics.median(self._once(layer, args) for _ in range(repeats))
                    except Exception:
                        continue
                    total += max(0.0, both - alone - launch)
                    timed += 1
        finally:
            torch.set_rng_state(rng)
        return total if timed else None

    def batch_slope(self, factor: int = CALIBRATION_FACTOR) -> float | None:
        """Seconds of forward and backward per extra sample, between the script's batch and `factor`
        times it. A step's fixed costs (per-call dispatch, the optimizer, the all-reduce) stay; this is
        what grows. None when no layer could be timed."""
        small, large = self.seconds(), self.seconds(grow=factor)
        return None if large <= 0 else max(0.0, (large - small) / ((factor - 1) * self.batch))

    def thread_penalty(self, threads: int, fair: int) -> float | None:
        """How much slower the layers run on `threads` threads than on `fair`."""
        slow, fast = self.seconds(threads=threads), self.seconds(threads=fair)
        return None if fast <= 0 else slow / fast

    def autocast_penalty(self, dtype: Any) -> float | None:
        """How much slower the layers run as they are than under autocast to `dtype` (bfloat16 for a script whose
        autocast disabled itself): above 1 where the device multiplies faster in `dtype`."""
        now, then = self.seconds(), self.seconds(autocast=dtype)
        return None if then <= 0 else now / then

    def dtype_penalty(self, dtype: Any) -> float | None:
        """How much slower the layers run as they are than in `dtype` (float32 for a float64 model)."""
        now, then = self.seconds(), self.seconds(dtype=dtype)
        return None if then <= 0 else now / then


def _cuda_device(torch: Any, layers: list[tuple[Any, tuple[Any, ...]]]) -> Any:
    """The CUDA device the layers' inputs were on, if any."""
    for _, specs in layers:
        for s in specs:
            if isinstance(s, tuple) and s and s[0] in ("tensor", "integers") and s[3].type == "cuda":
                return s[3]
            if isinstance(s, torch.Tensor) and s.is_cuda:
                return s.device
    return None


def copy_budget(torch: Any, layers: list[tuple[Any, tuple[Any, ...]]]) -> int:
    """Bytes of layer copies the calibration may make: TWIN_BYTES, and on a GPU no more than GPU_FREE_SHARE of the
    device memory free now (torch.cuda.mem_get_info: the driver's count, the script's cached blocks included)."""
    device = _cuda_device(torch, layers)
    if device is None:
        return TWIN_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return min(TWIN_BYTES, int(free * GPU_FREE_SHARE))


def _issues_collectives(layer: Any) -> bool:
    """A layer that synchronises across ranks in its forward (nn.SyncBatchNorm, or a user's own) must not be
    run alone: the other ranks would not join its collective. Its class is known, or its source calls one."""
    import inspect

    if type(layer).__name__ == "SyncBatchNorm":
        return True
    try:
        source = inspect.getsource(type(layer).forward)
    except (OSError, TypeError):
        return False
    return any(word in source for word in ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier"))
