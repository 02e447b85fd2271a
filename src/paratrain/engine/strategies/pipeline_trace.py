"""Pipeline units read from a model's forward graph, for a model whose forward does more than call its children in
order: nanoGPT's (token and position embeddings summed before the blocks), Hugging Face's GPT-2 and Llama (a causal
mask, rotary position embeddings and the blocks' keyword inputs computed before them, a final norm and the head
after).

The forward is captured by `torch.export` (non-strict: the model's Python runs on fake tensors; the batch dimension
left to vary, so one graph serves every micro-batch size), into ATen operators, each tagged with the module that ran
it (`nn_module_stack`). It is captured twice, training and evaluating, as a graph fixes whatever the mode decides
(dropout's probability, which Hugging Face's attention passes as a number; batch norm's statistics); a unit runs the
graph of its module's mode. The blocks are the items of the model's longest ModuleList or ModuleDict of blocks of
one class (`transformer.h.<i>`, `model.layers.<i>`): each block's operators are one unit, named by the block's path.
What runs before the first block is the unit `prologue`, what runs after the last is `epilogue`; operators between
two blocks belong to the block before them.

A unit runs its operators on the parameters and buffers of the module it is given (found there by their names in
the whole model, which a stage module keeps), taking the values the units before it produced and that it or a later
unit reads, and giving on those a later unit reads: the hidden states, and whatever the prologue computed for every
block (a mask, the rotary embeddings' cosines and sines). A size the graph keeps symbolic (the batch) does not cross
a cut (a pipeline stage sends tensors alone): the unit that reads it reads it off a tensor it takes. The last unit
gives the model's output, reduced to its `logits` when it is a Hugging Face ModelOutput or a dict. Factory operators
and moves (`arange(device=...)`, `.to(x.device)`) captured on the meta device run on the device of the unit's input.

Why not torch.distributed.pipelining's own tracer (`pipeline(module, mb_args, split_spec)`): it builds the stages
itself, as graph modules, where paratrain's stages are its units' modules under the whole model's names (meta
materialisation, tied weights, checkpoints, the measured split); its splitting at a module's start is the same
idea, applied here per unit.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import fx, nn

from paratrain.errors import UsageError

aten = torch.ops.aten
# Checks export adds on the captured tensors' metadata (their device is the capture's): dropped.
CHECKS = {aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default}


def block_list(model: nn.Module) -> str | None:
    """The path of the model's longest ModuleList or ModuleDict of blocks of one class (its repeated blocks, not
    nanoGPT's `transformer` dict of parts); None if it has none of 2 or more."""
    lists = [
        (len(module), path)
        for path, module in model.named_modules()
        if isinstance(module, (nn.ModuleList, nn.ModuleDict))
        and len(module) >= 2
        and len({type(item) for item in module.children()}) == 1
    ]
    return max(lists, key=lambda item: item[0])[1] if lists else None


