"""The loss belongs to the workload: how one batch becomes a loss, decided once per run.

- Built-in workloads: cross-entropy over the last dimension of the output. For the image
  classifiers that is the classification loss (logits [B, classes], labels [B]); for `gpt` it is
  next-token cross-entropy (logits [B, T, 256], targets [B, T]) in nats per byte. Accuracy is the
  fraction of arg-max hits (next-byte accuracy for text), averaged per sample.
- `--loss pkg.module:fn`: `fn(output, target)` returns a scalar tensor (the mean loss of the batch).
- A model that computes its own loss: when its `forward` has a parameter named `targets`,
  `target`, `labels` or `y`, paratrain calls `model(x, <that name>=y)` and takes the loss from
  what it returns: a scalar tensor; a `(logits, loss)` pair (nanoGPT); or anything with a `loss`
  key or attribute (Hugging Face's ModelOutput, a dict), with `logits` used for accuracy if
  present. Without logits, accuracy is not measured (NaN in the metrics).
- Keyword inputs (dict samples, the Hugging Face convention: workloads/samples.py): the model is called
  with them as keywords, `model(**inputs, labels=y)`; fields its `forward` names no parameter for are left
  out, as transformers' Trainer leaves them out (unless the forward names none: then all go in).
- A causal language model that shifts its labels itself (workloads/hf.py says which) is given labels
  unshifted: the dict samples' own, or on (input, next-token target) pairs such as the text workload's, the
  inputs themselves. Its accuracy compares logits[:, :-1] with labels[:, 1:], as its own loss does.
- Targets of -100 (padding, tokens a collator masked) count in no loss and no accuracy, as in torch's
  cross-entropy and every transformers loss.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.errors import UsageError
from paratrain.workloads import hf

TARGET_PARAMETERS = ("targets", "target", "labels", "y")
IGNORE_INDEX = -100  # a target torch's cross-entropy and every transformers loss skip
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Inputs = torch.Tensor | dict[str, torch.Tensor]


class Objective:
    """`objective(model, x, y) -> (mean loss, output or None)`; `objective.correct(output, x, y)`."""

    def __init__(
        self,
        loss: Loss | None = None,
        target_parameter: str | None = None,
        name: str = "cross-entropy",
        input_names: frozenset[str] | None = None,
        shifts_labels: bool = False,
    ):
        self.loss = loss
        self.target_parameter = target_parameter
        self.name = name
        self.input_names = input_names  # the keyword inputs the forward takes; None: any
        self.shifts_labels = shifts_labels

    @property
    def in_nats(self) -> bool:
        """True when the loss is the built-in cross-entropy, so it can be read as nats (and bits)."""
        return self.loss is None and self.target_parameter is None

    def __call__(self, model: Callable[..., Any], x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if isinstance(x, dict):
            args, kwargs = (), {k: v for k, v in x.items() if self.input_names is None or k in self.input_names}
        else:
            args, kwargs = (x,), {}
        if self.target_parameter is not None:
            return _unpack(model(*args, **kwargs, **{self.target_parameter: self.labels(x, y)}))
        out = model(*args, **kwargs)
        return self.loss_of(out, y), out

    def labels(self, x: Inputs, y: torch.Tensor) -> torch.Tensor:
        """What the model's own loss is given: a model that shifts its labels fed (input, next-token target)
        pairs gets the inputs, which are its labels unshifted; everything else gets the targets."""
        return x if self.shifts_labels and isinstance(x, torch.Tensor) else y

    def loss_of(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean loss of an output already computed (a pipeline's last stage has only its output; given a model
        that shifts its labels, y is its labels, `labels(x, y)`)."""
        if self.loss is not None:
            return self.loss(out, y)
        if self.shifts_labels:  # the causal LM's own loss, given its labels: logits[:, t] against labels[:, t + 1]
            out, y = out[:, :-1], y[:, 1:]
            return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX)
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))

    def correct(self, out: torch.Tensor | None, x: Inputs, y: torch.Tensor) -> torch.Tensor:
        """Correct predictions counted in samples (a sequence counts its fraction of correct tokens, of those
        not -100). `out` is the scores of each class, or the classes predicted (logits split over ranks are
        reduced to them); a model that shifts its labels is scored as its loss aligns them."""
        if out is not None and self.shifts_labels:
            out, y = out[:, :-1], self.labels(x, y)[:, 1:]
        predicted = out is not None and not out.is_floating_point() and out.shape == y.shape
        if out is None or (out.shape[:-1] != y.shape and not predicted) or y.is_floating_point():
            return torch.full((), float("nan"), device=y.device)  # filled there: no host-to-device copy
        counted = (y != IGNORE_INDEX).reshape(len(y), -1)
        hits = ((out if predicted else out.argmax(-1)) == y).reshape(len(y), -1) & counted
        return (hits.sum(1) / counted.sum(1).clamp(min=1)).sum()


def _unpack(result: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(result, torch.Tensor):
        return result, None
    if isinstance(result, (tuple, list)) and len(result) == 2:
        logits, loss = result
        return loss, logits
    loss = result.get("loss") if isinstance(result, dict) else getattr(result, "loss", None)
    logits = result.get("logits") if isinstance(result, dict) else getattr(result, "logits", None)
    if loss is None:
        raise UsageError(
            f"the model's forward returned {type(result).__name__} without a loss; return the loss "
            "tensor, (logits, loss), or an object with a `loss`"
        )
    return loss, logits


def build_objective(loss_spec: str | None, model: nn.Module) -> Objective:
    """The run's objective: `--loss` if given, else the model's own loss if its forward takes targets,
    else cross-entropy."""
    inputs = input_names(model)
    if loss_spec is not None:
        from paratrain.workloads import import_factory

        return Objective(loss=import_factory(loss_spec, "--loss"), name=loss_spec, input_names=inputs)
    target = target_parameter(model)
    if target is None:
        return Objective(input_names=inputs)
    if hf.shifts_labels(model):
        name = f"the model's own (forward(input_ids, {target}=input_ids): a causal LM shifts its labels itself)"
        return Objective(target_parameter=target, name=name, input_names=inputs, shifts_labels=True)
    return Objective(target_parameter=target, name=f"the model's own (forward(x, {target}=y))", input_names=inputs)


def target_parameter(model: nn.Module) -> str | None:
    params = _parameters(model)
    return next((name for name in TARGET_PARAMETERS if name in params), None)


def input_names(model: nn.Module) -> frozenset[str] | None:
    """The parameters `forward` names (those keyword inputs are passed to it); None if it names none."""
    names = frozenset(
        name for name, p in _parameters(model).items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )
    return names or None


def _parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def check_scalar(loss: Any, source: str) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UsageError(
            f"{source} returned {shape}, not a scalar tensor; reduce it (e.g. .mean()) so "
            "backward() has one number to differentiate"
        )
