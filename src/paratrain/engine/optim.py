"""Optimizers by name, including the layer-wise adaptive ones for large batches.

- LARS (You, Gitman, Ginsburg 2017, arXiv:1708.03888, Algorithm 1): each layer's step is scaled
  by a trust ratio η‖w‖ / (‖∇w‖ + β‖w‖), so no layer moves faster than its weights can take.
- LAMB (You et al. 2019, arXiv:1904.00962, Algorithm 2): the same layer-wise trust ratio applied
  to an Adam update (with bias correction).

Written here from the papers: torch ships neither. As in the papers' reference implementations,
biases and normalisation parameters (tensors with ndim <= 1) get no weight decay and no layer-wise
adaptation; `build_optimizer` puts them in their own parameter group with `adapt=False`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from paratrain.errors import UsageError

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw", "lars", "lamb")


def _trust_ratio(
    numerator: torch.Tensor, denominator: torch.Tensor, w_norm: torch.Tensor, other_norm: torch.Tensor
) -> torch.Tensor:
    """numerator / denominator, or 1 where either norm is zero (a fresh or a zero-gradient layer).

    Computed with tensor ops, not `if`, so the step never waits for the device.
    """
    valid = (w_norm > 0) & (other_norm > 0)
    return torch.where(
        valid, numerator / torch.where(valid, denominator, torch.ones_like(denominator)), torch.ones_like(numerator)
    )


class LARS(torch.optim.Optimizer):
    """v ← m·v + γ·λ_l·(∇w + βw),  w ← w − v,  with λ_l = η‖w‖ / (‖∇w‖ + β‖w‖)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 1e-9,
    ):
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            eps=eps,
            adapt=True,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, decay = p.grad, group["weight_decay"]
                if group["adapt"]:
                    w_norm, g_norm = p.norm(), grad.norm()
                    local_lr = _trust_ratio(
                        group["trust_coefficient"] * w_norm, g_norm + decay * w_norm + group["eps"], w_norm, g_norm
                    )
                else:
                    local_lr = torch.ones((), device=p.device)
                update = grad.add(p, alpha=decay) if decay else grad.clone()
                update.mul_(local_lr * group["lr"])
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(update)
                p.sub_(buf)
        return loss


class LAMB(torch.optim.Optimizer):
    """Adam moments with bias correction, r = m̂/(√v̂ + ε), u = r + λw, w ← w − γ·(‖w‖/‖u‖)·u."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt=True))

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    # The step counter lives beside the parameter: a host counter would be copied to
                    # the GPU for every parameter at every step.
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                elif state["step"].device != p.device:
                    # Optimizer.load_state_dict leaves "step" where the checkpoint had it: move it once.
                    state["step"] = state["step"].to(p.device)
                state["step"] += 1
                step = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1**step)
                v_hat = v / (1 - beta2**step)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                if group["adapt"]:
                    w_norm, u_norm = p.norm(), update.norm()
                    ratio = _trust_ratio(w_norm, u_norm, w_norm, u_norm)
                else:
                    ratio = 1.0
                p.sub_(update * (group["lr"] * ratio))
        return loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weights in one group; biases and norm parameters (ndim <= 1) without decay or adaptation."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "adapt": False})
    return groups


def build_optimizer(
    name: str, params_or_model: nn.Module | Iterable[Any], lr: float, momentum: float = 0.9, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    if isinstance(params_or_model, nn.Module):
        params: Any = param_groups(params_or_model, weight_decay)
        if name not in ("lars", "lamb"):
            for group in params:
                group.pop("adapt", None)
    else:
        params = params_or_model
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return LAMB(params, lr=lr, weight_decay=weight_decay)
