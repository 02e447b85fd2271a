"""--batch-schedule (#30): the accumulation of every step under warmup and adaptive, pinned by hand cases;
the LR that follows the batch; the refusals. The noise is fed as the expected squared norms of a model
with a known noise scale: |G_b|² = |G|² + tr(Σ)/b, so B_simple = tr(Σ)/|G|² exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from paratrain.config import TrainConfig
from paratrain.engine.batch_schedule import EMA_STEPS, BatchSchedule, largest_merge, two_batch_estimates


def GAIN(merge: int, accum: int) -> float:
    """A doubling's throughput gain of 1.4: it then pays (1.4 x (B_noise + B) / (B_noise + 2B) >= 1.05) from
    B_noise = 2B on, the next batch."""
    return 1.4


def schedule(kind: str, **fields) -> BatchSchedule:
    # 2 ranks of 16 samples: 32 samples a micro-step; 1,000 samples an epoch
    cfg = TrainConfig(workers=2, batch_size=16, batch_schedule=kind, **fields)
    return BatchSchedule(cfg, samples_per_epoch=1000)


def norms(noise_scale: float, small: int, big: int, g2: float = 1.0) -> tuple[float, float, int, int]:
    """The expected squared norms at batches `small` and `big` of a model whose B_simple is `noise_scale`."""
    trace = noise_scale * g2
    return g2 + trace / small, g2 + trace / big, small, big


def test_the_two_batch_estimates_recover_the_gradient_and_the_noise():
    g2, trace = two_batch_estimates(*norms(500.0, 32, 64, g2=0.25))
    assert g2 == pytest.approx(0.25, rel=1e-12) and trace == pytest.approx(125.0, rel=1e-12)


def test_warmup_doubles_at_even_intervals_of_the_ramp_up_to_the_largest_batch():
    # from 32 to 256: three doublings, at 1/4, 2/4 and 3/4 of the ramp (1,000 samples)
    ramp = schedule("warmup", max_global_batch=256)
    assert (ramp.start, ramp.top, ramp.global_batch) == (1, 8, 32)
    seen = []
    for _ in range(40):  # steps of whatever accumulation the schedule says
        changed = ramp.step_done(ramp.accum)
        seen.append((ramp.state.samples, ramp.accum, changed))
    assert [(s, a) for s, a, c in seen if c] == [(256, 2), (512, 4), (768, 8)]
    assert ramp.accum == 8 and ramp.global_batch == 256  # and no further
    assert ramp.summary() == {
        "kind": "warmup",
        "start_global_batch": 32,
        "final_global_batch": 256,
        "largest_global_batch": 256,
        "final_per_rank_batch": 16,
        "largest_per_rank_batch": 16,
        "noise_scale": None,
    }


def test_warmup_to_a_largest_batch_off_the_doublings_ends_at_it():
    # 32 to 96 (3 micro-steps): two stages of the ramp, then the largest
    ramp = schedule("warmup", max_global_batch=96, batch_ramp_epochs=0.5)
    accums = []
    while ramp.state.samples < 1000:
        ramp.step_done(ramp.accum)
        accums.append(ramp.accum)
    assert sorted(set(accums)) == [1, 2, 3] and accums[-1] == 3


def test_the_default_largest_batch_is_eight_times_the_first_and_fixed_never_moves():
    assert schedule("adaptive").top * 32 == 256
    fixed = schedule("fixed", grad_accum=2)
    assert fixed.top == 2 and fixed.step_done(2) is None and fixed.noise_read(*norms(1e6, 32, 64), 100, GAIN) is None
    assert fixed.accum == 2 and fixed.lr_factor() == 1.0


def test_adaptive_waits_for_a_settled_average_and_two_readings_above_the_next_batch():
    adapt = schedule("adaptive", max_global_batch=1024)
    # B_simple 1,000 at a global batch of 32: above the next (64), but 10 steps are not EMA_STEPS' worth
    assert adapt.noise_read(*norms(1000.0, 32, 64), steps=10, speedup=GAIN) is None
    assert adapt.noise_scale() == pytest.approx(1000.0, rel=1e-9)  # the ratio of the averages is exact
    assert (
        adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) == 64
    )  # settled, second reading above
    # from there each change needs two readings again
    assert adapt.noise_read(*norms(1000.0, 64, 128), steps=EMA_STEPS, speedup=GAIN) is None
    assert adapt.noise_read(*norms(1000.0, 64, 128), steps=EMA_STEPS, speedup=GAIN) == 128
    assert adapt.global_batch == 128


def test_adaptive_grows_only_while_the_noise_scale_reaches_the_next_batch_and_never_past_the_largest():
    adapt = schedule("adaptive", max_global_batch=256)
    for _ in range(10):  # a noise scale of 100: 64 is within reach, 128 is not (100 < 2 x 64)
        adapt.noise_read(*norms(100.0, adapt.global_batch, 2 * adapt.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert adapt.global_batch == 64
    # the noise scale grows as the loss falls: the batch follows it, up to --max-global-batch
    for noise in (300.0, 300.0, 1e5, 1e5, 1e5, 1e5, 1e5, 1e5):
        adapt.noise_read(*norms(noise, adapt.global_batch, 2 * adapt.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert adapt.global_batch == 256 and adapt.accum == adapt.top == 8


def test_a_reading_below_resets_the_run_of_readings_above():
    adapt = schedule("adaptive")
    assert adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) is None and adapt.state.above == 1
    # the noise scale falls to 10, below the next batch: the run of readings above starts over
    assert adapt.noise_read(*norms(10.0, 32, 64), steps=5 * EMA_STEPS, speedup=GAIN) is None and adapt.state.above == 0
    # back above: one reading is not two (the average, 10 x 0.36 + 1,000 x 0.64, is above 64 again)
    assert adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) is None and adapt.state.above == 1
    assert adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) == 64


def test_the_lr_follows_the_batch_and_its_schedule_runs_on_samples():
    # 32 to 128 over 1,000 samples: 64 from 1/3 of the ramp (11 steps of 32: 352 samples), 128 from 2/3
    linear = schedule("warmup", max_global_batch=128)
    steps = [linear.step_done(linear.accum) for _ in range(20)]
    assert [i + 1 for i, changed in enumerate(steps) if changed] == [11, 16]  # 352 + 5 x 64 = 672 >= 667
    assert linear.accum == 4 and linear.lr_factor() == 4.0
    assert linear.state.samples == 11 * 32 + 5 * 64 + 4 * 128
    assert linear.lr_step() == linear.state.samples // 32  # the schedule's step: samples over the first batch
    root = schedule("warmup", max_global_batch=128, lr_scaling="sqrt")
    root.load_state_dict(linear.state_dict())
    assert root.lr_factor() == pytest.approx(2.0) and root.accum == 4


def test_the_state_goes_into_the_checkpoint_whole():
    adapt = schedule("adaptive")
    adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN)
    adapt.step_done(1)
    saved = adapt.state_dict()
    restored = schedule("adaptive")
    restored.load_state_dict(saved)
    assert restored.state == adapt.state and restored.noise_scale() == pytest.approx(1000.0)
    assert (
        restored.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) == 64
    )  # the second reading, as it would have been


@pytest.mark.parametrize(
    ("fields", "told"),
    [
        ({"batch_schedule": "adaptive", "max_global_batch": 48}, "--max-global-batch 48 leaves no room"),
        ({"batch_schedule": "adaptive", "workers": 3, "strategy": "async-ps"}, "async-ps does not do"),
        ({"batch_schedule": "warmup", "workers": 2, "strategy": "pipeline"}, "a pipeline accumulates"),
        ({"batch_schedule": "adaptive", "workers": 2, "strategy": "hybrid"}, "a pipeline accumulates"),
        ({"batch_schedule": "adaptive", "workers": 1, "strategy": "fsdp"}, "one worker has no reduce-scatter"),
        ({"batch_schedule": "adaptive", "workers": 4, "strategy": "fsdp", "tp": 2}, "which --tp 2 splits"),
        (
            {"batch_schedule": "adaptive", "workers": 2, "strategy": "fsdp", "dp_replicate": 2},
            "FSDP reduce-scatters nothing",
        ),
        ({"grad_noise": True, "workers": 2, "strategy": "pipeline"}, "use --strategy ddp, zero1, fsdp or single"),
        ({"batch_schedule": "adaptive", "workers": 1}, "adaptive on one worker compares a micro-batch"),
        (
            {"batch_schedule": "adaptive", "workers": 2, "sync_every": 4},
            "--batch-schedule adaptive compares each rank's gradient",
        ),
        ({"batch_schedule": "warmup", "schedule": "range-test", "lr_end": 1.0}, "use --batch-schedule fixed"),
        ({"max_global_batch": 256}, "--max-global-batch applies to --batch-schedule warmup or adaptive"),
        ({"batch_ramp_epochs": 2.0}, "--batch-ramp-epochs applies"),
    ],
)
def test_a_schedule_that_cannot_grow_is_refused(fields, told):
    with pytest.raises(ValidationError, match=told):
        TrainConfig(batch_size=32, **fields)


def test_warmup_on_fsdp_and_adaptive_on_ddp_fsdp_and_hsdp_are_taken():
    assert TrainConfig(workers=2, strategy="fsdp", batch_schedule="warmup").largest_global_batch == 8 * 64
    assert TrainConfig(workers=2, batch_schedule="adaptive").measures_grad_noise
    assert TrainConfig(workers=2, strategy="fsdp", batch_schedule="adaptive").measures_grad_noise
    assert TrainConfig(workers=4, strategy="fsdp", dp_replicate=2, grad_noise=True).grad_noise
    assert not TrainConfig(workers=2).measures_grad_noise
    assert math.isclose(TrainConfig(workers=2, batch_schedule="warmup", batch_ramp_epochs=0.5).batch_ramp_epochs, 0.5)


def test_the_edges_of_the_adaptive_rule():
    # B_simple 64 at 32 (computed exactly: norms 3 and 2 at 32 and 64): the doubling's efficiency is
    # (64 + 32) / (64 + 64) = 3/4, so a throughput gain of 1.44 promises 1.08 (taken), 1.36 promises 1.02 (not)
    for gain, grows in ((1.44, True), (1.36, False)):
        edge = schedule("adaptive")
        edge.noise_read(3.0, 2.0, 32, 64, steps=EMA_STEPS, speedup=lambda m, a, g=gain: g)
        assert edge.noise_scale() == 64.0 and edge.last_gain == pytest.approx(gain * 0.75, rel=1e-12)
        grown = edge.noise_read(3.0, 2.0, 32, 64, steps=EMA_STEPS, speedup=lambda m, a, g=gain: g)
        assert grown == (64 if grows else None)
    # 80 reaches 64 (2 x 32) but not 128: one doubling, not two
    between = schedule("adaptive", max_global_batch=1024)
    for _ in range(6):
        between.noise_read(*norms(80.0, between.global_batch, 2 * between.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert between.global_batch == 64
    # 19 steps in two readings: twice above, but the average holds less than 1 - 1/e of its weight
    early = schedule("adaptive")
    assert early.noise_read(*norms(1000.0, 32, 64), steps=10, speedup=GAIN) is None
    assert early.noise_read(*norms(1000.0, 32, 64), steps=9, speedup=GAIN) is None and early.state.above == 2
    assert early.state.ema_weight == pytest.approx(1 - 0.95**19, rel=1e-12)
    # the averages weigh |G|² and tr(Σ) alike, whatever |G|² is
    scaled = schedule("adaptive")
    scaled.noise_read(*norms(500.0, 32, 64, g2=0.001), steps=3, speedup=GAIN)  # tr(Σ) 0.5: small, and still a noise
    assert scaled.state.ema_g2 == pytest.approx(0.001 * (1 - 0.95**3)) and scaled.noise_scale() == pytest.approx(500.0)


def test_no_noise_scale_while_the_gradient_reads_as_zero_or_less():
    zero = schedule("adaptive")
    assert zero.noise_scale() is None  # nothing measured yet
    zero.noise_read(2.0, 1.0, 32, 64, steps=5, speedup=GAIN)  # 64 x 1 - 32 x 2 = 0: |G|² estimated as exactly 0
    assert zero.state.ema_g2 == 0.0 and zero.noise_scale() is None
    negative = schedule("adaptive")
    negative.noise_read(3.0, 1.0, 32, 64, steps=5, speedup=GAIN)  # 64 x 1 - 32 x 3 < 0: |G|² estimated below zero
    assert negative.state.ema_g2 < 0 and negative.noise_scale() is None
    flat = schedule("adaptive")
    flat.noise_read(
        2.0, 2.0, 32, 64, steps=5, speedup=GAIN
    )  # the same norm at both batches: tr(Σ) estimated as exactly 0
    assert flat.state.ema_trace == 0.0 and flat.noise_scale() is None
    no_noise = schedule("adaptive")
    no_noise.noise_read(
        1.0, 2.0, 32, 64, steps=5, speedup=GAIN
    )  # the big batch's norm above the small one's: tr(Σ) < 0
    assert no_noise.state.ema_trace < 0 and no_noise.noise_scale() is None


def test_the_largest_batch_and_the_lr_clock_are_whole_numbers_of_micro_steps_and_steps():
    odd = schedule("adaptive", max_global_batch=100)  # 100 is 3 micro-steps of 32, and 4 samples over
    assert odd.top == 3 and isinstance(odd.top, int)
    for _ in range(20):
        odd.noise_read(*norms(1e6, odd.global_batch, 2 * odd.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert odd.accum == 3 and odd.global_batch == 96
    # an epoch's last, short step (one micro-step of two) counts half a starting step: the clock stays on 0
    short = schedule("warmup", grad_accum=2)
    short.step_done(1)
    assert short.lr_step() == 0 and isinstance(short.lr_step(), int)


def test_warmup_from_an_accumulation_above_one_spaces_its_doublings_by_its_own_range():
    # 2 to 8 micro-steps (64 to 256): two doublings, at 1/3 and 2/3 of the ramp (1,000 samples)
    ramp = schedule("warmup", grad_accum=2, max_global_batch=256)
    changes = []
    while ramp.state.samples < 1000:
        before = ramp.state.samples
        if ramp.step_done(ramp.accum):
            changes.append((before, ramp.accum))
    assert [a for _, a in changes] == [4, 8]
    assert 333 - 128 < changes[0][0] <= 333 and 667 - 256 < changes[1][0] <= 667


def test_the_per_rank_batch_doubles_up_to_its_limit_before_the_accumulation_does():
    # 2 ranks of 16, per-rank batch up to 64 (4 loader batches), global up to 512: 32 -> 64 -> 128 by the
    # per-rank batch (32, then 64 a rank), then 256 and 512 by accumulation (2, then 4 forwards of 64)
    grow = schedule("warmup", max_global_batch=512, max_batch_size=64)
    assert (grow.max_merge, grow.top) == (4, 16)
    seen = []
    while grow.state.samples < 1000:
        if grow.step_done(grow.accum):
            seen.append((grow.global_batch, grow.per_rank_batch, grow.accum))
    assert seen == [(64, 32, 1), (128, 64, 1), (256, 64, 2), (512, 64, 4)]
    assert grow.lr_factor() == 16.0
    assert grow.summary()["final_per_rank_batch"] == 64 and grow.summary()["largest_per_rank_batch"] == 64
    # a step of 4 forwards of 4 loader batches each: 16 loader batches of every rank, 512 samples on the clock
    before = grow.state.samples
    grow.step_done(4)
    assert grow.state.samples - before == 512


def test_a_per_rank_limit_off_the_doublings_and_a_largest_batch_off_them_are_kept():
    # --max-batch-size 100 allows 64 a rank (16 x 4), not 128; --max-global-batch 384 is 12 loader batches
    # a step: 64 a rank by merging 4, then 3 forwards of them (one and a half doublings of the accumulation)
    odd = schedule("adaptive", max_global_batch=384, max_batch_size=100)
    assert odd.max_merge == 4 and odd.top == 12
    for _ in range(20):
        odd.noise_read(*norms(1e6, odd.global_batch, 2 * odd.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert (odd.per_rank_batch, odd.accum, odd.global_batch) == (64, 3, 384)


def test_a_checkpoint_from_before_per_rank_growth_resumes_with_its_batch():
    old = schedule("warmup", max_batch_size=64)
    old.load_state_dict({"accum": 2, "samples": 500, "ema_g2": 0.0, "ema_trace": 0.0, "ema_weight": 0.0, "above": 0})
    assert (old.merge, old.accum, old.global_batch) == (1, 2, 64)


@pytest.mark.parametrize(
    ("fields", "told"),
    [
        ({"batch_schedule": "warmup", "max_batch_size": 63}, "--max-batch-size 63 leaves the per-rank batch no room"),
        ({"max_batch_size": 64}, "--max-batch-size applies to --batch-schedule warmup or adaptive"),
    ],
)
def test_a_per_rank_limit_that_cannot_be_used_is_refused(fields, told):
    with pytest.raises(ValidationError, match=told):
        TrainConfig(batch_size=32, **fields)


def test_adaptive_asks_for_the_throughput_of_the_next_doubling_and_not_past_the_largest():
    # per-rank 16 may grow to 32 (merge), then the accumulation: the speedup is asked of those layouts
    asked = []

    def speedup(merge, accum):
        asked.append((merge, accum))
        return 2.0  # compute-bound: twice the batch, twice the samples a second

    adapt = schedule("adaptive", max_batch_size=32, max_global_batch=128)
    for _ in range(8):
        adapt.noise_read(*norms(1e4, adapt.global_batch, 2 * adapt.global_batch), steps=EMA_STEPS, speedup=speedup)
    assert (adapt.per_rank_batch, adapt.accum, adapt.global_batch) == (32, 2, 128)
    assert sorted(set(asked)) == [(2, 1), (2, 2)]  # never a layout past the largest
    assert adapt.last_gain is None  # at the largest batch there is no next one to weigh


def test_no_throughput_gain_no_growth_whatever_the_noise():
    flat = schedule("adaptive", max_global_batch=1024)
    for _ in range(10):
        flat.noise_read(
            *norms(1e6, flat.global_batch, 2 * flat.global_batch), steps=EMA_STEPS, speedup=lambda m, a: 1.0
        )
    assert flat.global_batch == 32 and flat.last_gain == pytest.approx((1e6 + 32) / (1e6 + 64))


def one_worker(**fields) -> BatchSchedule:
    # one worker of 16 with --grad-accum 2 (adaptive's small batch is its first micro-batch): 32 a step
    return BatchSchedule(TrainConfig(batch_size=16, grad_accum=2, batch_schedule="adaptive", **fields), 1000)


def test_from_an_accumulation_of_two_the_per_rank_batch_grows_first_in_whole_numbers():
    grow = one_worker(max_batch_size=64, max_global_batch=512)
    seen = []
    for _ in range(12):
        if grow.noise_read(*norms(1e6, grow.per_rank_batch, grow.global_batch), steps=EMA_STEPS, speedup=GAIN):
            seen.append((grow.merge, grow.accum))
    assert seen == [(2, 2), (4, 2), (4, 4), (4, 8)] and grow.global_batch == 512
    # a largest batch off the doublings: 96 is 6 batches of 16; the per-rank batch stops at 32, where 64 a
    # rank would take 2 x 64 = 128, and the accumulation takes the rest, 3 forwards of 32
    odd = one_worker(max_batch_size=64, max_global_batch=96)
    for _ in range(8):
        odd.noise_read(*norms(1e6, odd.per_rank_batch, odd.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert (odd.merge, odd.accum, odd.global_batch) == (2, 3, 96) and isinstance(odd.accum, int)
    assert largest_merge(TrainConfig(batch_size=16, batch_schedule="warmup", max_batch_size=100)) == 4
    assert largest_merge(TrainConfig(batch_size=16)) == 1


def test_a_doubling_that_promises_exactly_the_threshold_counts_and_warmup_promises_none():
    # B_noise exactly 1 (norms 1 + 1/32 and 1 + 1/64 at 32 and 64): the efficiency of 64 is 33 / 65, and
    # a throughput gain of 2.0681818181818183 makes the goodput gain exactly 1.05 in floating point
    edge = schedule("adaptive")
    for _ in range(2):
        grown = edge.noise_read(
            1 + 1 / 32, 1 + 1 / 64, 32, 64, steps=EMA_STEPS, speedup=lambda m, a: 2.0681818181818183
        )
    assert edge.noise_scale() == 1.0 and edge.last_gain == 1.05 and grown == 64
    assert schedule("warmup").last_gain is None


def _script_schedule(grad_accum: int, inner: list[float], last: list[float], steps: list[float]):
    """paratrain.batch_schedule's object in one process (fixed: no launch), with the timings given."""
    from paratrain.engine.script_schedule import batch_schedule

    model = torch.nn.Linear(2, 1)
    made = batch_schedule(model, torch.optim.SGD(model.parameters(), lr=0.1), batch_size=4, grad_accum=grad_accum)
    made.inner_s, made.last_s, made.step_s = inner, last, steps
    return made


