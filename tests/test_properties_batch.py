"""Properties (#58) of the batch tools in every shape: find-batch's search and knee against any planted limit and
throughput curve, the gradient noise scale over any split of a global batch into ranks x micro-batches x
accumulation, recommend's choice against every bound it names, and lr-find's rule."""

from __future__ import annotations

import itertools
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from paratrain.batch.find_batch import _outcome, binsearch, knee
from paratrain.batch.lr_find import DIVERGED_ABOVE, smooth, suggest
from paratrain.batch.noise_scale import estimate, read_norms, short_steps
from paratrain.batch.recommend import MIN_STEPS_PER_EPOCH, BatchChoice, steps_bound
from paratrain.config import TrainConfig
from paratrain.engine.grad_noise import BucketNorms, GradNoiseRecorder
from paratrain.engine.lr import scaled_lr

FEW = settings(max_examples=60, deadline=None)


# -- find-batch -----------------------------------------------------------------------------------------------


@FEW
@given(limit=st.integers(1, 5000), cap=st.integers(1, 5000), start=st.integers(1, 64))
def test_binsearch_finds_any_planted_limit_exactly_within_its_cap(limit, cap, start):
    """Doubling from any start that fits, then bisecting: the largest batch that fits (the limit, or the cap), the
    first that does not, each batch probed once, never past the cap, in a logarithmic number of probes."""
    assume(start <= min(limit, cap))
    probed = []
    largest, failed = binsearch(lambda b: probed.append(b) or b <= limit, start, cap)
    assert (largest, failed) == ((limit, limit + 1) if limit < cap else (cap, None))
    assert len(probed) == len(set(probed)) and max(probed, default=start) <= cap
    assert len(probed) <= 2 * math.ceil(math.log2(min(limit, cap) + 1)) + 1


@FEW
@given(
    rates=st.dictionaries(st.integers(1, 4096), st.floats(0.01, 1e6), min_size=1, max_size=12),
    within=st.floats(0.0, 0.5),
)
def test_the_knee_is_the_smallest_batch_within_its_tolerance_of_the_best(rates, within):
    points = list(rates.items())
    chosen = knee(points, within)
    best = max(rates.values())
    assert rates[chosen] >= (1 - within) * best
    assert all(rate < (1 - within) * best for batch, rate in points if batch < chosen)


@st.composite
def find_batch_results(draw: Any, cap: int) -> dict[str, Any]:
    """find_batch.json's findings (its _outcome) of a search up to `cap` against a planted memory limit and a
    saturating throughput curve with some scatter, as a search on one worker leaves them."""
    limit = draw(st.integers(1, 4096))
    peak, half = draw(st.floats(10.0, 1e5)), draw(st.floats(0.5, 512.0))
    probes: dict[int, dict[str, Any]] = {}

    def fits(batch: int) -> bool:
        fitted = batch <= limit
        rate = peak * batch / (batch + half) * draw(st.floats(0.9, 1.1)) if fitted else None
        probes[batch] = {"batch": batch, "fits": fitted, "samples_per_s": rate}
        return fitted

    fits(1)
    largest, failed = binsearch(fits, 1, cap)
    margin, within = draw(st.sampled_from([0.05, 0.1, 0.3])), draw(st.sampled_from([0.05, 0.1]))
    return _outcome(probes, largest, failed, cap, "at least 20 optimizer steps an epoch", margin, within)


@FEW
@given(data=st.data(), cap=st.integers(1, 5000))
def test_find_batchs_batch_to_use_stays_under_the_largest_that_fitted_and_names_what_stopped_it(data, cap):
    found = data.draw(find_batch_results(cap))
    assert 1 <= found["safe_batch"] <= found["max_batch"] <= cap
    fitted = [p["batch"] for p in found["probes"] if p["fits"]]
    assert found["max_batch"] == max(fitted) and found["knee_batch"] in fitted
    if found["limited_by"] == "memory":
        assert found["first_failed"] == found["max_batch"] + 1
        assert found["safe_batch"] == max(1, int(found["max_batch"] * (1 - found["margin"])))
    else:
        assert (found["first_failed"], found["max_batch"], found["safe_batch"]) == (None, cap, cap)


# -- the noise scale ------------------------------------------------------------------------------------------


def planted_norms(noise: float, g2: float, small: int, big: int) -> tuple[float, float]:
    """The expected squared norms of a small and a big batch's mean gradient: |G|² + tr(Σ)/b (McCandlish et al.)."""
    return g2 + noise * g2 / small, g2 + noise * g2 / big