@dataclass
class GraphUnit:
    """One unit's operators, captured in training and in evaluation mode: each a graph of placeholders for the
    values the unit takes and an output of the values it gives."""

    training: fx.GraphModule  # each holds its graph and any constant export lifted out of the model
    evaluation: fx.GraphModule
    last: bool  # gives the model's output (reduced to logits)
    out_spec: Any  # the model output's pytree structure, for the last unit

    def __call__(self, root: nn.Module, value: Any) -> Any:
        inputs = value if isinstance(value, tuple) else (value,)
        device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))
        outputs = _OnRoot(self.training if root.training else self.evaluation, root, device).run(*inputs)
        if self.last:
            return logits_of(torch.utils._pytree.tree_unflatten(list(outputs), self.out_spec))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class _OnRoot(fx.Interpreter):
    """Runs a unit's graph with the parameters and buffers of `root` (a stage module or the whole model)."""

    def __init__(self, module: fx.GraphModule, root: nn.Module, device: torch.device):
        super().__init__(module, garbage_collect_values=True)
        self.root, self.device = root, device

    def fetch_attr(self, target: str) -> Any:
        try:
            return self.root.get_parameter(target)
        except AttributeError:
            pass
        try:
            return self.root.get_buffer(target)
        except AttributeError:
            return super().fetch_attr(target)  # a constant export lifted: the unit's own

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # The capture's device (meta) written into factories and moves (arange(device=...), .to(x.device)).
        args, kwargs = torch.utils._pytree.tree_map_only(torch.device, self._here, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def _here(self, device: torch.device) -> torch.device:
        return self.device if device.type == "meta" else device


def logits_of(out: Any) -> Any:
    """A model's output as the tensor a loss reads: itself, its `logits`, or the first tensor of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    logits = out.get("logits") if isinstance(out, dict) else getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        logits = out[0]
    return logits if logits is not None else out


# A model -> its units by the shape and dtype of the inputs they were captured on (a capture takes seconds; the
# planner asks twice, and a stage keeps its units).
CAPTURED: WeakKeyDictionary = WeakKeyDictionary()


def traced_units(model: nn.Module, x: torch.Tensor) -> list[tuple[str, tuple[str, ...], Callable[..., Any]]]:
    """(name, module paths, run) for each unit of the model's forward graph on inputs like x (module docstring)."""
    key = (tuple(x.shape[1:]), x.dtype)
    if key not in CAPTURED.setdefault(model, {}):
        CAPTURED[model][key] = _traced_units(model, x)
    return CAPTURED[model][key]


def _traced_units(model: nn.Module, x: torch.Tensor) -> list[tuple[str, tuple[str, ...], Callable[..., Any]]]:
    blocks = block_list(model)
    if blocks is None:
        raise UsageError(
            "the model's children applied in order do not give its output, and it has no ModuleList or ModuleDict "
            "of blocks of one class to cut between; define pipeline_units() on it (docs/strategies.md, 'The split')"
        )
    block_paths = [f"{blocks}.{key}" for key in model.get_submodule(blocks)._modules]
    # The forward captured as it trains and as it evaluates: dropout's probability, batch norm's statistics and
    # any branch on `self.training` are fixed in a graph.
    training, evaluation = (_units(model, x, mode, blocks, block_paths) for mode in (True, False))
    if [name for name, *_ in training] != [name for name, *_ in evaluation]:
        raise UsageError(
            "the model's forward runs other blocks in training than in evaluation; define pipeline_units() on it"
        )
    return [
        (name, tuple(sorted({*modules, *other})), GraphUnit(graph, other_graph, last, out_spec))
        for (name, modules, graph, last, out_spec), (_, other, other_graph, *_) in zip(training, evaluation)
    ]


def _units(
    model: nn.Module, x: torch.Tensor, training: bool, blocks: str, block_paths: list[str]
) -> list[tuple[str, tuple[str, ...], fx.GraphModule, bool, Any]]:
    """(name, module paths, graph, last, output structure) of each unit of the forward captured in one mode."""
    graph_module, out_spec = _capture(model, x, training)
    owner = {name: i for i, name in enumerate(block_paths)}
    nodes = [n for n in graph_module.graph.nodes if n.op in ("call_function", "call_method") and n.target not in CHECKS]
    # Each operator's unit: 0 the prologue, 1 + i block i, len(blocks) + 1 the epilogue. An operator of no block
    # between two blocks (a residual scaling, a cast) follows the block before it.
    inside = {node: _block_of(node, owner) for node in nodes}
    ran = [i for i in inside.values() if i is not None]
    if not ran:
        raise UsageError(f"the model's forward never runs its blocks ({blocks}); define pipeline_units() on it")
    if ran != sorted(ran):
        raise UsageError(
            f"the model's forward runs its blocks ({blocks}) out of order or more than once, and stages run in one "
            "order; define pipeline_units() on it"
        )
    last = max(i for i, node in enumerate(nodes) if inside[node] is not None)
    unit_of: dict[fx.Node, int] = {}
    current = 0
    for i, node in enumerate(nodes):
        current = len(block_paths) + 1 if i > last else 1 + inside[node] if inside[node] is not None else current
        unit_of[node] = current
    names = ["prologue", *block_paths, "epilogue"]
    used = sorted(set(unit_of.values()))
    return _split(model, graph_module, out_spec, nodes, unit_of, used, names)


def _block_of(node: fx.Node, owner: dict[str, int]) -> int | None:
    """The index of the block that ran the operator (its module stack names the block), else None."""
    stack = [path for path, _ in (node.meta.get("nn_module_stack") or {}).values()]
    return next((owner[path] for path in stack if path in owner), None)


def _capture(model: nn.Module, x: torch.Tensor, training: bool) -> tuple[fx.GraphModule, Any]:
    from torch.export import Dim, export

    parameters = list(inspect.signature(model.forward).parameters)
    # A training step keeps no key-value cache (Hugging Face's models return one, which is no tensor, by default).
    kwargs = {"use_cache": False} if "use_cache" in parameters else {}
    shapes = {parameters[0]: {0: Dim.AUTO}, **dict.fromkeys(kwargs)} if parameters else None
    was_training = model.training
    model.train(training)
    # Two samples at least: export fixes a dimension of 1 (it might broadcast), and the batch must stay free.
    sample = x if len(x) > 1 else torch.cat([x, x])
    try:
        exported = export(model, (sample,), kwargs, dynamic_shapes=shapes, strict=False)
    except Exception as exc:  # any failure to capture the user's forward is the user's to see
        raise UsageError(
            f"the model's forward could not be captured as a graph to cut into stages ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); define pipeline_units() on the model "
            "(docs/strategies.md, 'The split')"
        ) from None
    finally:
        model.train(was_training)
    return exported.module(), exported.call_spec.out_spec


def _split(
    model: nn.Module,
    graph_module: fx.GraphModule,
    out_spec: Any,
    nodes: list[fx.Node],
    unit_of: dict[fx.Node, int],
    used: list[int],
    names: list[str],
) -> list[tuple[str, tuple[str, ...], fx.GraphModule, bool, Any]]:
    """One graph per unit: its inputs are the values defined before it that it or a later unit reads."""
    order = {node: i for i, node in enumerate(graph_module.graph.nodes)}
    # The input's placeholder; a keyword given at capture (use_cache=False) is a constant no operator reads.
    # (export's own guard module reads every placeholder: only the operators' readings count)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder" and any(u in unit_of for u in n.users)]
    output = graph_module.graph.output_node()
    readers: dict[fx.Node, int] = {}  # each value -> the last unit that reads it
    for node in nodes:
        for arg in node.all_input_nodes:
            readers[arg] = max(readers.get(arg, -1), unit_of[node])
    for arg in output.all_input_nodes:
        readers[arg] = len(names)
    parameters = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    units = []
    carried: list[fx.Node] = list(placeholders)  # the values a unit takes, in order
    for index, unit in enumerate(used):
        mine = [n for n in nodes if unit_of[n] == unit]
        last = index == len(used) - 1
        graph, env = fx.Graph(), {}
        for node in carried:
            env[node] = graph.placeholder(node.name)
        attributes: set[str] = set()
        for node in mine:
            for arg in node.all_input_nodes:
                if _is_size(arg) and arg not in env:
                    env[arg] = _size_from(arg, carried, env, graph)
                elif arg.op == "get_attr" and arg not in env:
                    env[arg] = graph.get_attr(arg.target)
                    attributes.add(arg.target)
            env[node] = graph.node_copy(node, env.__getitem__)
        defined = [*carried, *mine]
        if last:
            given = [env[n] if isinstance(n, fx.Node) else n for n in output.args[0]]
            graph.output(tuple(given))
            after: list[fx.Node] = []
        else:
            # Sizes do not cross: a unit reads them off the tensors it takes (a stage sends tensors alone).
            after = sorted((n for n in defined if readers.get(n, -1) > unit and not _is_size(n)), key=order.__getitem__)
            graph.output(tuple(env[n] for n in after))
        holder = fx.GraphModule(_attributes(graph_module, attributes, parameters), graph)
        modules = _owners(attributes, parameters, names[unit], model)
        units.append((names[unit], modules, holder, last, out_spec))
        carried = after
    return units


def _is_size(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt)


def _size_from(size: fx.Node, carried: list[fx.Node], env: dict[fx.Node, Any], graph: fx.Graph) -> fx.Node:
    """A size the graph keeps symbolic (the batch), read off a dimension of a tensor the unit takes that has it."""
    expression = size.meta["val"].node.expr
    for node in carried:
        value = node.meta.get("val")
        for dim, extent in enumerate(getattr(value, "shape", ())):
            if isinstance(extent, torch.SymInt) and extent.node.expr == expression:
                return graph.call_function(aten.sym_size.int, (env[node], dim))
    raise UsageError(
        f"the model's forward reads a size ({expression}) after the blocks that no tensor passed between them has; "
        "define pipeline_units() on the model (docs/strategies.md, 'The split')"
    )


def _attributes(graph_module: fx.GraphModule, attributes: set[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """What the unit's graph module holds for its attributes: a constant export lifted (a tensor the forward made)
    is the unit's own; the model's parameters and buffers are read from the module the unit runs on, and held here
    only as shapes on the meta device (so a unit keeps no copy of a host-built model alive)."""
    return {
        target: parameters[target].to("meta") if target in parameters else operator.attrgetter(target)(graph_module)
        for target in attributes
    }


def _owners(attributes: set[str], parameters: dict[str, Any], name: str, model: nn.Module) -> tuple[str, ...]:
    """The submodules a unit's parameters and buffers belong to: a block's unit holds the block, the prologue and
    epilogue the modules they read; any unit also holds a module outside it whose tensors it reads."""
    # Every name of a tied weight (the graph names it once: nanoGPT's head is its token embedding): the stage holds
    # each module that has it, one tensor, and its checkpoint every name the whole model's has.
    aliases: dict[int, list[str]] = {}
    for alias, tensor in (
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ):
        aliases.setdefault(id(tensor), []).append(alias)
    read = {alias for target in attributes & set(parameters) for alias in aliases[id(parameters[target])]}
    loose = sorted(target for target in read if "." not in target)
    if loose:
        raise UsageError(
            f"the model's {loose[0]!r} belongs to the model itself, not to one of its modules, and a pipeline stage "
            "holds whole modules; move it into a child module"
        )
    block = () if name in ("prologue", "epilogue") else (name,)
    owners = {*block, *(target.rsplit(".", 1)[0] for target in read)}
    # A module inside another one listed: the outer one is copied whole.
    return tuple(sorted(p for p in owners if not any(p.startswith(q + ".") for q in owners if q != p)))
