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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.errors import UsageError

TARGET_PARAMETERS = ("targets", "target", "labels", "y")
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Objective:
    """`objective(model, x, y) -> (mean loss, output or None)`; `objective.correct(output, y)`."""

    def __init__(self, loss: Loss | None = None, target_parameter: str | None = None, name: str = "cross-entropy"):
        self.loss = loss
        self.target_parameter = target_parameter
        self.name = name

    @property
    def in_nats(self) -> bool:
        """True when the loss is the built-in cross-entropy, so it can be read as nats (and bits)."""
        return self.loss is None and self.target_parameter is None

    def __call__(
        self, model: Callable[..., Any], x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.target_parameter is not None:
            return _unpack(model(x, **{self.target_parameter: y}))
        out = model(x)
        return self.loss_of(out, y), out

    def loss_of(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean loss of an output already computed (a pipeline's last stage has only its output)."""
        if self.loss is not None:
            return self.loss(out, y)
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))

    def correct(self, out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """Correct predictions counted in samples (a sequence counts its fraction of correct tokens). `out` is the
        scores of each class, or the classes predicted (logits split over ranks are reduced to them)."""
        predicted = out is not None and not out.is_floating_point() and out.shape == y.shape
        if out is None or (out.shape[:-1] != y.shape and not predicted) or y.is_floating_point():
            return torch.full((), float("nan"), device=y.device)  # filled there: no host-to-device copy
        hits = ((out if predicted else out.argmax(-1)) == y).reshape(len(y), -1)
        return hits.float().mean(1).sum()


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
    if loss_spec is not None:
        from paratrain.workloads import import_factory

        return Objective(loss=import_factory(loss_spec, "--loss"), name=loss_spec)
    target = target_parameter(model)
    if target is not None:
        return Objective(target_parameter=target, name=f"the model's own (forward(x, {target}=y))")
    return Objective()


def target_parameter(model: nn.Module) -> str | None:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in TARGET_PARAMETERS if name in params), None)


def check_scalar(loss: Any, source: str) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UsageError(
            f"{source} returned {shape}, not a scalar tensor; reduce it (e.g. .mean()) so "
            "backward() has one number to differentiate"
        )
