"""Exact checks (#25) for the pipeline's theoretical bubble per schedule and local SGD's averaging
schedule with a warmup. Expected values are computed by hand in the comments."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from paratrain.engine.strategies.ddp import DataParallel
from paratrain.engine.strategies.pipeline import PipelineParallel
from paratrain.engine.strategies.pipeline_split import stage_slots
from paratrain.plan.step_time import bubble_fraction


# -- 1. the pipeline bubble ------------------------------------------------------------------------
# GPipe / 1F1B: (p-1)/(m+p-1);  interleaved 1F1B, v chunks per rank: (p-1)/(v*m+p-1) (Narayanan 2021).
@pytest.mark.parametrize(
    "p, m, expected",
    [
        (2, 1, Fraction(1, 2)),  # 1/(1+1)
        (2, 4, Fraction(1, 5)),  # 1/(4+1)
        (4, 8, Fraction(3, 11)),  # 3/(8+3)
        (8, 16, Fraction(7, 23)),  # 7/(16+7)
        (3, 2, Fraction(1, 2)),  # 2/(2+2)
    ],
)
def test_planner_bubble_is_gpipe_1f1b_formula(p, m, expected):
    assert bubble_fraction(p, m) == pytest.approx(float(expected), abs=1e-12)


def test_planner_bubble_is_none_without_a_pipeline():
    assert bubble_fraction(1, 8) is None


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_stage_slots_per_schedule(schedule, v):
    cfg = SimpleNamespace(pipeline_stages=4, strategy_name="pipeline", pipeline_schedule=schedule)
    assert stage_slots(cfg) == 4 * v  # 4 ranks x v chunks each
    mp = SimpleNamespace(pipeline_stages=4, strategy_name="model-parallel", pipeline_schedule=schedule)
    assert stage_slots(mp) == 4  # model parallel never interleaves


@pytest.mark.parametrize(
    "p, m, v, expected",
    [
        (2, 4, 1, Fraction(1, 5)),  # 1/(1*4+1)
        (2, 4, 2, Fraction(1, 9)),  # 1/(2*4+1)
        (4, 8, 1, Fraction(3, 11)),  # 3/(8+3)
        (4, 8, 2, Fraction(3, 19)),  # 3/(2*8+3)
        (4, 4, 2, Fraction(3, 11)),  # 3/(2*4+3)
        (3, 6, 3, Fraction(2, 20)),  # 2/(3*6+2) = 1/10
        (8, 16, 2, Fraction(7, 39)),  # 7/(2*16+7)
    ],
)
def test_engine_bubble_theory_per_schedule(p, m, v, expected):
    # theory() reads pp (ranks), microbatches and slots (= pp * v stage chunks).
    fake = SimpleNamespace(pp=p, microbatches=m, slots=p * v)
    assert PipelineParallel.theory(fake) == pytest.approx(float(expected), abs=1e-12)


# -- 2. local SGD's averaging schedule -------------------------------------------------------------
@pytest.fixture()
def one_rank_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _averaging_steps(monkeypatch, warmup: int, every: int, steps: int):
    """Run `steps` optimizer steps through DataParallel.optimizer_step with a real torch averager;
    returns (steps reported as averaging, steps where torch all-reduced, bytes counted)."""
    from torch.distributed.algorithms.model_averaging import utils as avg_utils
    from torch.distributed.algorithms.model_averaging.averagers import (
        PeriodicModelAverager,
    )

    calls: list[int] = []
    step_box = [0]
    real = avg_utils.dist.all_reduce

    def counting(*a, **k):
        calls.append(step_box[0])
        return real(*a, **k)

    monkeypatch.setattr(avg_utils.dist, "all_reduce", counting)
    ticks = iter(range(10_000))
    strat = object.__new__(DataParallel)
    strat.stamp = lambda: next(ticks)
    strat._bytes = 0
    strat._averager = PeriodicModelAverager(period=every, warmup_steps=warmup)
    param = torch.nn.Parameter(torch.zeros(5))  # 5 float32 = 20 bytes
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    reported = []
    for i in range(steps):
        step_box[0] = i
        param.grad = torch.ones(5)
        if strat.optimizer_step(opt, scaler) is not None:
            reported.append(i)
    return reported, sorted(set(calls)), strat.bytes_sent()


@pytest.mark.parametrize(
    "warmup, every, steps, expected",
    [
        # step i averages iff i >= w and (i - w) % H == 0
        (3, 4, 12, [3, 7, 11]),  # 3, 3+4, 3+8
        (0, 2, 6, [0, 2, 4]),  # no warmup: every other step from 0
        (5, 3, 12, [5, 8, 11]),  # 5, 5+3, 5+6
        (10, 2, 10, []),  # the warmup covers the whole run
        (1, 5, 12, [1, 6, 11]),  # 1, 1+5, 1+10
    ],
)
def test_local_sgd_averages_after_warmup_every_h(one_rank_group, monkeypatch, warmup, every, steps, expected):
    reported, all_reduced, sent = _averaging_steps(monkeypatch, warmup, every, steps)
    assert reported == expected
    assert all_reduced == expected  # what torch really averaged agrees with the report
    assert sent == 20 * len(expected)  # 5 float32 params = 20 bytes per averaging
