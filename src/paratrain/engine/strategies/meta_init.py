"""Models built on the meta device and materialised only where a rank holds them (torchtitan's idiom).

A rank that holds a part of the model (fsdp's shards, tensor parallelism's slices, a pipeline's stages, any of
them combined) builds it on the meta device (shapes, no memory), cuts, splits and shards it there, then
`FullSizeCopies.materialise` gives each parameter and buffer it holds storage on the rank's device and its initial
value. Each module's own `reset_parameters` (FSDP's
default initialisation of meta modules) runs on a full-size copy of that one module in host memory, taken before
the model was split, drawing from the seeded CPU generator in module order as the model's constructor did; the
rank keeps its part of it (`distribute_tensor(..., src_data_rank=None)` slices locally, no communication). For a
model whose constructor initialises its layers that way (the CNNs and MLPs of PyTorch's tutorials, most small
models), the weights equal those of the ordinary build for the same seed, whatever the layout. No rank ever holds
more than its part and one module's full copy.

A model that creates parameters or buffers no `reset_parameters` initialises cannot be materialised this way: it
is built whole on the host before it is split, and the rank log says so in one line. So is a model whose
constructor writes its layers again after their own `reset_parameters` (nanoGPT's `self.apply(self._init_weights)`):
materialised, it would silently start from the layers' defaults. `Writes` counts the writes the construction makes
on meta, against those of each module's `reset_parameters` alone. So is a model with an
initialisation of its own over the whole model (`init_weights()`, torchtitan's name) where the layout must start
from one process's weights (tensor parallelism): run piecewise on a CPU mesh it would draw other values.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from weakref import WeakKeyDictionary

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

log = logging.getLogger("paratrain.rank")


def resets(module: nn.Module) -> bool:
    return callable(getattr(module, "reset_parameters", None))


def on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


class Writes(TorchDispatchMode):
    """How many times each tensor was written in place (uniform_, normal_, fill_, zero_, copy_, ...) while it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.count: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor):
            self.count[args[0]] = self.count.get(args[0], 0) + 1
        return func(*args, **(kwargs or {}))


def own_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]


def uninitialisable(model: nn.Module, built: Writes, piecewise_init: bool = True) -> str | None:
    """Why a model built on the meta device cannot be initialised after splitting, or None if it can: every
    module that holds parameters or buffers of its own must reset them, all of them must be on meta (a factory may
    place some tensors on a device itself), unless `piecewise_init` no init_weights() over the whole model, and
    (`built`: the writes its construction made) no tensor written more times by the construction than by its
    module's reset_parameters(): a model that initialises its layers itself after building them (nanoGPT's
    `self.apply(self._init_weights)`) would otherwise start from the layers' defaults. With `piecewise_init`, an
    init_weights() runs on the parts after they are materialised (fsdp), so the writes it made are allowed."""
    if not all(t.is_meta for t in (*model.parameters(), *model.buffers())):
        return "the model factory put some of its tensors on a real device under torch.device('meta')"
    init_weights = callable(getattr(model, "init_weights", None))
    if not piecewise_init and init_weights:
        return (
            f"its init_weights() ({type(model).__name__}) initialises the whole model at once, which split across "
            "ranks would draw other values than one process"
        )
    for name, module in model.named_modules():
        if own_tensors(module) and not resets(module):
            return (
                f"{name or 'the model'} ({type(module).__name__}) holds parameters or buffers and has no "
                "reset_parameters() to initialise them after splitting"
            )
        if own_tensors(module) and not init_weights:
            alone = copy.deepcopy(module)
            with Writes() as reset:
                alone.reset_parameters()
            resets_of = {n: reset.count.get(t, 0) for n, t in own_tensors(alone)}
            extra = [n for n, t in own_tensors(module) if built.count.get(t, 0) > resets_of[n]]
            if extra:
                return (
                    f"its constructor writes {name + '.' if name else ''}{extra[0]} after {type(module).__name__}'s "
                    "own reset_parameters() (an initialisation of its own), which the parts cannot repeat"
                )
    return None


