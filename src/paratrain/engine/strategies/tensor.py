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

With --loss-parallel the head is split by vocabulary and its logits stay split for torch's
`loss_parallel` (gpt's tied embedding split alike, and kept one parameter: `_retie`); the loss is then
replicated, and the words the logits predict are found across the ranks without gathering them.

Every other parameter (embeddings, norms, gpt's byte-vocabulary head without --loss-parallel) stays
whole on each rank, as a replicated DTensor on the same mesh: the optimizer's foreach kernels take a
list of DTensors or of tensors, not a mix, so every parameter is a DTensor, and the modules that hold
them take and return plain tensors (their buffers replicated too; a module without parameters keeps
its buffers). Their gradients are equal on every rank (their inputs are, after the rowwise layers'
all-reduce), so nothing averages them.

All ranks of a tensor-parallel group read the same batch, and only the group's first rank reports
its loss (the loop sums samples over the ranks): with `--tp` equal to `--workers` the run has one
data-parallel replica; `fsdp` shards over several groups (engine/strategies/fsdp.py). The split is
applied before activation checkpointing wraps the blocks (`split`, then the loop's checkpointing,
then `wrap`). No rank holds the whole model: it is built on the meta device, split there, and `wrap`
materialises each rank's slices (engine/strategies/meta_init.py: the ordinary build's weights for the same seed),
unless its initialisation cannot run piecewise. Checkpoints go through torch.distributed.checkpoint
(engine/strategies/sharded_checkpoint.py).
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from paratrain.config import TrainConfig
from paratrain.config.flags import flag
from paratrain.config.parallelism import TensorParallelOptions
from paratrain.engine.distributed import RankContext, device_mesh
from paratrain.engine.strategies.base import StepResult, WholeModelStrategy
from paratrain.engine.strategies.meta_init import FullSizeCopies, build_on_meta
from paratrain.engine.strategies.pipeline_split import tied_parameter_names
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
    # Loss parallelism (--loss-parallel): the head split by vocabulary keeps its logits split (a DTensor sharded on
    # the last dimension), and torch's loss_parallel computes the cross-entropy on the pieces: each rank holds
    # 1/T of the logits, the largest tensors of a language model's step, and its backward holds four such pieces
    # where the whole loss's holds three whole logits (4/(3T) of it: plan/profile.py measures it). An embedding
    # tied to that head is split by vocabulary too (each rank looks up the words it holds; an all-reduce sums them).
    "vocab-head": lambda _: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    "vocab-embedding": lambda _: RowwiseParallel(input_layouts=Replicate()),
}
# The weight dimension each splitting style splits, which must divide by the degree (nn.Linear's
# weight is [out_features, in_features], nn.Embedding's [num_embeddings, embedding_dim]), and what it counts.
SPLIT_DIM = {"colwise": 0, "rowwise": 1, "rowwise-to-sequence": 1, "vocab-head": 0, "vocab-embedding": 0}
SPLIT_WHAT = {"colwise": "outputs", "vocab-head": "outputs", "vocab-embedding": "entries"}


# The forms a model's plan may have beyond the plain one: the keyword its `tensor_parallel_plan` takes, the styles
# that form uses, and the option that asks for it.
FORMS = {
    "sequence_parallel": "the styles 'sequence-norm', 'sequence-input' and 'rowwise-to-sequence'",
    "loss_parallel": "the style 'vocab-head' for the output layer (and 'vocab-embedding' for an embedding tied to it)",
}


