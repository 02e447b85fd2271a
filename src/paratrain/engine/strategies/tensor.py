"""Tensor parallelism: each layer's matrix multiplications split across the ranks.

Megatron-LM's split (Shoeybi et al. 2019) with PyTorch's `torch.distributed.tensor.parallel`, as
torchtitan applies it: a linear layer whose output columns are split (`ColwiseParallel`) feeds one
whose input rows are split (`RowwiseParallel`), so the pair needs one all-reduce in forward and one
in backward, and each rank holds 1/T of their weights. The model declares which layers split how:

    def tensor_parallel_plan(self, degree: int) -> dict[str, str | ParallelStyle]:
        return {"blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise", ...}

(module paths as `parallelize_module` takes them, `*` matching one level; "colwise" and "rowwise"
are the default styles, "replicated-input" a module whose input feeds several colwise layers; any
`ParallelStyle` is used as given), or `--tp-plan pkg.module:fn` names a function that returns one.
gpt declares the attention's q, k, v and the MLP's first layer colwise, their projections rowwise
(workloads/gpt.py).

Every other parameter (embeddings, norms, gpt's byte-vocabulary head) stays whole on each rank, as
a replicated DTensor on the same mesh: the optimizer's foreach kernels take a list of DTensors or
of tensors, not a mix, so every parameter is a DTensor, and the modules that hold them take and
return plain tensors (their buffers replicated too; a module without parameters keeps its
buffers). Their gradients are equal on every rank (their inputs are, after the rowwise layers'
all-reduce), so nothing averages them.

All ranks of a tensor-parallel group read the same batch, and only the group's first rank reports
its loss (the loop sums samples over the ranks): with `--tp` equal to `--workers` the run has one
data-parallel replica; `fsdp` shards over several groups (engine/strategies/fsdp.py). The split is
applied before activation checkpointing wraps the blocks (`split`, then the loop's checkpointing,
then `wrap`). Checkpoints go through torch.distributed.checkpoint
(engine/strategies/sharded_checkpoint.py).
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.base import StepResult, WholeModelStrategy
from paratrain.engine.strategies.sharded_checkpoint import ShardedCheckpoints
from paratrain.errors import UsageError


def _first_input(module: nn.Module, given: Placement, desired: Placement) -> ParallelStyle:
    """The module's first input laid out as `given`, turned into `desired`; any further positional inputs
    (a rotary table, a mask) pass as they are."""
    positional = [
        p
        for p in inspect.signature(module.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    rest = [None] * (len(positional) - 1)
    return PrepareModuleInput(input_layouts=(given, *rest), desired_input_layouts=(desired, *rest))


# Each builds the style for one matched module.
STYLES: dict[str, Callable[[nn.Module], ParallelStyle]] = {
    "colwise": lambda _: ColwiseParallel(),
    "rowwise": lambda _: RowwiseParallel(),
    # A module whose input feeds several colwise layers (attention's q, k and v): its input enters as one
    # replicated DTensor, so their input gradients are summed before the one all-reduce that completes them
    # (Megatron's f operator), instead of one all-reduce each.
    "replicated-input": lambda module: _first_input(module, Replicate(), Replicate()),
    # Sequence parallelism (Korthikanti et al. 2022), between the split layer pairs: a norm runs on the
    # rank's share of the tokens; the pair's input is gathered (all-gather) and its output summed straight
    # into the rank's share of the tokens (reduce-scatter) instead of an all-reduce.
    "sequence-norm": lambda _: SequenceParallel(),
    "sequence-input": lambda module: _first_input(module, Shard(1), Replicate()),
    "rowwise-to-sequence": lambda _: RowwiseParallel(output_layouts=Shard(1)),
    # a module computed whole on every rank (an embedding) whose output the rank keeps its share of tokens of
    "sequence-output": lambda _: PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
}
# The weight dimension each splitting style splits, which must divide by the degree (nn.Linear's
# weight is [out_features, in_features]).
SPLIT_DIM = {"colwise": 0, "rowwise": 1, "rowwise-to-sequence": 1}


def model_plan(
    model: nn.Module, degree: int, plan_fn: str | None = None, sequence_parallel: bool = False
) -> dict[str, ParallelStyle]:
    """The plan `--tp-plan` names (fn(model, degree)), else the model's own (its `tensor_parallel_plan(degree)`),
    checked against its layers. With --sequence-parallel the plan is asked for its sequence-parallel form
    (the keyword `sequence_parallel=True`), which a plan without that keyword does not have."""
    if plan_fn is not None:
        from paratrain.workloads import import_factory

        declare = functools.partial(import_factory(plan_fn, "--tp-plan"), model)
        whose = f"--tp-plan {plan_fn}"
    else:
        declare = getattr(model, "tensor_parallel_plan", None)
        whose = f"{type(model).__name__}.tensor_parallel_plan"
        if not callable(declare):
            raise UsageError(
                f"--tp {degree}: the model ({type(model).__name__}) declares no tensor-parallel plan; give it a "
                "method tensor_parallel_plan(degree) returning {module path: 'colwise' | 'rowwise'}, or name a "
                "function with --tp-plan pkg.module:fn (see docs/strategies.md)"
            )
    if sequence_parallel:
        if "sequence_parallel" not in inspect.signature(declare).parameters:
            raise UsageError(
                f"--sequence-parallel: {whose} has no sequence-parallel form; give it a keyword "
                "sequence_parallel=False that returns the plan with 'sequence-norm', 'sequence-input' and "
                "'rowwise-to-sequence' styles when true (docs/strategies.md), or drop --sequence-parallel"
            )
    try:
        plan: dict[str, Any] = declare(degree, sequence_parallel=True) if sequence_parallel else declare(degree)
    except UsageError:
        raise
    except Exception as exc:  # the user's plan refusing the degree its own way (a ValueError, an assert)
        raise UsageError(
            f"--tp {degree}: {whose} failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "choose a --tp the model can be split by"
        ) from None
    if not isinstance(plan, dict) or not plan:
        raise UsageError(f"--tp {degree}: the tensor-parallel plan is {plan!r}; it must be a non-empty dict")
    names = dict(model.named_modules())
    resolved: dict[str, ParallelStyle] = {}
    for path, style in plan.items():
        matched = [name for name in names if _matches(name, path)]
        if not matched:
            raise UsageError(f"--tp {degree}: the model's tensor-parallel plan names {path!r}, which matches no module")
        if isinstance(style, ParallelStyle):
            resolved[path] = style
            continue
        if style not in STYLES:
            raise UsageError(
                f"--tp {degree}: the plan gives {path!r} the style {style!r}; use {', '.join(map(repr, STYLES))} "
                "or a torch.distributed.tensor.parallel ParallelStyle"
            )
        for name in matched:
            weight = getattr(names[name], "weight", None) if style in SPLIT_DIM else None
            if weight is not None and weight.shape[SPLIT_DIM[style]] % degree:
                raise UsageError(
                    f"--tp {degree}: {name} ({style}) has {weight.shape[SPLIT_DIM[style]]} "
                    f"{'outputs' if style == 'colwise' else 'inputs'}, which {degree} ranks cannot split evenly; "
                    "choose a --tp that divides it"
                )
        # the modules one pattern matches are the same kind of layer (a block's q in every block)
        resolved[path] = STYLES[style](names[matched[0]])
    return resolved


def apply_tensor_parallel(
    model: nn.Module, mesh: DeviceMesh, degree: int, plan_fn: str | None = None, sequence_parallel: bool = False
) -> nn.Module:
    """Split the plan's layers over `mesh` and replicate every other parameter and buffer on it."""
    return split_by_plan(model, mesh, model_plan(model, degree, plan_fn, sequence_parallel))