def test_a_scripts_doubling_keeps_the_rest_of_the_step_and_doubles_its_micro_steps():
    # one micro-step a step (1 s, the synchronisation in it) and 2 s of the rest: 2 x 3 s / (2 x 1 + 2) s
    assert _script_schedule(1, [], [1.0], [3.0])._doubling_speedup(1, 2) == pytest.approx(1.5)
    # two a step: the median of the micro-steps that do not synchronise (1 s), the rest 4 - 2 x 1 = 2 s
    assert _script_schedule(2, [1.0, 5.0, 1.0], [9.0], [4.0, 4.5, 3.5])._doubling_speedup(1, 4) == pytest.approx(4 / 3)
    # micro-steps of 2 s, steps of 7 s: a rest of 3 s; 4 x 7 / (8 + 3) / 2 = 14/11
    assert _script_schedule(2, [2.0, 2.0], [5.0], [7.0])._doubling_speedup(1, 4) == pytest.approx(14 / 11)
    # two ranks that measured alike: their sum over the ranks, averaged, is the same gain
    two = _script_schedule(2, [2.0, 2.0], [5.0], [7.0])
    two.world, two._total = 2, lambda values: [2 * v for v in values]
    assert two._doubling_speedup(1, 4) == pytest.approx(14 / 11)
    # a step no longer than its micro-steps has no rest to share: no gain
    assert _script_schedule(2, [1.0], [1.0], [1.5])._doubling_speedup(1, 4) == pytest.approx(1.0)


