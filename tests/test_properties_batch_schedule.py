"""Properties (#58) of --batch-schedule in every shape: 1-64 ranks, any per-rank batch and accumulation, a
per-rank cap (--max-batch-size) and a global one (--max-global-batch), on or off the doublings. The noise is fed as
in tests/test_formulas_batch_schedule.py: the expected squared norms of a model whose B_simple is known."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_formulas_batch_schedule import norms

from paratrain.config import TrainConfig
from paratrain.engine.batch_schedule import EMA_STEPS, BatchSchedule
from paratrain.engine.grad_noise import BucketNorms, GradNoiseRecorder
from paratrain.engine.lr import scaled_lr

FEW = settings(max_examples=60, deadline=None)


@st.composite
def schedules(draw: Any, kind: str) -> TrainConfig:
    """A growing schedule's config: ranks, --batch-size, --grad-accum, and either cap, each maybe off the doublings."""
    ranks = draw(st.integers(2 if kind == "adaptive" else 1, 64))
    batch, accum = draw(st.integers(1, 64)), draw(st.integers(1, 4))
    start = ranks * batch * accum
    per_rank_cap = draw(st.none() | st.integers(2 * batch, 16 * batch))
    global_cap = draw(st.none() | st.integers(2 * start, 32 * start))
    return TrainConfig(
        workers=ranks,
        batch_size=batch,
        grad_accum=accum,
        batch_schedule=kind,
        max_batch_size=per_rank_cap,
        max_global_batch=global_cap,
        lr_scaling=draw(st.sampled_from(["linear", "sqrt", "none"])),
        batch_ramp_epochs=draw(st.sampled_from([0.5, 1.0, 3.0])),
    )


def assert_within_its_bounds(schedule: BatchSchedule, cfg: TrainConfig) -> None:
    """The batch a step runs: per-rank batch x ranks x accumulation is the global batch reported, the per-rank
    batch within --max-batch-size, the global one within --max-global-batch, the LR at its factor."""
    ranks = cfg.data_parallel_size
    assert schedule.per_rank_batch * ranks * schedule.accum == schedule.global_batch
    assert schedule.per_rank_batch <= cfg.largest_batch_size and schedule.per_rank_batch % cfg.batch_size == 0
    assert cfg.global_batch_size <= schedule.global_batch <= cfg.largest_global_batch
    factor = scaled_lr(1.0, schedule.global_batch, cfg.global_batch_size, cfg.lr_scaling)
    assert schedule.lr_factor() == pytest.approx(factor, rel=1e-12)
    summary = schedule.summary()
    assert summary["final_global_batch"] == schedule.global_batch
    assert summary["final_per_rank_batch"] == schedule.per_rank_batch
    assert summary["largest_global_batch"] <= cfg.largest_global_batch


@FEW
@given(cfg=schedules("warmup"))
def test_a_warmup_ramps_within_both_caps_at_every_step_and_its_clock_counts_every_sample(cfg):
    epoch = 1000 * cfg.global_batch_size
    ramp = BatchSchedule(cfg, samples_per_epoch=epoch)
    batches = [ramp.global_batch]
    while ramp.state.samples < (cfg.batch_ramp_epochs + 0.5) * epoch:
        before = ramp.state.samples
        moved = ramp.step_done(ramp.accum)
        # the clock: a step of the global batch it ran at (before any change it led to)
        assert ramp.state.samples - before == batches[-1]
        assert moved is None or moved == ramp.global_batch
        assert_within_its_bounds(ramp, cfg)
        batches.append(ramp.global_batch)
    assert all(a <= b <= 2 * a for a, b in itertools.pairwise(batches))  # it grows by doublings at most
    # by the end of the ramp it stands at the largest batch that whole --batch-size forwards reach, which is
    # within a doubling of --max-global-batch
    assert cfg.largest_global_batch < 2 * ramp.global_batch or ramp.global_batch == cfg.largest_global_batch


@FEW
@given(cfg=schedules("adaptive"), noise=st.floats(1e4, 1e7))
def test_an_adaptive_batch_grows_within_both_caps_at_every_reading(cfg, noise):
    adapt = BatchSchedule(cfg, samples_per_epoch=10**6)
    for _ in range(40):
        small, big = adapt.per_rank_batch * adapt.accum, adapt.global_batch
        adapt.noise_read(*norms(noise, small, big), steps=EMA_STEPS, speedup=lambda merge, accum: 2.0)
        assert_within_its_bounds(adapt, cfg)
    assert adapt.noise_scale() == pytest.approx(noise, rel=1e-6)