def build_on_meta(
    make: Callable[[], nn.Module], whole: Callable[[Callable[[], nn.Module]], nn.Module], piecewise_init: bool = True
) -> nn.Module:
    """The model on the meta device, or built by `whole` (on the host, then the rank's device) where it could not
    be initialised after splitting (`uninitialisable`), with the reason in the rank log."""
    created: list[tuple[nn.Parameter, nn.Module, str]] = []  # every registration, in order (held: ids stay unique)

    def registered(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None:
            created.append((param, module, name))

    hook = register_module_parameter_registration_hook(registered)
    try:
        with torch.device("meta"), Writes() as built:
            model = make()
    finally:
        hook.remove()
    paths = {id(m): path for path, m in model.named_modules(remove_duplicate=False)}
    first_names: dict[int, str] = {}
    for param, module, name in created:
        if id(module) in paths:
            first_names.setdefault(id(param), f"{paths[id(module)]}.{name}" if paths[id(module)] else name)
    CREATED_AS[model] = first_names
    missing = uninitialisable(model, built, piecewise_init)
    if missing is None:
        return model
    log.warning("building the whole model on every rank before splitting it: %s", missing)
    return whole(make)


# A model built on meta -> the name each parameter was first registered under, by the tensor's id (build_on_meta).
CREATED_AS: WeakKeyDictionary = WeakKeyDictionary()


class FullSizeCopies:
    """Full-size meta copies of a meta model's modules that initialise themselves, by their names in the model,
    taken before it is split, sharded or cut into stages (after, their parameters would be parts); none for a
    model built whole.

    A tensor the model holds under several names (a tied embedding and output projection) gets the values the
    module that created it draws, on every rank holding any of its names, so that copies of it on different
    pipeline stages start equal: the ordinary build's value whichever way the tie was written
    (`head.weight = embed.weight`, or nanoGPT's `wte.weight = lm_head.weight`). `build_on_meta` records which
    module registered each parameter first; without that record, the first name's module draws."""

    def __init__(self, model: nn.Module | None = None):
        self.pending = model is not None and on_meta(model)
        self.copies = [(n, copy.deepcopy(m)) for n, m in model.named_modules() if resets(m)] if self.pending else []
        # every name of each tensor, under its first name, for the tensors held under several
        self.aliases: dict[str, list[str]] = {}
        if self.pending:
            first: dict[int, str] = dict(CREATED_AS.get(model, {}))
            for name, tensor in (
                *model.named_parameters(remove_duplicate=False),
                *model.named_buffers(remove_duplicate=False),
            ):
                self.aliases.setdefault(first.setdefault(id(tensor), name), []).append(name)

    @torch.no_grad()
    def materialise(self, model: nn.Module | list[nn.Module], device: torch.device, seed: int) -> bool:
        """Storage for this rank's parts on `device`, then their initial values (module docstring): of the model,
        or of each of this rank's pipeline stages, which hold their modules under the model's names. False, and
        nothing done, for a model that was built whole."""
        if not self.pending:
            return False
        self.pending = False
        parts = model if isinstance(model, list) else [model]
        for part in parts:
            part.to_empty(device=device)
        torch.manual_seed(seed)  # as build_model seeded the ordinary construction
        while self.copies:
            # One module's full-size copy at a time, every module's in the model's order, held here or not: each
            # draws from the generator as the constructor did. Dropped as soon as this rank's parts are taken.
            prefix, full_copy = self.copies.pop(0)
            full_copy.to_empty(device="cpu")
            full_copy.reset_parameters()
            for name, full in [*full_copy.named_parameters(recurse=False), *full_copy.named_buffers(recurse=False)]:
                for alias in self.aliases.get(f"{prefix}.{name}" if prefix else name, []):
                    for part in parts:
                        mine = _held(part, alias)
                        if isinstance(mine, DTensor):
                            placed = distribute_tensor(full, mine.device_mesh, mine.placements, src_data_rank=None)
                            mine.copy_(placed)
                        elif mine is not None:
                            mine.copy_(full)
        return True


def _held(part: nn.Module, name: str) -> torch.Tensor | None:
    """The tensor `part` holds under the model's name `name`, or None where it holds no such module or tensor."""
    path, _, attr = name.rpartition(".")
    try:
        module = part.get_submodule(path)
    except AttributeError:
        return None
    return getattr(module, attr, None) if attr in (*module._parameters, *module._buffers) else None