def test_a_script_outside_launch_keeps_its_own_accumulation_and_times_its_micro_steps(monkeypatch):
    fixed = _script_schedule(3, [], [], [])
    fixed.log_every = 1  # a reading at every step: a fixed schedule has nothing to read
    assert fixed.accum == 3 and fixed.recorder is None and fixed.run_dir is None
    # the step starts at 0; micro-steps of 1 s, 1 s and (the synchronising one) 3 s; the step is done at 6
    clock = iter([0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 5.0, 6.0])
    monkeypatch.setattr(fixed, "_now", lambda timed: next(clock))
    assert list(fixed.micro_steps()) == [0, 1, 2]
    fixed.step_done()
    assert (fixed.inner_s, fixed.last_s, fixed.step_s) == ([1.0, 1.0], [3.0], [6.0])
    assert fixed.accum == 3 and fixed.lr_factor == 1.0 and fixed.optimizer.param_groups[0]["lr"] == 0.1


def test_a_scripts_micro_steps_skip_ddps_synchronisation_but_the_last():
    """DDP on a one-rank gloo group: its require_backward_grad_sync is what no_sync switches off."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from paratrain.engine.script_schedule import batch_schedule

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        made = batch_schedule(model, torch.optim.SGD(model.parameters(), lr=0.1), batch_size=4, grad_accum=3)
        assert [model.require_backward_grad_sync for _ in made.micro_steps()] == [False, False, True]
    finally:
        dist.destroy_process_group()


def test_a_scripts_fsdp_replicas_are_read_from_its_parameters_placements():
    """One rank's gloo group: a 1-D mesh holds each shard once; HSDP's 2-D mesh (Replicate, Shard) as many times as
    its first dimension; FSDP over tensor-parallel pieces (Shard, Shard) has no reading (adaptive refuses it)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from paratrain.engine.script_schedule import _replicas_of_shards

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert _replicas_of_shards(fully_shard(torch.nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1,)))) == 1
        grid = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        hsdp = fully_shard(torch.nn.Linear(2, 2), mesh=grid)
        assert [type(p).__name__ for p in next(hsdp.parameters()).placements] == ["Replicate", "Shard"]
        assert _replicas_of_shards(hsdp) == 1
        split = parallelize_module(torch.nn.Linear(2, 2), grid["tp"], ColwiseParallel())
        assert _replicas_of_shards(fully_shard(split, mesh=grid["dp"])) is None
    finally:
        dist.destroy_process_group()


