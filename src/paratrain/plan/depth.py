"""Measuring a deep model through shallow copies of it.

A transformer is an embedding, a stack of N alike blocks and a head, and every number profile.py
measures on the meta device (FLOPs, the peak of the tensors saved for backward, the collectives
tensor parallelism issues) is a line in N: what lies outside the stack, plus N times a block's share.
With every p-th block checkpointed the share repeats every p blocks, so the line is drawn through
depths that leave the same remainder mod p as N. Running all N blocks is what made a plan slow: a
70B-shaped model's 80 blocks took 20 s a measurement (its FLOP count and two saved-tensor passes),
and `plan --search` measures a model a dozen times.

So each measurement runs on copies of the model with its stack cut to three depths (d, d+p, d+2p),
and the line through the first two gives N. The third checks the line: a model whose blocks are
not alike in cost (attention that alternates between kinds, a forward that indexes its blocks by a
stored count) gives three points off one line, or fails on the cut copy, and is then measured whole,
as before. Stacks too short to gain are measured whole.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

MIN_STACK = 2  # a container of fewer alike items is not a stack
CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)  # what holds a stack of blocks


@dataclass(frozen=True)
class Stack:
    """The model's repeated blocks: an nn.ModuleList, nn.ModuleDict or nn.Sequential of structurally identical
    items."""

    path: str  # the container's path in the model ("layers", "model.decoder.layers")
    items: tuple[str, ...]  # its children's names, in order ("0", "1", ...)

    def item_of(self, module_path: str) -> str | None:
        """The stack item a module path lies in ("layers.7.attention" -> "7"), or None outside the stack."""
        prefix = self.path + "."
        if not module_path.startswith(prefix):
            return None
        item = module_path[len(prefix) :].split(".", 1)[0]
        return item if item in self.items else None

    def as_first(self, module_path: str) -> str:
        """The same path in the stack's first item ("layers.7.attention" -> "layers.0.attention")."""
        item = self.item_of(module_path)
        if item is None:
            return module_path
        rest = module_path[len(self.path) + 1 + len(item) :]
        return f"{self.path}.{self.items[0]}{rest}"


def find_stack(model: nn.Module) -> Stack | None:
    """The container of alike blocks holding the most parameters, if the model has one."""
    best: tuple[int, Stack] | None = None
    for path, module in model.named_modules():
        if not path or not isinstance(module, CONTAINERS) or len(module) < MIN_STACK:
            continue
        if len({_signature(item) for item in module._modules.values()}) != 1:
            continue
        weight = sum(p.numel() for p in module.parameters())
        if best is None or weight > best[0]:
            best = (weight, Stack(path, tuple(module._modules)))
    return best[1] if best else None


def _signature(module: nn.Module) -> tuple:
    """What makes two blocks alike: the same classes at the same paths, and tensors of the same shapes."""
    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    return (
        tuple((name, type(m)) for name, m in module.named_modules()),
        tuple((name, tuple(t.shape), t.dtype) for name, t in tensors),
    )


def depths(length: int, period: int) -> tuple[int, int, int] | None:
    """Three depths on N's line (N mod period alike), or None where measuring them costs as much as N."""
    first = period + length % period
    chosen = (first, first + period, first + 2 * period)
    return chosen if sum(chosen) < length else None


def shallow_copy(model: nn.Module, stack: Stack, depth: int) -> nn.Module:
    """A deep copy of the model with only the stack's first `depth` blocks (the model itself is left whole)."""
    parent_path, _, name = stack.path.rpartition(".")
    parent = model.get_submodule(parent_path)
    container = parent.get_submodule(name)
    cut = (
        type(container)(dict(itertools.islice(container.items(), depth)))
        if isinstance(container, nn.ModuleDict)
        else container[:depth]
    )
    setattr(parent, name, cut)
    try:
        return copy.deepcopy(model)
    finally:
        setattr(parent, name, container)


def fold_stack(counts: dict[str, int], stack: Stack, name_of: Callable[[str], str | None]) -> dict[str, int] | None:
    """Counts by module path with the stack's items folded into its first one, or None where the items
    differ (then the blocks are not alike in cost). `name_of` gives a count's module path (None: not a module)."""
    folded: dict[str, int] = {}
    for key, value in counts.items():
        path = name_of(key)
        if path is not None and stack.item_of(path) is not None:
            key = key[: len(key) - len(path)] + stack.as_first(path)
            if folded.setdefault(key, value) != value:
                return None
        else:
            folded[key] = value
    return folded


def unfold_stack(folded: dict[str, int], stack: Stack, name_of: Callable[[str], str | None]) -> dict[str, int]:
    """fold_stack undone for the whole stack: the first item's counts given to every item."""
    counts: dict[str, int] = {}
    for key, value in folded.items():
        path = name_of(key)
        if path is not None and stack.item_of(path) == stack.items[0]:
            head, rest = key[: len(key) - len(path)], path[len(stack.path) + 1 + len(stack.items[0]) :]
            counts.update({f"{head}{stack.path}.{item}{rest}": value for item in stack.items})
        else:
            counts[key] = value
    return counts


def line_to(readings: list[dict[str, Any]], chosen: tuple[int, int, int], length: int) -> dict[str, Any] | None:
    """Each number at depth `length` from its readings at the three depths: drawn through the first two,
    checked against the third (exactly: byte and FLOP counts are integers). None when they are off one line."""
    first, second, third = readings
    if not (first.keys() == second.keys() == third.keys()):
        return None
    periods = (length - chosen[0]) // (chosen[1] - chosen[0])
    result = {}
    for key, value in first.items():
        step = second[key] - value
        if third[key] - second[key] != step:
            return None
        result[key] = value + periods * step
    return result


def measure_deep(
    model: nn.Module,
    period: int,
    measure: Callable[[nn.Module], dict[str, Any]],
    fold: Callable[[dict[str, Any], Stack], dict[str, Any] | None] = lambda reading, _: reading,
) -> tuple[dict[str, Any], Stack | None]:
    """`measure` of the model as it is, from shallow copies where the model has a stack of alike blocks.

    `measure` gets a model it may change (a copy) and returns numbers by name; `fold` turns a shallow
    copy's reading into numbers that do not name its blocks one by one (None: the blocks differ).
    Returns the numbers, and the stack they were drawn along (None: the model was measured whole,
    and its reading is not folded)."""
    stack = find_stack(model)
    chosen = depths(len(stack.items), period) if stack else None
    if stack is not None and chosen is not None:
        try:
            readings = [fold(measure(shallow_copy(model, stack, depth)), stack) for depth in chosen]
        except Exception:  # a forward that needs all its blocks: measured whole below, where errors are reported
            readings = []
        drawn = line_to(readings, chosen, len(stack.items)) if readings and None not in readings else None
        if drawn is not None:
            return drawn, stack
    return measure(copy.deepcopy(model)), None