def rank_readings(
    ranks: int, micro: int, accum: int, forwards: list[int], noise: float, scatter: float
) -> list[list[tuple[float, float, int, int]]]:
    """What each rank's recorder hands the schedule at a log point after steps of `forwards` micro-steps each (an
    epoch's last may have fewer), called as the loop calls it (with the schedule's accumulation). DDP's buckets
    at each step's synchronising micro-step hold the expected norms of that step's own batches: the rank's
    accumulated micro-batches and the average over the ranks; the ranks' small norms scatter around their mean in
    pairs that cancel."""
    measured = []
    with tempfile.TemporaryDirectory() as root:
        for rank in range(ranks):
            buckets = BucketNorms()
            config = TrainConfig(batch_size=micro, grad_accum=accum)
            recorder = GradNoiseRecorder(config, rank, ranks, Path(root), buckets, "gloo")
            off = 0.0 if rank == ranks - 1 and ranks % 2 else scatter * (1 if rank % 2 else -1)
            for step, count in enumerate(forwards, 1):
                small_sq, big_sq, *_ = norms(noise, micro * count, micro * count * ranks)
                for index in range(count):
                    if index == count - 1:
                        buckets.local.append(torch.tensor(small_sq * (1 + off), dtype=torch.float64))
                        buckets.averaged.append(torch.tensor(big_sq, dtype=torch.float64))
                    recorder.micro_step(None, index, index == count - 1, micro, step, micro, accum)
            measured.append(recorder.flush())
    return measured


@settings(max_examples=60, deadline=None)
@given(
    ranks=st.integers(2, 64),
    micro=st.integers(1, 64),
    accum=st.integers(1, 8),
    steps=st.integers(1, 10),
    short=st.integers(0, 7),
    noise=st.floats(0.5, 1e5),
    scatter=st.floats(0.0, 0.5),
)
@example(ranks=2, micro=16, accum=2, steps=3, short=0, noise=65.0, scatter=0.2)
def test_the_adaptive_batchs_noise_scale_does_not_depend_on_how_the_global_batch_is_split(
    ranks, micro, accum, steps, short, noise, scatter
):
    """Any ranks x micro-batch x accumulation, each rank's small norm its accumulated step's: the ranks' readings,
    summed over the ranks as the loop sums them, give every rank the planted noise scale, also where an epoch
    ends in a step of fewer micro-steps (`short` of them, 0 for none), whose batches are not the schedule's."""
    cfg = TrainConfig(workers=ranks, batch_size=micro, grad_accum=accum, batch_schedule="adaptive")
    adapt = BatchSchedule(cfg, samples_per_epoch=10**6)
    forwards = [accum] * steps + ([short] if 0 < short < accum else [])
    measured = rank_readings(ranks, micro, accum, forwards, noise, scatter)

    def total(values: list[float]) -> list[float]:  # the loop's sum over the ranks of what each rank measured
        ranks_values = [[sum(m[0] for m in mine), sum(m[1] for m in mine), len(mine), *values[3:]] for mine in measured]
        return [sum(column) for column in zip(*ranks_values)]

    with tempfile.TemporaryDirectory() as root:
        recorder = GradNoiseRecorder(cfg, 0, ranks, Path(root), BucketNorms(), "gloo")
        batches = recorder.batches(adapt.per_rank_batch, adapt.accum)
    adapt.noise_read_of_ranks(measured[0], batches, ranks, total, ranks, speedup=None)
    assert adapt.noise_scale() == pytest.approx(noise, rel=1e-6)


@FEW
@given(
    start=st.integers(1, 64),
    doublings=st.integers(0, 6),
    room=st.integers(1, 10**4),
    noise=st.floats(0.5, 1e5),
    gain=st.floats(0.5, 3.0),
)
def test_the_adaptive_outcome_names_a_next_batch_within_the_cap_and_prices_that_batch(
    start, doublings, room, noise, gain
):
    """The audit's survivor class (#58, a cap of the other kind): the run's outcome line names the batch the next
    doubling would reach. It can never pass --max-global-batch, and the noise scale's price is that batch's:
    (B_noise + final) / (B_noise + next), McCandlish et al. 2018."""
    import re

    from paratrain.reporting.verdict import batch_schedule_line

    final = start * 2**doublings
    largest = final + room  # the run ended below its cap, anywhere below it
    line = batch_schedule_line(
        {
            "kind": "adaptive",
            "start_global_batch": start,
            "final_global_batch": final,
            "largest_global_batch": largest,
            "noise_scale": noise,
            "noise_scale_stderr": None,
            "goodput_gain": gain,
        }
    )
    following = int(re.search(r"a doubling to (\d+)", line).group(1))
    assert final < following <= largest and following == min(2 * final, largest)
    worth = float(re.search(r"times (\d+\.\d+) for the noise scale", line).group(1))
    # the line rounds to hundredths: half of one, plus the float of the printed value (0.875 prints as 0.88)
    assert worth == pytest.approx((noise + final) / (noise + following), abs=0.005 + 1e-9)