def test_a_scripts_warmup_moves_its_lr_with_the_batch_and_resumes_where_it_was(monkeypatch):
    """One process, warmup from 4 to 16 over an epoch of 64 samples: doublings once a third (22 samples) and two
    thirds (43) are trained on, the optimizer's LR doubled at each; a schedule loaded from its state_dict is at
    the batch and LR factor it had reached."""
    from paratrain.engine.script_schedule import batch_schedule

    monkeypatch.setenv("PARATRAIN_BATCH_SCHEDULE", '{"kind": "warmup", "max_global_batch": 16}')
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    made = batch_schedule(model, optimizer, batch_size=4, samples_per_epoch=64)
    seen = []
    for _ in range(9):
        assert len(list(made.micro_steps())) == made.accum
        made.step_done()
        seen.append((made.global_batch, optimizer.param_groups[0]["lr"]))
    # 6 steps of 4 reach 24 >= 21.3; 3 of 8 then reach 48 >= 42.7
    assert seen == [(4, 0.1)] * 5 + [(8, 0.2)] * 3 + [(16, 0.4)]
    again = batch_schedule(torch.nn.Linear(2, 1), optimizer, batch_size=4, samples_per_epoch=64)
    again.load_state_dict(made.state_dict())
    assert (again.accum, again.lr_factor, again.step) == (4, 4.0, 9)


