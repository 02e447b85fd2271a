"""Cutting a model into pipeline stages: the units it is made of, where the cuts go, and stage
modules that keep the whole model's parameter names.

The split rule (docs/strategies.md, "The split"): a model is a chain of units, each applied to the
previous one's output, and a stage is a run of consecutive units.
- a model that declares its chain, `pipeline_units()` returning (name, submodule paths, run(root, x))
  for each link: gpt (`embed`, `blocks.0` ... `blocks.<L-1>`, `head`), the ResNets (`stem`, the
  blocks, `head_norm` with pooling and `fc`) and the tutorial CNN (`conv1`, `conv2`, `fc1` ... `fc3`,
  each with the functional calls its forward makes after it) declare theirs (workloads/);
- any other model whose forward chains its children (an nn.Sequential does): its top-level children in
  registration order, the items of a ModuleList or ModuleDict child one by one (`layers.0`, `layers.1`, ...;
  torchtitan keeps its blocks in a ModuleDict keyed "0", "1", ... so that a stage can drop some and keep the
  others' names); launch checks on the meta device that they give its output's shape, and refuses a model that
  holds parameters outside its children;
- any other model: `prologue`, its blocks, `epilogue`, read from its forward graph (pipeline_trace.py).

Stage modules are built as torchtitan's manual split builds them: the stage holds deep copies of
its units' submodules under their original paths (a ModuleList becomes a ModuleDict keyed by the
same indices), so `blocks.3.attn.q.weight` is called that on every stage and a stage's
state_dict is a slice of the whole model's.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from paratrain.config import STAGED_STRATEGIES, TrainConfig
from paratrain.engine.strategies.meta_init import on_meta, resets
from paratrain.engine.strategies.pipeline_trace import GraphUnit, logits_of, traced_units
from paratrain.errors import UsageError


@dataclass(frozen=True)
class Unit:
    """One link of the model's chain: what `--split` names, the submodules it owns, how it runs."""

    name: str
    modules: tuple[str, ...]  # submodule paths, e.g. ("blocks.3",)
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (a module holding those paths, input) -> output


def model_units(model: nn.Module, example: torch.Tensor | None = None) -> list[Unit]:
    """The chain of units the model is split along (the module docstring gives the rule); read from its forward
    graph on inputs like `example` when its children in order do not give its output (pipeline_trace.py)."""
    declared = getattr(model, "pipeline_units", None)
    if callable(declared):
        return [Unit(name, tuple(modules), run) for name, modules, run in declared()]
    # A ModuleList or ModuleDict has no forward of its own: its items are the links (nanoGPT's layout,
    # `self.layers = nn.ModuleList(...)`, and torchtitan's, `nn.ModuleDict`, looped over in forward).
    children = [
        Unit(path, (path,), _call(path))
        for name, child in model.named_children()
        for path in (
            [f"{name}.{key}" for key in child._modules] if isinstance(child, (nn.ModuleList, nn.ModuleDict)) else [name]
        )
    ]
    # an nn.Sequential's forward is its children's chain, by definition: no need to run it
    if example is None or isinstance(model, nn.Sequential) or _chains(model, children, example):
        return children
    return [Unit(name, modules, run) for name, modules, run in traced_units(model, example)]


def _chains(model: nn.Module, units: list[Unit], x: torch.Tensor) -> bool:
    try:
        whole, chained = _whole_and_chained(model, units, x)
    except Exception:  # a forward that does more than call its children fails on their chain
        return False
    return isinstance(whole, torch.Tensor) and isinstance(chained, torch.Tensor) and whole.shape == chained.shape


def _call(path: str) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    return lambda root, x: root.get_submodule(path)(x)


def run_units(root: nn.Module, units: list[Unit], x: Any) -> Any:
    """The units applied in order; what passes between two is a tensor, or a tuple of them (pipeline_trace.py)."""
    for unit in units:
        x = unit.run(root, x)
    return x


def stage_slots(cfg: TrainConfig) -> int:
    """Stages the model is cut into: one per pipeline rank, two per rank with the interleaved schedule."""
    return cfg.pipeline_stages * (2 if _interleaved(cfg) else 1)


def _interleaved(cfg: TrainConfig) -> bool:
    return cfg.strategy_name != "model-parallel" and cfg.pipeline_schedule == "interleaved"


def _listing(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:4])}, ..., {', '.join(names[-2:])}"


def named_starts(units: list[Unit], split: str, slots: int) -> list[int]:
    """The unit index each stage starts at, from `--split NAME,NAME,...` (the first units of stages 2..K)."""
    names = [u.name for u in units]
    given = [part.strip() for part in split.split(",") if part.strip()]
    for name in given:
        if name not in names:
            raise UsageError(f"--split: the model has no block named {name!r}; its blocks are {_listing(names)}")
    if len(given) != slots - 1:
        raise UsageError(
            f"--split names {len(given)} block(s) for {slots} stages; name {slots - 1}, the first block of "
            f"each stage after the first (or use --split auto)"
        )
    starts = [0, *(names.index(name) for name in given)]
    if any(b <= a for a, b in itertools.pairwise(starts)):
        raise UsageError(
            f"--split: the blocks must be given in model order, each after the one before, and not "
            f"{names[0]!r} (stage 1 starts there); the model's order is {_listing(names)}"
        )
    return starts