@settings(max_examples=40, deadline=None)
@given(
    ranks=st.integers(1, 64),
    micro=st.integers(1, 256),
    accum=st.integers(1, 8),
    noise=st.floats(0.5, 1e5),
    g2=st.floats(1e-4, 1e3),
    steps=st.integers(1, 4),
    scatter=st.floats(0.0, 0.5),
)
@example(ranks=2, micro=16, accum=2, noise=65.0, g2=1.0, steps=2, scatter=0.2)
def test_the_noise_scale_does_not_depend_on_how_one_global_batch_is_split(
    ranks, micro, accum, noise, g2, steps, scatter
):
    """Any ranks x micro-batch x accumulation: each rank records its step's two squared norms with the batch sizes
    they are of (the rank's accumulated step and the global batch; one worker, its first micro-batch and the step),
    noise-scale averages the ranks' and recovers the planted B_simple from the expected norms at those sizes. The
    ranks' small norms scatter around their mean, as real ranks' do."""
    if ranks == 1:
        accum = max(accum, 2)  # one worker compares a micro-batch with the step: noise-scale sets --grad-accum 2
    cfg = TrainConfig(batch_size=micro, grad_accum=accum)
    with tempfile.TemporaryDirectory() as root:
        for rank in range(ranks):
            norms = BucketNorms() if ranks > 1 else None
            recorder = GradNoiseRecorder(cfg, rank, ranks, Path(root), norms, "gloo")
            small_batch, big_batch = recorder.batches(micro, accum)
            assert big_batch == ranks * micro * accum  # the global batch
            assert small_batch == (micro * accum if ranks > 1 else micro)  # what one rank's gradient averaged
            small_sq, big_sq = planted_norms(noise, g2, small_batch, big_batch)
            # rank r's small norm off the mean by +-scatter, in pairs that cancel (an odd last rank: none)
            off = 0.0 if rank == ranks - 1 and ranks % 2 else scatter * (1 if rank % 2 else -1)
            for step in range(1, steps + 1):
                mine = torch.tensor(small_sq * (1 + off), dtype=torch.float64)
                recorder.pending.append((step, mine, torch.tensor(big_sq, dtype=torch.float64), micro, accum))
            recorder.flush()
        norms_read = read_norms(Path(root))
    assert [n["step"] for n in norms_read] == list(range(1, steps + 1))
    found = estimate(norms_read, ema_steps=10)
    assert found["b_simple"] == pytest.approx(noise, rel=1e-6) and found["b_simple_run"] == pytest.approx(
        noise, rel=1e-6
    )


def recorded_steps(per_rank: int, batch: int, accum: int, total: int) -> list[bool]:
    """Whether each of a run's first `total` steps is recorded, epoch after epoch as the loop runs them: a step of
    `accum` whole micro-batches is; an epoch's last, short of micro-steps or of samples, is not."""
    micro = [min(batch, per_rank - start) for start in range(0, per_rank, batch)]
    groups = [micro[start : start + accum] for start in range(0, len(micro), accum)]
    epoch = [len(group) == accum and all(n == batch for n in group) for group in groups]
    return list(itertools.islice(itertools.cycle(epoch), total))


@FEW
@given(
    per_rank=st.integers(1, 5000),
    batch=st.integers(1, 256),
    accum=st.integers(1, 8),
    steps=st.integers(20, 400),
)
@example(per_rank=4096, batch=16, accum=3, steps=300)  # 2 ranks of the regression in tests/test_batch.py
def test_noise_scale_runs_exactly_the_steps_that_record_the_full_steps_asked_for(per_rank, batch, accum, steps):
    """Each epoch ends in steps that are not recorded (short of micro-steps or samples): the run takes as many
    more as fall before the last full step asked for, so it records `steps` full ones and its last step is one."""
    assume(per_rank >= batch * accum)  # else refused with a message
    total = steps + short_steps(per_rank, batch, accum, steps)
    recorded = recorded_steps(per_rank, batch, accum, total)
    assert sum(recorded) == steps and recorded[-1]