def test_the_ranks_reading_averages_their_small_batches_and_counts_each_step_once():
    """Two ranks' (|small|², |big|²) of the same 10 steps: the reading takes the mean over both ranks' 20 records
    as the steps' norms and folds them in as 10 steps, exactly as one reading of those means would."""
    mine = [(*norms(1000.0, 16, 32)[:2], 16, 32)] * 10
    theirs = [(3.0, norms(1000.0, 16, 32)[1], 16, 32)] * 10
    adapt, alone = schedule("adaptive"), schedule("adaptive")

    def total(values: list[float]) -> list[float]:  # the other rank's figures at the same reading
        other = [sum(m[0] for m in theirs), sum(m[1] for m in theirs), len(theirs), 32, 32 * 32]
        return [a + b for a, b in zip(values, other)]

    assert adapt.noise_read_of_ranks(mine, (16, 32), 2, total, 2, None) is None
    small = (10 * mine[0][0] + 10 * 3.0) / 20
    alone.noise_read(small, mine[0][1], 16, 32, steps=10, speedup=None)
    assert adapt.state == alone.state
    # nothing measured since the last reading: no reading; a fixed schedule reads nothing at all
    assert adapt.noise_read_of_ranks([], (16, 32), 2, lambda v: [0.0, 0.0, 0.0, 64.0, 2048.0], 2, None) is None
    assert adapt.state == alone.state
    assert schedule("fixed").noise_read_of_ranks(mine, (16, 32), 2, total, 2, None) is None