def check_pipeline_split(cfg: TrainConfig, data: Any) -> None:
    """In the launching process, before anything is written: the model can be cut into the stages asked for.

    The model is built on the meta device (shapes only, free even for gpt-xl) and run once, whole
    and as its chain of units, on a batch of 2 held-out samples.
    """
    if cfg.strategy_name not in STAGED_STRATEGIES:
        return
    from paratrain.engine.data import BatchPreparer, eval_batches
    from paratrain.engine.distributed import RankContext
    from paratrain.workloads import build_model, hf
    from paratrain.workloads.objective import target_parameter

    with torch.device("meta"):
        model = build_model(cfg, data)
    if cfg.loss is None and target_parameter(model) is not None and not hf.shifts_labels(model):
        raise UsageError(
            f"--strategy {cfg.strategy_name} computes the loss on the last stage from the model's output, and this "
            "model's forward takes the targets and computes its own loss; return the output and pass --loss "
            "pkg.module:fn"
        )
    one = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    x, _ = next(eval_batches(data.test, one, 2, BatchPreparer(cfg.image_size)))
    if isinstance(x, dict):
        raise UsageError(
            f"--strategy {cfg.strategy_name} passes one input tensor from stage to stage, and the samples are dicts "
            f"of keyword inputs ({', '.join(x)}); train them with ddp or fsdp"
        )
    try:
        units = model_units(model, x.to("meta"))
        whole, chained = _whole_and_chained(model, units, x.to("meta"))
    except Exception:
        # A forward that reads values (x.item(), data-dependent branches) cannot run on meta tensors: try again
        # for real, on CPU, with the 2 samples.
        try:
            with torch.device("cpu"):
                model = build_model(cfg, data)
            units = model_units(model, x)
            whole, chained = _whole_and_chained(model, units, x)
        except UsageError:
            raise
        except Exception as exc:  # any failure of the user's modules is the user's to fix
            raise UsageError(
                f"--strategy {cfg.strategy_name}: the model's blocks do not chain, each taking the one before's output "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); define pipeline_units() "
                "on the model (docs/strategies.md, 'The split')"
            ) from None
    names = [u.name for u in units]
    whole = logits_of(whole)
    if not isinstance(whole, torch.Tensor) or not isinstance(chained, torch.Tensor) or whole.shape != chained.shape:
        raise UsageError(
            f"--strategy {cfg.strategy_name}: the model's blocks ({_listing(names)}) applied in order do not give "
            "the model's output; define pipeline_units() on the model (docs/strategies.md, 'The split')"
        )
    traced = isinstance(units[-1].run, GraphUnit)
    if traced:
        _check_graph_stages(cfg)
    owned = tuple(path for unit in units for path in unit.modules)
    stray = [
        name
        for name, _ in (*model.named_parameters(), *model.named_buffers())
        if not any(name == path or name.startswith(path + ".") for path in owned)
    ]
    if stray and not traced:
        raise UsageError(
            f"--strategy {cfg.strategy_name} splits the model by its top-level children and {stray[0]!r} belongs "
            "to none of them; move it into a child module"
        )
    slots = stage_slots(cfg)
    if len(units) < slots:
        raise UsageError(
            f"the model has {len(units)} blocks ({_listing(names)}), too few for {slots} "
            f"stages; use --stages {len(units) // (slots // cfg.pipeline_stages)} or fewer"
        )
    if cfg.split != "auto":
        named_starts(units, cfg.split, slots)


def _check_graph_stages(cfg: TrainConfig) -> None:
    """Stages read from the forward graph run its operators, not the model's modules: what wraps the modules (a
    tensor-parallel split, FSDP's shards, activation checkpointing) would never run."""
    given = (
        ("--tp", cfg.tp > 1),
        ("--dp-shard", (cfg.dp_shard or 1) > 1),
        ("--checkpoint-activations", cfg.checkpoint_activations),
    )
    wrapping = next((flag for flag, on in given if on), None)
    if wrapping is not None:
        raise UsageError(
            f"{wrapping} splits, shards or checkpoints a stage's modules, and this model's stages run its forward "
            "graph's operators, not its modules; define pipeline_units() on the model, or drop it"
        )


def _whole_and_chained(model: nn.Module, units: list[Unit], x: torch.Tensor) -> tuple[Any, Any]:
    with torch.no_grad():
        return model(x), run_units(model, units, x)


# -- choosing the cuts -----------------------------------------------------------------------