def model_plan(model: nn.Module, split: TensorParallelOptions) -> dict[str, ParallelStyle]:
    """The plan `--tp-plan` names (fn(model, degree)), else the model's own (its `tensor_parallel_plan(degree)`),
    checked against its layers, for `split.tp` ranks. With --sequence-parallel or --loss-parallel the plan is asked
    for that form (the keyword `sequence_parallel=True`, `loss_parallel=True`), which a plan without the keyword
    does not have."""
    degree = split.tp
    if split.tp_plan is not None:
        from paratrain.workloads import import_factory

        declare = functools.partial(import_factory(split.tp_plan, "--tp-plan"), model)
        whose = f"--tp-plan {split.tp_plan}"
    else:
        declare = getattr(model, "tensor_parallel_plan", None)
        whose = f"{type(model).__name__}.tensor_parallel_plan"
        if not callable(declare):
            raise UsageError(
                f"--tp {degree}: the model ({type(model).__name__}) declares no tensor-parallel plan; give it a "
                "method tensor_parallel_plan(degree) returning {module path: 'colwise' | 'rowwise'}, or name a "
                "function with --tp-plan pkg.module:fn (see docs/strategies.md)"
            )
    forms = {form: True for form in FORMS if getattr(split, form)}
    for form in forms:
        if form not in inspect.signature(declare).parameters:
            raise UsageError(
                f"{flag(form)}: {whose} has no {form.split('_')[0]}-parallel form; give it a keyword {form}=False "
                f"that returns the plan with {FORMS[form]} when true (docs/strategies.md), or drop {flag(form)}"
            )
    try:
        plan: dict[str, Any] = declare(degree, **forms)
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
        if style == "vocab-head" and not split.loss_parallel:
            raise UsageError(
                f"--tp {degree}: the plan gives {path!r} the style 'vocab-head', whose split logits only "
                "--loss-parallel computes the loss of; add --loss-parallel, or return that style only in the plan's "
                "loss_parallel=True form"
            )
        for name in matched:
            weight = getattr(names[name], "weight", None) if style in SPLIT_DIM else None
            if weight is not None and weight.shape[SPLIT_DIM[style]] % degree:
                raise UsageError(
                    f"--tp {degree}: {name} ({style}) has {weight.shape[SPLIT_DIM[style]]} "
                    f"{SPLIT_WHAT.get(style, 'inputs')}, which {degree} ranks cannot split evenly; "
                    "choose a --tp that divides it"
                )
        # the modules one pattern matches are the same kind of layer (a block's q in every block)
        resolved[path] = STYLES[style](names[matched[0]])
    if split.loss_parallel and not any(
        isinstance(style, ColwiseParallel) and not style.use_local_output for style in resolved.values()
    ):
        raise UsageError(
            f"--loss-parallel: the loss-parallel form of {whose} splits no output layer by vocabulary; give the "
            "head the style 'vocab-head' in it, or drop --loss-parallel"
        )
    _check_ties(model, resolved)
    return resolved


def _check_ties(model: nn.Module, plan: dict[str, ParallelStyle]) -> None:
    """A tied parameter (a head tied to the embedding) split where one of its modules holds it and whole where
    another does cannot stay one parameter: refused before anything starts (how each is split is checked when
    the split is made, _retie)."""
    names = [name for name, _ in model.named_modules()]
    splitting = {
        name
        for path, style in plan.items()
        if isinstance(style, (ColwiseParallel, RowwiseParallel))
        for name in names
        if _matches(name, path)
    }
    for pairs in _tied_parameters(model):
        split = sorted(f"{path}.{name}" for path, name in pairs if path in splitting)
        whole = sorted(f"{path}.{name}".lstrip(".") for path, name in pairs if path not in splitting)
        if split and whole:
            raise UsageError(
                f"the tensor-parallel plan splits {', '.join(split)} but not {', '.join(whole)}, one tied parameter; "
                "split both the same way (a tied embedding and head by vocabulary: 'vocab-embedding' and "
                "'vocab-head') or neither"
            )


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, split: TensorParallelOptions) -> nn.Module:
    """Split the plan's layers over `mesh` and replicate every other parameter and buffer on it."""
    return split_by_plan(model, mesh, model_plan(model, split))


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
    tied = _tied_parameters(model)
    parallelize_module(model, mesh, mine)
    _retie(model, tied)
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


def _tied_parameters(model: nn.Module) -> list[list[tuple[str, str]]]:
    """The (module path, parameter name) pairs of each parameter held by more than one module (a head tied to
    the embedding): the pipeline's groups of tied names, each cut at its last dot."""
    return [[_owner(name) for name in group] for group in tied_parameter_names(model)]


def _owner(name: str) -> tuple[str, str]:
    path, _, attribute = name.rpartition(".")
    return path, attribute


def _retie(model: nn.Module, tied: list[list[tuple[str, str]]]) -> None:
    """Tied parameters one parameter again after the plan split them (parallelize_module distributes each module's
    weight anew): both split the same way, or neither (the rest are replicated once, by split_by_plan)."""
    for pairs in tied:
        held = [getattr(model.get_submodule(path), name) for path, name in pairs]
        split = [isinstance(p, DTensor) for p in held]
        if not any(split):
            continue
        where = [f"{path}.{name}".lstrip(".") for path, name in pairs]
        if not all(split) or len({(p.placements, p.shape) for p in held}) > 1:
            raise UsageError(
                f"the tensor-parallel plan splits {', '.join(where)} differently, but they are one tied parameter; "
                "split them the same way (a tied embedding and head: 'vocab-embedding' and 'vocab-head')"
            )
        for path, name in pairs[1:]:
            model.get_submodule(path).register_parameter(name, held[0])


