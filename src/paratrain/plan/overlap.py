"""Communication that compute does not hide, unit by unit, on a device that communicates beside its compute
(GPUs: NCCL runs on its own streams). Issue #59: priced as one lump against the step's compute (the
communication less the compute, at least two units), FSDP's gathers came out hidden at one or two samples a
device, where a unit's forward is far shorter than its gather and published runs stopped getting faster.

Each step is walked as it runs, with the link taking one collective at a time in the order they are issued:

- FSDP2 (`fully_shard`; torchtitan's wrapping, engine/strategies/fsdp.py): the root (what no unit holds:
  embeddings, head, final norm) is gathered first, with nothing to hide it, and kept until its backward (FSDP2
  does not reshard the root after forward). Each unit's gather is issued when the unit before it starts its
  forward (one unit ahead: the host runs ahead of the device, and FSDP2 keeps one gather in flight); the unit
  waits for its gather. The root's own compute (the head and the loss; an embedding lookup computes next to
  nothing) runs after the units. Backward runs the root first, then the units in reverse: with resharding each
  unit's gather again, issued when the unit after it starts its backward (FSDP2's backward prefetch); each
  unit's reduce-scatter (and HSDP's all-reduce of the shard across replicas) is issued when its backward ends;
  the root's at the very end, after the embedding's gradients. The optimizer waits for the last of them.
  Activation checkpointing's recompute runs inside each unit's backward, which it lengthens; it gathers
  nothing more (the unit's parameters are gathered for its backward already).
- DDP: the gradients fill buckets of 25 MiB (the first 1 MiB) from the last layers to the first, in
  proportion as backward runs; each bucket's all-reduce is issued when it fills.

What lies beyond the compute's end is the exposed part: the first gather, every unit whose collectives take
longer than the compute beside them, and the last reduce-scatters. It grows as the per-device batch shrinks,
since the compute shrinks with it and the collectives do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DDP_BUCKET_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class ShardedUnit:
    """One FSDP unit's collectives and compute in a step, in seconds."""

    gather_s: float  # one all-gather of its parameters
    scatter_s: float  # its gradients' reduce-scatter (with HSDP, then their all-reduce across replicas)
    forward_s: float
    backward_s: float


class _Link:
    """One collective at a time, in the order issued."""

    def __init__(self) -> None:
        self.free = 0.0

    def send(self, issued: float, seconds: float, count: int = 1, interval: float = 0.0) -> float:
        """Run `count` collectives of `seconds` each, the first issued at `issued` and the rest `interval` apart;
        returns when the last ends. Each ends at max(the one before's end, its issue) + seconds: unrolled, the
        last ends at the latest of the link's free time + count x seconds, the first issue + count x seconds
        and the last issue + seconds (the terms between are linear in the index, so an end is the largest)."""
        if count <= 0:
            return self.free
        last = issued + (count - 1) * interval
        self.free = max(self.free + count * seconds, issued + count * seconds, last + seconds)
        return self.free


def fsdp_exposed_s(root: ShardedUnit, units: list[ShardedUnit], reshard_after_forward: bool) -> float:
    """Seconds of a step's forward and backward beyond their compute: the collectives left exposed (module
    docstring). `units` in forward order; `root` holds the rest of the model."""
    link = _Link()
    ready = link.send(0.0, root.gather_s)
    now = ready
    previous_start = 0.0
    for unit in units:
        ready = link.send(previous_start, unit.gather_s)
        previous_start = max(now, ready)
        now = previous_start + unit.forward_s
    now += root.forward_s
    backward = units[::-1]
    if reshard_after_forward and backward:
        ready = link.send(now, backward[0].gather_s)
    now += root.backward_s
    for i, unit in enumerate(backward):
        start = max(now, ready) if reshard_after_forward else now
        if reshard_after_forward and i + 1 < len(backward):
            ready = link.send(start, backward[i + 1].gather_s)
        now = start + unit.backward_s
        link.send(now, unit.scatter_s)
    end = max(now, link.send(now, root.scatter_s))
    compute = root.forward_s + root.backward_s + sum(u.forward_s + u.backward_s for u in units)
    return end - compute


def ddp_exposed_s(gradient_bytes: float, allreduce_s: Callable[[float], float], backward_s: float) -> float:
    """Seconds after backward ends until DDP's last bucket is all-reduced: its buckets (1 MiB first, then 25 MiB
    each, the last what remains) each all-reduced (`allreduce_s` of its bytes) when backward has produced its
    bytes, the gradients appearing in proportion as backward runs."""
    if gradient_bytes <= 0:
        return 0.0
    link, rate = _Link(), backward_s / gradient_bytes
    first, full, rest = _buckets(gradient_bytes)
    end = link.send(first * rate, allreduce_s(first))
    if full:
        end = link.send((first + DDP_BUCKET_BYTES) * rate, allreduce_s(DDP_BUCKET_BYTES), full, DDP_BUCKET_BYTES * rate)
    if rest:
        end = link.send(gradient_bytes * rate, allreduce_s(rest))
    return max(end - backward_s, 0.0)


def ddp_comm_s(gradient_bytes: float, allreduce_s: Callable[[float], float]) -> float:
    """Seconds of all DDP's bucket all-reduces in a step, each one paying its own latency."""
    if gradient_bytes <= 0:
        return 0.0
    first, full, rest = _buckets(gradient_bytes)
    return allreduce_s(first) + full * allreduce_s(DDP_BUCKET_BYTES) + (allreduce_s(rest) if rest else 0.0)


def _buckets(gradient_bytes: float) -> tuple[float, int, float]:
    """DDP's buckets: the first (1 MiB at most), how many full 25 MiB ones follow, and the last's remainder."""
    first = min(DDP_FIRST_BUCKET_BYTES, gradient_bytes)
    full, rest = divmod(gradient_bytes - first, DDP_BUCKET_BYTES)
    return first, int(full), rest