def _matches(name: str, pattern: str) -> bool:
    """A module path against a plan's pattern: `*` stands for one path component (blocks.*.mlp.fc)."""
    return fnmatch.fnmatchcase(name, pattern) and name.count(".") == pattern.count(".")


def divided_modules(model: nn.Module, plan: dict[str, ParallelStyle]) -> list[str]:
    """The modules whose work the plan divides over the ranks (the planner's split FLOPs): the layers it splits
    (by columns, rows or sequence), and the modules around them that only lay out their inputs (a block's
    attention, whose heads are split); not a module that lays out its input or output and is computed whole (an
    embedding whose output is sequence-split, a head that gathers the sequence back)."""
    names = [name for name, _ in model.named_modules() if name]
    dividing = (ColwiseParallel, RowwiseParallel, SequenceParallel)
    split = {n for p, style in plan.items() if isinstance(style, dividing) for n in names if _matches(n, p)}
    around = {n for p, style in plan.items() if not isinstance(style, dividing) for n in names if _matches(n, p)}
    return sorted(split | {n for n in around if any(s.startswith(n + ".") for s in split)})


def split_by_plan(model: nn.Module, mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> nn.Module:
    """apply_tensor_parallel with the plan resolved already: a pipeline stage takes its whole model's plan (a
    stage declares none), and the patterns that match none of its modules are left out."""
    names = [name for name, _ in model.named_modules()]
    mine = {path: style for path, style in plan.items() if any(_matches(name, path) for name in names)}
    parallelize_module(model, mesh, mine)
    replicated: dict[int, nn.Parameter] = {}  # a tied parameter stays one parameter
    for module in model.modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if not isinstance(p, DTensor)]
        if not own:
            # A module without parameters of its own keeps its buffers as plain tensors: a table it hands to
            # other layers (a rotary embedding's) meets their local outputs, not DTensors.
            continue
        buffers = [(n, b) for n, b in module.named_buffers(recurse=False) if not isinstance(b, DTensor)]
        for name, param in own:
            if id(param) not in replicated:
                whole = distribute_tensor(param.detach(), mesh, [Replicate()])
                replicated[id(param)] = nn.Parameter(whole, requires_grad=param.requires_grad)
            module.register_parameter(name, replicated[id(param)])
        for name, buffer in buffers:
            module.register_buffer(name, distribute_tensor(buffer, mesh, [Replicate()]))
        module.register_forward_pre_hook(_replicated_inputs(mesh))
        module.register_forward_hook(_local_output)
    return model


