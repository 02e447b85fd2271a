"""LR scaling rules and schedules give the documented LR at chosen steps."""

import itertools
import math

import pytest

from paratrain.engine.lr import LRSchedule, scaled_lr
from paratrain.errors import UsageError


def test_scaling_rules():
    assert scaled_lr(0.001, 64, 8, "linear") == pytest.approx(0.008)  # Goyal et al.: x k
    assert scaled_lr(0.001, 64, 8, "sqrt") == pytest.approx(0.001 * math.sqrt(8))
    assert scaled_lr(0.001, 64, 8, "none") == pytest.approx(0.001)
    with pytest.raises(UsageError):
        scaled_lr(0.1, 64, 8, "cubic")


def _schedule(**kw):
    base = dict(base_lr=0.1, peak_lr=0.4, steps_per_epoch=10, epochs=10, warmup_epochs=2)
    return LRSchedule(**{**base, **kw})


def test_warmup_ramps_linearly_from_the_unscaled_lr():
    s = _schedule()
    assert s.lr_at(0) == pytest.approx(0.1)
    assert s.lr_at(10) == pytest.approx(0.25)
    assert s.lr_at(19) == pytest.approx(0.1 + 0.3 * 19 / 20)
    assert s.lr_at(20) == pytest.approx(0.4)
    assert s.lr_at(99) == pytest.approx(0.4)


def test_a_batch_below_the_base_one_starts_at_its_scaled_lr_not_above_it():
    """Scaled down (a global batch below --base-batch-size), the LR is never above the scaled one: the
    warm-up had ramped from the unscaled --lr down to it, a first epoch at up to base/batch times the LR."""
    s = _schedule(base_lr=0.4, peak_lr=0.1)
    assert [s.lr_at(step) for step in (0, 10, 19, 20)] == pytest.approx([0.1] * 4)


@pytest.mark.parametrize(
    "schedule, step, expected",
    [
        ("step", 20 + 29, 0.4),  # 2.9 epochs after warmup, step_size 3
        ("step", 20 + 30, 0.04),
        ("exp", 20 + 15, 0.4 * 0.1**1.5),
        ("inverse-time", 20 + 40, 0.4 / (1 + 0.5 * 4)),
        ("poly", 20 + 79, 0.0),  # the last step reaches min_lr
        ("poly", 20 + 0, 0.4),
        ("cosine", 20 + 79, 0.0),
        ("cosine", 20 + 79 // 2, 0.4 * 0.5 * (1 + math.cos(math.pi * (39 / 79)))),
    ],
)
def test_schedules_after_warmup(schedule, step, expected):
    assert _schedule(schedule=schedule, step_size=3).lr_at(step) == pytest.approx(expected, abs=1e-12)


def test_decaying_schedules_are_monotone():
    for name in ("step", "exp", "inverse-time", "poly", "cosine"):
        s = _schedule(schedule=name, step_size=2)
        lrs = [s.lr_at(i) for i in range(20, 100)]
        assert all(a >= b for a, b in itertools.pairwise(lrs)), name
        assert lrs[-1] < lrs[0]


def test_min_lr_floors_cosine_and_poly():
    for name in ("cosine", "poly"):
        assert _schedule(schedule=name, min_lr=0.01).lr_at(99) == pytest.approx(0.01)


@pytest.mark.parametrize(
    "bad", [dict(base_lr=0), dict(warmup_epochs=10), dict(schedule="linear-ish"), dict(steps_per_epoch=0)]
)
def test_bad_schedules_are_usage_errors(bad):
    with pytest.raises(UsageError):
        _schedule(**bad)