def balanced_starts(costs: list[float], slots: int) -> list[int]:
    """Cut the chain into `slots` runs of consecutive units so that the costliest run is as cheap
    as it can be (the linear-partition problem, by dynamic programming); the start of each run."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: the least possible largest run when the first i units form s runs; cut[s][i]: where the last starts.
    best = [[inf] * (n + 1) for _ in range(slots + 1)]
    cut = [[0] * (n + 1) for _ in range(slots + 1)]
    best[0][0] = 0.0
    for s in range(1, slots + 1):
        for i in range(s, n - (slots - s) + 1):
            for j in range(s - 1, i):
                worst = max(best[s - 1][j], prefix[i] - prefix[j])
                if worst < best[s][i]:
                    best[s][i], cut[s][i] = worst, j
    starts, i = [], n
    for s in range(slots, 0, -1):
        i = cut[s][i]
        starts.append(i)
    return starts[::-1]


def measure_unit_seconds(model: nn.Module, units: list[Unit], x: torch.Tensor, budget_s: float = 5.0) -> list[float]:
    """Forward + backward seconds of each unit on the batch x (one micro-batch), each on the one before's output:
    the median of up to 3 timed passes after one warm-up. The model is left as it was: gradients dropped, buffers
    (BatchNorm statistics) restored, the random-number generators untouched.

    A model on the meta device (built for its stages alone, meta_init.py) times each unit on a copy of that unit
    alone, materialised on x's device with its modules' default initialisation and dropped before the next: the
    time of a unit does not depend on its weights' values, and no more than one unit is ever held."""
    cuda = x.device.type == "cuda"

    def now() -> float:
        if cuda:
            torch.cuda.synchronize(x.device)
        return time.perf_counter()

    meta = on_meta(model)
    saved = {} if meta else {name: b.clone() for name, b in model.named_buffers()}
    seconds: list[float] = []
    h = x
    with torch.random.fork_rng(devices=[x.device] if cuda else []):
        for i, unit in enumerate(units):
            root = _materialised(model, unit, x.device) if meta else model
            started, samples = time.perf_counter(), []
            for timed_pass in range(4):
                inputs = _detached(h, grad=i > 0)
                t = now()
                out = unit.run(root, inputs)
                forward = now() - t
                t = now()
                differentiable = [o for o in _tensors(out) if o.requires_grad]
                if differentiable:
                    torch.autograd.backward(differentiable, [torch.ones_like(o) for o in differentiable])
                if timed_pass:
                    samples.append(forward + now() - t)
                    if time.perf_counter() - started > budget_s / len(units):
                        break
            seconds.append(statistics.median(samples))
            h = _detached(out, grad=False)
            for p in root.parameters():
                p.grad = None
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in saved:
                b.copy_(saved[name])
    return seconds


def _tensors(value: Any) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _detached(value: Any, grad: bool) -> Any:
    """What passes between units, cut from the graph before it; floating-point tensors requiring grad if `grad`."""
    cut = tuple(t.detach().requires_grad_(grad and t.is_floating_point()) for t in _tensors(value))
    return cut if isinstance(value, tuple) else cut[0]


def _materialised(model: nn.Module, unit: Unit, device: torch.device) -> nn.Module:
    """A copy of one unit of a meta model, on `device`, initialised as its modules initialise themselves."""
    alone = StageModule(model, [unit]).to_empty(device=device)
    with torch.no_grad():
        for module in filter(resets, alone.modules()):
            module.reset_parameters()
    return alone


# -- stage modules ---------------------------------------------------------------------------


class StageModule(nn.Module):
    """A run of consecutive units, holding copies of their submodules under their original paths."""

    def __init__(self, model: nn.Module, units: list[Unit]):
        super().__init__()
        self._pipeline_units = list(units)
        memo: dict[int, Any] = {}  # one memo: weights tied inside the stage stay one tensor
        for unit in units:
            for path in unit.modules:
                _place(self, path, lambda path=path: copy.deepcopy(model.get_submodule(path), memo))

    def forward(self, *x: torch.Tensor) -> Any:
        # A stage receives what the stage before gave, as separate arguments when that was a tuple.
        return run_units(self, self._pipeline_units, x[0] if len(x) == 1 else x)


def _place(root: nn.Module, path: str, make: Callable[[], nn.Module]) -> None:
    *parents, leaf = path.split(".")
    node = root
    for part in parents:
        if part not in node._modules:
            node.add_module(part, nn.ModuleDict())
        node = node._modules[part]
    if leaf not in node._modules:
        node.add_module(leaf, make())


def tied_parameter_names(model: nn.Module) -> list[tuple[str, ...]]:
    """Groups of parameter names that are one tensor in the model (gpt: embed.wte.weight and head.lm_head.weight)."""
    names: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    return [tuple(group) for group in names.values() if len(group) > 1]


def units_holding(name: str, units: list[Unit]) -> list[int]:
    """Indices of the units that hold a parameter (more than one when units read a module its graph shares:
    pipeline_trace.py)."""
    return [
        i for i, unit in enumerate(units) if any(name == path or name.startswith(path + ".") for path in unit.modules)
    ]