def test_ranks_at_different_batches_are_named_not_left_to_hang():
    adapt = schedule("adaptive")
    with pytest.raises(RuntimeError, match="diverged"):  # this rank at 32, the other at 64
        adapt.noise_read_of_ranks([], (16, 32), 2, lambda v: [v[0], v[1], v[2], v[3] + 64, v[4] + 64 * 64], 2, None)
    adapt.noise_read_of_ranks([], (16, 32), 2, lambda v: [v[0], v[1], v[2], 2 * v[3], 2 * v[4]], 2, None)


def test_a_batch_event_says_where_the_schedule_is_and_what_moved_it():
    adapt = schedule("adaptive", max_global_batch=1024)
    assert adapt.change_event() == {
        "samples": 0,
        "global_batch": 32,
        "per_rank_batch": 16,
        "grad_accum": 1,
        "lr_factor": 1.0,
    }
    for _ in range(2):
        adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN)
    event = adapt.change_event()
    assert (event["global_batch"], event["grad_accum"], event["lr_factor"]) == (64, 2, 2.0)
    assert event["noise_scale"] == pytest.approx(1000.0) and event["goodput_gain"] == pytest.approx(1.4 * 1032 / 1064)


def test_the_ranks_reading_asks_the_throughput_and_grows_as_one_reading_would():
    adapt = schedule("adaptive", max_global_batch=1024)
    steps = [norms(1000.0, 32, 64)] * EMA_STEPS  # one rank (world 1): its own figures are the sums

    def read() -> int | None:
        return adapt.noise_read_of_ranks(steps, (32, 64), 1, lambda values: values, 1, GAIN)

    assert read() is None and read() == 64 and adapt.last_gain == pytest.approx(1.4 * 1032 / 1064)


