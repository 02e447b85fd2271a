"""Learning-rate scaling rules, warmup and schedules, as pure functions of the step.

- Linear scaling (Goyal et al. 2017, arXiv:1706.02677): when the global batch grows k-fold,
  multiply the LR by k; warm up gradually from the unscaled LR over the first epochs, because the
  scaled LR is too large for the random initial weights.
- Square-root scaling (discussed by You, Gitman, Ginsburg 2017, arXiv:1708.03888): multiply by √k,
  which keeps the variance of the update constant.
- The LR range test (`range-test`, Smith 2017; fastai's and Lightning's `lr_find`): the LR grows
  exponentially from `--lr` to `--lr-end` over the run, so every step tries a larger LR and the
  loss curve shows where training is fastest and where it diverges (`paratrain lr-find`).

The LR is a pure function of the optimizer step, so a resumed run needs only its step count to
continue on exactly the same schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paratrain.errors import UsageError

SCHEDULES: tuple[str, ...] = ("constant", "step", "exp", "inverse-time", "poly", "cosine", "range-test")
SCALING_RULES: tuple[str, ...] = ("none", "linear", "sqrt")


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """`base_lr` is meant for `base_batch` samples; return the LR for `global_batch`."""
    if rule not in SCALING_RULES:
        raise UsageError(f"unknown LR scaling rule {rule!r}; choose from {', '.join(SCALING_RULES)}")
    if global_batch <= 0 or base_batch <= 0:
        raise UsageError("batch sizes for LR scaling must be positive")
    k = global_batch / base_batch
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]


@dataclass(frozen=True)
class LRSchedule:
    """The LR of every optimizer step: warmup from `base_lr` up to `peak_lr`, then `schedule`.

    With no scaling (`base_lr == peak_lr`) the warmup is a flat ramp, i.e. a no-op, exactly as
    Goyal et al.'s rule gives; so it is when the global batch is below the base one (`peak_lr` below
    `base_lr`): the warmup ramps up, never down. After warmup the schedule runs on epochs counted from the end of
    warmup (fractional epochs, so exp and inverse-time decay smoothly; step decays in whole steps);
    cosine and poly reach `min_lr` at the last step, range-test `end_lr` (scaled as `peak_lr` is);
    `max_steps` ends the run, and so the schedule, early.
    """

    base_lr: float
    peak_lr: float
    steps_per_epoch: int
    epochs: int
    warmup_epochs: float = 0.0
    schedule: str = "constant"
    step_size: float = 30.0
    gamma: float = 0.1
    decay_rate: float = 0.5
    power: float = 2.0
    min_lr: float = 0.0
    end_lr: float | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.base_lr <= 0 or self.peak_lr <= 0:
            raise UsageError("the learning rate must be positive")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"unknown schedule {self.schedule!r}; choose from {', '.join(SCHEDULES)}")
        if self.steps_per_epoch <= 0 or self.epochs <= 0:
            raise UsageError("a schedule needs at least one step and one epoch")
        if self.warmup_epochs < 0 or (self.warmup_epochs > 0 and self.warmup_epochs >= self.epochs):
            raise UsageError(f"--warmup-epochs ({self.warmup_epochs}) must be shorter than --epochs ({self.epochs})")

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epochs * self.steps_per_epoch)

    @property
    def total_steps(self) -> int:
        return min(self.epochs * self.steps_per_epoch, self.max_steps or self.epochs * self.steps_per_epoch)

    def lr_at(self, step: int) -> float:
        """LR for optimizer step `step` (0-based)."""
        warmup = self.warmup_steps
        if step < warmup:
            # Goyal et al. warm up because the scaled LR is too large for the initial weights; a batch
            # below the base one scales the LR down, and a "warm-up" from --lr would start above it.
            start = min(self.base_lr, self.peak_lr)
            return start + (self.peak_lr - start) * step / warmup
        after = step - warmup
        remaining = max(self.total_steps - warmup, 1)
        epochs_after = after / self.steps_per_epoch
        peak = self.peak_lr
        if self.schedule == "constant":
            return peak
        if self.schedule == "step":
            return peak * self.gamma ** math.floor(epochs_after / self.step_size)
        if self.schedule == "exp":
            return peak * self.gamma**epochs_after
        if self.schedule == "inverse-time":
            return peak / (1.0 + self.decay_rate * epochs_after)
        progress = min(after / max(remaining - 1, 1), 1.0)
        if self.schedule == "range-test":
            assert self.end_lr is not None, "config validation pairs range-test with --lr-end"
            return peak * (self.end_lr / self.base_lr) ** progress
        if self.schedule == "poly":
            return self.min_lr + (peak - self.min_lr) * (1.0 - progress) ** self.power
        return self.min_lr + (peak - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