@settings(max_examples=25, deadline=None)
@given(micro=st.integers(1, 8), accum=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_one_workers_small_batch_is_its_first_micro_batch_and_its_big_batch_the_whole_step(micro, accum, seed):
    """A real model and backward: with the loss of each micro-step divided by the accumulation, the recorder's
    small norm is the squared norm of the first micro-batch's mean gradient and its big norm the step's."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(micro * accum, 3, generator=gen), torch.randn(micro * accum, 2, generator=gen)
    model = torch.nn.Linear(3, 2)

    def mean_gradient_sq(rows: slice) -> float:
        fresh = torch.nn.Linear(3, 2)
        fresh.load_state_dict(model.state_dict())
        torch.nn.functional.mse_loss(fresh(x[rows]), y[rows]).backward()
        return sum(float(p.grad.pow(2).sum()) for p in fresh.parameters())

    with tempfile.TemporaryDirectory() as root:
        recorder = GradNoiseRecorder(TrainConfig(batch_size=micro, grad_accum=accum), 0, 1, Path(root), None, None)
        for index in range(accum):
            rows = slice(index * micro, (index + 1) * micro)
            (torch.nn.functional.mse_loss(model(x[rows]), y[rows]) / accum).backward()
            recorder.micro_step(model, index, index == accum - 1, micro, 1, micro, accum)
        ((_, small, big, *_),) = recorder.pending
    assert float(small) == pytest.approx(mean_gradient_sq(slice(0, micro)), rel=1e-4)
    assert float(big) == pytest.approx(mean_gradient_sq(slice(0, micro * accum)), rel=1e-4)


# -- recommend ------------------------------------------------------------------------------------------------


@FEW
@given(samples=st.integers(1, 10**8), workers=st.integers(1, 64), accum=st.integers(1, 16))
def test_the_steps_bound_is_the_largest_batch_leaving_twenty_steps_an_epoch(samples, workers, accum):
    bound = steps_bound(samples, workers, accum)

    def steps(batch: int) -> int:
        return -(-samples // (workers * accum * batch))

    note = bound.note(samples, workers, accum)
    if steps(1) >= MIN_STEPS_PER_EPOCH:
        assert steps(bound.batch) >= MIN_STEPS_PER_EPOCH and steps(bound.batch + 1) <= MIN_STEPS_PER_EPOCH
        assert samples // (workers * accum * (bound.batch + 1)) < MIN_STEPS_PER_EPOCH  # not a whole 20 steps more
        assert f"searched up to {bound.batch:,} a worker" in note
    else:
        assert bound.batch == 1 and f"only {steps(1)} optimizer steps an epoch even at batch 1" in note


@st.composite
def measurements(draw: Any) -> dict[str, Any]:
    """What recommend combines: find-batch's result on one worker, searched up to the steps bound, and the noise
    scale on the N workers (or none measured)."""
    samples, workers, accum = draw(st.integers(100, 10**7)), draw(st.integers(1, 64)), draw(st.integers(1, 4))
    found = draw(find_batch_results(steps_bound(samples, workers, accum).batch))
    critical = draw(st.none() | st.floats(0.5, 1e6))
    stderr = draw(st.none() | st.floats(0.0, 1e5)) if critical else None
    noise = {"critical_batch": critical, "b_simple_stderr": stderr}
    return {"batches": found, "noise": noise, "workers": workers, "samples": samples, "accum": accum}


@settings(max_examples=150, deadline=None)
@given(measured=measurements())
def test_a_recommended_batch_respects_every_bound_it_names_and_its_notes_say_so(measured):
    found, noise, workers, samples = (measured[k] for k in ("batches", "noise", "workers", "samples"))
    choice = BatchChoice.measured(found, noise, workers, samples)
    per_worker, largest = choice.per_worker, found["safe_batch"]
    knee_batch = min(found["knee_batch"], largest)  # the knee a worker can use: a probe past the margin is not
    critical, stderr = noise["critical_batch"], noise["b_simple_stderr"]
    # the largest batch that fits, less the margin: never above it
    assert 1 <= per_worker <= largest, (per_worker, knee_batch, largest)
    # at least 20 optimizer steps an epoch, where 20 are possible at all
    bound = steps_bound(samples, workers, measured["accum"])
    assert per_worker <= bound.batch
    # below the knee only where the noise scale says so beyond its error bar
    if per_worker < knee_batch:
        assert critical is not None and stderr is not None and critical + 2 * stderr < workers * knee_batch
    # the cap: the smaller of the critical batch and √(training samples), exceeded only at the knee, or at 1 a
    # worker, the least there is
    cap = min(c for c in (critical, math.isqrt(samples)) if c)
    assert choice.global_batch == workers * per_worker
    assert choice.global_batch <= cap or per_worker in (knee_batch, 1)
    # the choice is one of the options weighed, not ruled out, and the fastest of those to the loss
    assert per_worker in choice.options and choice.ruled_out(per_worker) is None
    if critical:
        allowed = [b for b in choice.options if choice.ruled_out(b) is None]
        assert choice.times[per_worker] == min(choice.times[b] for b in allowed)
        (note,) = [n for n in choice.notes if n.startswith("time to the same loss")]
        assert f"{per_worker:,} a worker wins" in note and note.count(", chosen") == 1
        chosen = re.search(r"([\d,]+) a worker \((?:[^()]|\([^()]*\))*\): [\d.,]+x, chosen", note)
        assert chosen is not None and chosen.group(1) == f"{per_worker:,}", note
    # the notes and the source say the same of the cap as the choice does
    assert any("exceed the" in n for n in choice.notes) == (workers * knee_batch > cap)
    assert any("below its knee" in n or "below the knee batch" in n for n in choice.notes) == (per_worker < knee_batch)
    source = choice.fields(found["margin"])["per_worker_batch"]["source"]
    assert f" {cap:,.0f}" in source and ("the global batch within the" in source) == (choice.global_batch <= cap)
    assert (f" {cap:,.0f}, at the knee (note)" in source) == (choice.global_batch > cap and per_worker == knee_batch)


# -- lr-find --------------------------------------------------------------------------------------------------

# A loss that wanders by up to x1.8 a step (a random walk of its logarithm): valleys, plateaus and blow-ups.
LOSSES = st.lists(st.floats(-0.6, 0.6), min_size=6, max_size=80).map(
    lambda steps: [math.exp(sum(steps[: i + 1])) for i in range(len(steps))]
)


@FEW
@given(losses=LOSSES, constant=st.floats(0.01, 100.0))
def test_the_smoothed_loss_of_a_constant_is_that_constant_and_follows_any_scale(losses, constant):
    """The bias-corrected average: a constant curve stays itself from the first step; the curve of c x the losses
    is c x the curve."""
    assert smooth([constant] * len(losses)) == pytest.approx([constant] * len(losses), rel=1e-9)
    assert smooth([constant * v for v in losses]) == pytest.approx([constant * v for v in smooth(losses)], rel=1e-9)


@FEW
@given(losses=LOSSES, start=st.floats(1e-7, 1e-3), per_step=st.floats(1.05, 2.0), scale=st.floats(0.1, 10.0))
def test_lr_finds_suggestion_is_a_tenth_of_the_lowest_point_before_divergence_in_any_units(
    losses, start, per_step, scale
):
    """On any curve: no smoothed loss before the cut exceeds 4x the lowest so far and the first after it does; the
    suggestion is a tenth of the LR of the lowest point before the cut; a loss in other units (x scale) suggests
    the same LR, and LRs x scale suggest scale x it."""
    lrs = [start * per_step**i for i in range(len(losses))]
    smoothed = smooth(losses)
    try:
        found = suggest(lrs, losses)
    except Exception:  # fewer than 5 steps before the loss diverged: refused, with a message
        end = next(i for i in range(len(smoothed)) if smoothed[i] > DIVERGED_ABOVE * min(smoothed[: i + 1]))
        assert end < 5
        return
    end = found["curve_steps"]
    assert all(smoothed[i] <= DIVERGED_ABOVE * min(smoothed[: i + 1]) for i in range(end))
    if end < len(losses):
        assert smoothed[end] > DIVERGED_ABOVE * min(smoothed[: end + 1]) and found["diverged_at_lr"] == lrs[end]
    lowest = min(range(end), key=smoothed.__getitem__)
    assert found["minimum_lr"] == lrs[lowest] and found["suggested_lr"] == pytest.approx(lrs[lowest] / 10)
    assert suggest(lrs, [scale * v for v in losses])["suggested_lr"] == pytest.approx(found["suggested_lr"])
    assert suggest([scale * lr for lr in lrs], losses)["suggested_lr"] == pytest.approx(scale * found["suggested_lr"])


@FEW
@given(
    lr=st.floats(1e-6, 10.0),
    batches=st.lists(st.integers(1, 2**16), min_size=3, max_size=3),
    rule=st.sampled_from(["linear", "sqrt", "none"]),
)
def test_the_lr_scales_to_any_batch_by_its_rule_in_one_step_or_two(lr, batches, rule):
    """The LR found at a batch, scaled to another by the optimizer's rule: by the ratio (linear), its square root,
    or not at all; scaling through a third batch on the way gives the same LR."""
    first, second, third = batches
    power = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}[rule]
    assert scaled_lr(lr, second, first, rule) == pytest.approx(lr * (second / first) ** power, rel=1e-12)
    through = scaled_lr(scaled_lr(lr, second, first, rule), third, second, rule)
    assert through == pytest.approx(scaled_lr(lr, third, first, rule), rel=1e-12)