def test_a_one_process_scripts_adaptive_schedule_reads_its_own_steps_and_records_each_change(tmp_path, monkeypatch):
    """A script's loop in this process, adaptive from 2 micro-steps of 4 (one process: the first micro-step
    against the whole step), a reading every 2 steps, on a clock that ticks one second at each look: every
    micro-step takes 1 s and a step 5 s, so a step's rest is 3 s and doubling to 4 micro-steps gains
    4 x 5 / (4 + 3) / 2 = 10/7 in throughput; fresh random labels keep the noise scale above the batch."""
    import itertools as its

    from paratrain.engine.script_schedule import batch_schedule

    monkeypatch.setenv("PARATRAIN_BATCH_SCHEDULE", '{"kind": "adaptive", "max_global_batch": 16}')
    monkeypatch.setenv("PARATRAIN_RUN_DIR", str(tmp_path))
    clock = its.count()
    model = torch.nn.Linear(8, 4)
    torch.nn.init.zeros_(model.weight)  # uniform predictions: random labels' mean gradient starts at 0
    torch.nn.init.zeros_(model.bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    made = batch_schedule(model, optimizer, batch_size=4, grad_accum=2, log_every=2)
    monkeypatch.setattr(made, "_now", lambda timed: float(next(clock)))
    data = torch.Generator().manual_seed(0)
    batches = ((torch.randn(4, 8, generator=data), torch.randint(0, 4, (4,), generator=data)) for _ in its.count())
    for _ in range(60):
        for _ in made.micro_steps():
            xb, yb = next(batches)
            (torch.nn.functional.cross_entropy(model(xb), yb) / made.accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        made.step_done()
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    changes = [e for e in events if e["event"] == "batch"]
    assert [(c["event"], c["global_batch"], c["grad_accum"], c["lr_factor"]) for c in changes] == [
        ("batch", 16, 4, 2.0)
    ]
    change = changes[0]
    # a `noise` event at every reading, the batch it read at and what the next doubling promised, written
    # before the change it led to; at the largest batch (16) there is no doubling left to weigh
    readings = [e for e in events if e["event"] == "noise"]
    assert [r["step"] for r in readings] == list(range(2, 61, 2))
    assert events.index(change) == events.index(next(r for r in readings if r["step"] == change["step"])) + 1
    assert {r["global_batch"] for r in readings if r["step"] <= change["step"]} == {8}
    assert all(r["global_batch"] == 16 and "goodput_gain" not in r for r in readings if r["step"] > change["step"])
    moved = next(r for r in readings if r["step"] == change["step"])
    assert (moved["goodput_gain"], moved["noise_scale"]) == (change["goodput_gain"], change["noise_scale"])
    # read at a log point once the average holds EMA_STEPS' worth (weight 1 - 0.95^n >= 1 - 1/e: n >= 20), the
    # second reading above
    assert change["step"] % 2 == 0 and 20 <= change["step"] <= 30 and change["samples"] == 8 * change["step"]
    noise = change["noise_scale"]
    assert noise > 16 and change["goodput_gain"] == pytest.approx(10 / 7 * (noise + 8) / (noise + 16))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2) and made.lr_factor == 2.0
    state = json.loads((tmp_path / "batch_schedule.json").read_text())
    assert (state["kind"], state["start_global_batch"], state["final_global_batch"]) == ("adaptive", 8, 16)
    assert state["noise_scale"] == pytest.approx(made.schedule.noise_scale())
    norms_file = [json.loads(line) for line in (tmp_path / "grad_noise" / "rank0.jsonl").read_text().splitlines()]
    assert [n["step"] for n in norms_file] == list(range(1, 61))  # every step's pair, at the readings
    assert {(n["small_batch"], n["big_batch"]) for n in norms_file[: change["step"]]} == {(4, 8)}
    assert {(n["small_batch"], n["big_batch"]) for n in norms_file[change["step"] :]} == {(4, 16)}


def test_the_noise_scales_error_is_noise_scales_delta_method_over_the_readings():
    # Readings of one step each weigh as `paratrain noise-scale` weighs its steps: folded in one at a time, the
    # average and its standard error equal that command's, computed over the whole list at once.
    from paratrain.batch.noise_scale import _ratio_with_error

    adapt = schedule("adaptive")
    assert adapt.noise_scale_stderr() is None  # nothing read
    readings = [norms(noise, 32, 64, g2=g2) for noise, g2 in ((50.0, 1.0), (80.0, 0.7), (65.0, 1.3), (120.0, 0.5))]
    adapt.noise_read(*readings[0], steps=1, speedup=None)
    assert adapt.noise_scale() == pytest.approx(50.0) and adapt.noise_scale_stderr() is None  # one reading: no scatter
    for reading in readings[1:]:
        adapt.noise_read(*reading, steps=1, speedup=None)
    g2s, traces = zip(*(two_batch_estimates(*r) for r in readings))
    beta = 1 - 1 / EMA_STEPS
    weights = [(1 - beta) * beta ** (len(readings) - 1 - i) for i in range(len(readings))]
    ratio, error = _ratio_with_error(list(traces), list(g2s), weights)
    assert adapt.noise_scale() == pytest.approx(ratio, rel=1e-12)
    assert adapt.noise_scale_stderr() == pytest.approx(error, rel=1e-9) and error > 5
    # the same reading over and over scatters not at all
    steady = schedule("adaptive")
    for _ in range(3):
        steady.noise_read(*norms(64.0, 32, 64), steps=7, speedup=None)
    assert steady.noise_scale_stderr() == pytest.approx(0.0, abs=1e-9)


def test_every_log_points_reading_is_kept_once_with_what_it_weighed_before_it_doubled():
    adapt = schedule("adaptive", max_global_batch=1024)
    adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=None)  # an epoch's end: folded in, no reading
    assert adapt.take_reading() is None
    assert adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) is None
    first = adapt.take_reading()
    assert first is not None and adapt.take_reading() is None  # once
    assert first["global_batch"] == 32 and first["next_global_batch"] == 64 and first["samples"] == 0
    assert first["noise_scale"] == pytest.approx(1000.0) and first["noise_scale_stderr"] == pytest.approx(0.0, abs=1e-6)
    assert first["goodput_gain"] == pytest.approx(1.4 * 1032 / 1064)
    assert adapt.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN) == 64
    second = adapt.take_reading()
    assert second["global_batch"] == 32 and adapt.global_batch == 64  # the batch it read at, not the one it made
    # at the largest batch there is no next doubling, and no gain to promise
    top = schedule("adaptive", max_global_batch=64)
    for _ in range(3):  # above, doubled to the largest, then read there
        top.noise_read(*norms(1000.0, top.global_batch, 2 * top.global_batch), steps=EMA_STEPS, speedup=GAIN)
    reading = top.take_reading()
    assert reading["global_batch"] == 64 and "next_global_batch" not in reading and "goodput_gain" not in reading
    # before the noise scale is known: the batch alone
    unknown = schedule("adaptive")
    unknown.noise_read(3.0, 1.0, 32, 64, steps=5, speedup=GAIN)  # |G|² below zero
    assert unknown.take_reading() == {"samples": 0, "global_batch": 32, "next_global_batch": 64}