def reported(result: StepResult, tp_mesh: DeviceMesh) -> StepResult:
    """The step's loss and output on the first rank of a tensor-parallel group only: every rank of the group
    computed the same batch, and the loop sums samples, losses and correct answers over the ranks."""
    return result if tp_mesh.get_local_rank() == 0 else (None, None)


def _replicated_inputs(mesh: DeviceMesh) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
    def hook(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            DTensor.from_local(a, mesh, [Replicate()], run_check=False)
            if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
            else a
            for a in args
        )

    return hook


def _local_output(_: nn.Module, __: Any, output: Any) -> Any:
    return output.to_local() if isinstance(output, DTensor) else output


class TensorParallel(WholeModelStrategy):
    name = "tp"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        self.mesh = init_device_mesh(ctx.device.type, (cfg.tp,), mesh_dim_names=("tp",))
        self.allreduce = f"all-reduce in each split layer pair ({dist.get_backend()})"
        self.checkpoints = ShardedCheckpoints(ctx, cfg.run_dir)

    def data_shard(self) -> tuple[int, int]:
        """The ranks of a tensor-parallel group compute one batch together: each reads all of it."""
        return 0, 1

    def split(self, model: nn.Module) -> None:
        apply_tensor_parallel(model, self.mesh, self.cfg.tp, self.cfg.tp_plan, self.cfg.sequence_parallel)

    def forward_backward(
        self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor, *rest: Any
    ) -> StepResult:
        return reported(super().forward_backward(model, objective, x, y, *rest), self.mesh)

    def evaluate(self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor, *rest: Any) -> StepResult:
        return reported(super().evaluate(model, objective, x, y, *rest), self.mesh)

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        return self.checkpoints.save(model, optimizer)

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self.checkpoints.load(model, optimizer, state)


def check_tensor_parallel(cfg: TrainConfig, make_model: Callable[[], nn.Module]) -> None:
    """Refuse a plan that cannot split this model, in the launching process, before anything is written:
    the model built on the meta device (shapes only)."""
    with torch.device("meta"):
        model_plan(make_model(), cfg.tp, cfg.tp_plan, cfg.sequence_parallel)