def loss_context(split: TensorParallelOptions) -> AbstractContextManager:
    """Where the loss and its backward run: torch's loss_parallel with --loss-parallel (the logits split by
    vocabulary), else nothing."""
    return loss_parallel() if split.loss_parallel else nullcontext()


def reported(result: StepResult, tp_mesh: DeviceMesh) -> StepResult:
    """The step's loss and output on the first rank of a tensor-parallel group only: every rank of the group
    computed the same batch, and the loop sums samples, losses and correct answers over the ranks. Split by
    --loss-parallel, the loss is the same on every rank (a replicated DTensor) and the logits become the classes
    they predict, which every rank of the group must help find."""
    result = local_result(*result)
    return result if tp_mesh.get_local_rank() == 0 else (None, None)


def local_result(loss: torch.Tensor | None, out: torch.Tensor | None) -> StepResult:
    """The loss and output as the loop takes them, plain tensors: a replicated loss its local value, logits split
    by vocabulary (--loss-parallel) the classes they predict. Every rank of the group calls it (a collective)."""
    if isinstance(loss, DTensor):
        loss = loss.to_local()
    if isinstance(out, DTensor):
        out = _predicted_classes(out)
    return loss, out


def _predicted_classes(logits: DTensor) -> torch.Tensor:
    """The argmax of logits split by vocabulary over a 1-D mesh, without gathering them: each rank's best word
    and its score, gathered (two numbers a token a rank), the best of the bests (the first on a tie, as argmax)."""
    local = logits.to_local()
    score, index = local.max(-1)
    index = index + logits.device_mesh.get_local_rank() * local.shape[-1]
    # a word's index is exact in float32 up to 2**24 words
    pairs = torch.stack([score.float(), index.float()], -1).unsqueeze(-2)
    every = DTensor.from_local(pairs, logits.device_mesh, [Shard(pairs.ndim - 2)], run_check=False).full_tensor()
    best = every[..., 0].argmax(-1, keepdim=True)
    return every[..., 1].gather(-1, best).squeeze(-1).long()


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
        self.mesh = device_mesh(ctx, (cfg.tp,), ("tp",), cfg.seed)
        self.allreduce = f"all-reduce in each split layer pair ({dist.get_backend()})"
        self.checkpoints = ShardedCheckpoints(ctx, cfg.run_dir)
        self.copies = FullSizeCopies()  # build's, for wrap to materialise

    def data_shard(self) -> tuple[int, int]:
        """The ranks of a tensor-parallel group compute one batch together: each reads all of it."""
        return 0, 1

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """On the meta device, materialised in `wrap` after the split: no rank holds the whole model
        (engine/strategies/meta_init.py); built whole where that would change the initial weights."""
        model = build_on_meta(make, super().build, piecewise_init=False)
        self.copies = FullSizeCopies(model)
        return model

    def split(self, model: nn.Module) -> None:
        apply_tensor_parallel(model, self.mesh, self.cfg)

    def wrap(self, model: nn.Module) -> nn.Module:
        self.copies.materialise(model, self.ctx.device, self.cfg.seed)
        return model

    def forward_backward(
        self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor, *rest: Any
    ) -> StepResult:
        with loss_context(self.cfg):
            result = super().forward_backward(model, objective, x, y, *rest)
        return reported(result, self.mesh)

    def evaluate(self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor, *rest: Any) -> StepResult:
        with loss_context(self.cfg):
            result = super().evaluate(model, objective, x, y, *rest)
        return reported(result, self.mesh)

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        return self.checkpoints.save(model, optimizer)

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self.checkpoints.load(model, optimizer, state)


def check_tensor_parallel(cfg: TrainConfig, make_model: Callable[[], nn.Module]) -> None:
    """Refuse a plan that cannot split this model, in the launching process, before anything is written:
    the model built on the meta device (shapes only)."""
    with torch.device("meta"):
        model = make_model()
    if cfg.loss_parallel:
        from paratrain.workloads.objective import target_parameter

        if target_parameter(model) is not None:
            raise UsageError(
                f"--loss-parallel: the model computes its own loss (forward(x, {target_parameter(model)}=y)), which "
                "cannot take logits split by vocabulary; return the logits instead, or drop --loss-parallel"
            )
    model_plan(model, cfg)