def test_an_adaptive_summary_says_why_the_batch_stayed_and_warmups_does_not_pretend_to():
    adapt = schedule("adaptive", max_global_batch=1024)
    for _ in range(3):
        adapt.noise_read(*norms(16.0, 32, 64), steps=EMA_STEPS, speedup=GAIN)  # 1.4 x 48/80 = 0.84: never grows
    block = adapt.summary()
    assert block["final_global_batch"] == 32 and block["noise_scale"] == pytest.approx(16.0)
    assert block["goodput_gain"] == pytest.approx(1.4 * 48 / 80) and block["min_goodput_gain"] == 1.05
    assert block["noise_scale_stderr"] == pytest.approx(0.0, abs=1e-6)
    assert (block["readings_above"], block["readings_needed"], block["average_settled"]) == (0, 2, True)
    assert not {"goodput_gain", "noise_scale_stderr", "min_goodput_gain"} & set(schedule("warmup").summary())


def test_the_run_says_in_words_where_the_batch_went_and_why_it_stopped():
    from paratrain.reporting.verdict import batch_schedule_line

    assert batch_schedule_line(None) is None
    held = schedule("adaptive", max_global_batch=1024)
    for _ in range(3):
        held.noise_read(*norms(16.0, 32, 64), steps=EMA_STEPS, speedup=GAIN)
    assert batch_schedule_line(held.summary()) == (
        "--batch-schedule adaptive: the global batch stayed at 32: at the last reading a doubling to 64 promised "
        "0.84x the goodput (1.40x the throughput, times 0.60 for the noise scale of 16 ± 0), below the 1.05x it "
        "doubles at"
    )
    # above the bar at the run's last reading: the line says what the doubling waited for
    waiting = schedule("adaptive", max_global_batch=1024)
    waiting.noise_read(*norms(1000.0, 32, 64), steps=EMA_STEPS, speedup=GAIN)
    assert batch_schedule_line(waiting.summary()).endswith(
        "above the 1.05x it doubles at, but the run ended first: 1 reading(s) in a row said so of the 2 it waits for"
    )
    unsettled = schedule("adaptive", max_global_batch=1024)
    unsettled.noise_read(*norms(1000.0, 32, 64), steps=3, speedup=GAIN)
    assert batch_schedule_line(unsettled.summary()).endswith(
        "but the run ended first: the noise scale's average had not yet settled"
    )
    grown = schedule("adaptive", max_global_batch=128)
    for _ in range(6):
        grown.noise_read(*norms(1e4, grown.global_batch, 2 * grown.global_batch), steps=EMA_STEPS, speedup=GAIN)
    assert batch_schedule_line(grown.summary()) == (
        "--batch-schedule adaptive: the global batch grew from 32 to 128, its largest (--max-global-batch 128)"
    )
    unknown = schedule("adaptive")
    unknown.noise_read(3.0, 1.0, 32, 64, steps=EMA_STEPS, speedup=GAIN)
    assert "stayed at 32: at the last reading the gradient's norm could not be told" in batch_schedule_line(
        unknown.summary()
    )
    earlier = {**held.summary(), "goodput_gain": None, "noise_scale_stderr": None}  # an earlier release's summary
    assert batch_schedule_line(earlier).endswith("stayed at 32; the noise scale read 16 at the end")
    ramp = schedule("warmup", batch_ramp_epochs=2.0, max_global_batch=128)
    ramp.step_done(40)  # 1,280 samples of the 2,000 the ramp takes: into its second third, one doubling of two
    assert batch_schedule_line(ramp.summary()) == "--batch-schedule warmup: the global batch grew from 32 to 64"
