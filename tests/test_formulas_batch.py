"""lr-find's suggestion rule and find-batch's search, safety margin and knee, pinned exactly (issue #25).

The LR finder's curves are built backwards from a chosen smoothed curve (inverting the
bias-corrected moving average by hand below), so the lowest point, the divergence cut and the
steepest descent are known without running the finder's own smoothing. find-batch runs for real on
the synthetic workload with its probe replaced by a table: which batches fit and how fast each ran.
"""
import math

import pytest

from paratrain.batch import find_batch as fb
from paratrain.batch.lr_find import DIVERGED_ABOVE, SMOOTHING, scaling_rule, smooth, suggest
from paratrain.engine.lr import scaled_lr
from paratrain.errors import RunFailed

BETA = 0.98


def losses_for(smoothed: list[float]) -> list[float]:
    """The raw losses whose bias-corrected EMA (beta 0.98) is `smoothed`: a_i = s_i (1 - beta^i),
    loss_i = (a_i - beta a_(i-1)) / (1 - beta)."""
    out, previous = [], 0.0
    for i, s in enumerate(smoothed, 1):
        average = s * (1 - BETA ** i)
        out.append((average - BETA * previous) / (1 - BETA))
        previous = average
    return out


def lrs(n: int) -> list[float]:
    return [1e-6 * 10 ** (i / 4) for i in range(n)]     # 4 points a decade


def test_smoothing_is_the_bias_corrected_ema_of_fastai():
    assert (SMOOTHING, DIVERGED_ABOVE) == (0.98, 4.0)
    # step 1: 0.02 x 1 / 0.02 = 1; step 2: (0.98 x 0.02 + 0.02 x 2) / (1 - 0.98^2) = 2.98 / 1.98
    assert smooth([1.0, 2.0]) == pytest.approx([1.0, 2.98 / 1.98], rel=1e-12)


def test_suggestion_is_a_tenth_of_the_lowest_point_before_divergence():
    # lowest 1.0 at index 5; 4.5 at index 8 exceeds 4 x 1.0: the curve ends there (index 9, 0.5,
    # lower than everything, is after the cut and must not count)
    curve = [6, 5.5, 4, 2, 1.5, 1, 2, 3, 4.5, 0.5]
    x = lrs(len(curve))
    found = suggest(x, losses_for(curve))
    assert found["minimum_lr"] == pytest.approx(x[5], rel=1e-12)
    assert found["suggested_lr"] == pytest.approx(x[5] / 10, rel=1e-12)
    assert found["diverged_at_lr"] == pytest.approx(x[8], rel=1e-12)
    assert found["curve_steps"] == 8
    # steepest descent: central differences over equal log steps, numerators (i = 1..6) -2, -3.5,
    # -2.5, -1, 0.5, 2: the steepest at i = 2
    assert found["steepest_lr"] == pytest.approx(x[2], rel=1e-12)
    assert found["smoothed"] == pytest.approx(curve[:8], rel=1e-9)


def test_a_loss_exactly_4x_its_minimum_has_not_diverged():
    curve = [3, 2, 1, 1.5, 2, 4, 4.01]
    found = suggest(lrs(7), losses_for(curve))
    assert found["curve_steps"] == 6 and found["diverged_at_lr"] == pytest.approx(lrs(7)[6], rel=1e-12)


def test_no_divergence_keeps_the_whole_curve():
    curve = [5, 4, 3, 2, 1.5]
    found = suggest(lrs(5), losses_for(curve))
    assert found["diverged_at_lr"] is None and found["curve_steps"] == 5
    assert found["minimum_lr"] == pytest.approx(lrs(5)[4], rel=1e-12)


def test_steepest_descent_skips_the_first_tenth_of_the_curve():
    # 20 points: the first 20 // 10 = 2 are skipped, so the plunge at i = 1 (4.9 - 10) does not
    # count; from i = 2 on the differences are -0.15 (4.85 - 5), -0.07, -0.021, then -0.002: i = 2
    curve = [10, 5, 4.9, 4.85, 4.83] + [4.829 - 0.001 * k for k in range(15)]
    found = suggest(lrs(20), losses_for(curve))
    assert found["steepest_lr"] == pytest.approx(lrs(20)[2], rel=1e-12)


def test_steepest_descent_is_per_log_lr_on_uneven_steps_and_may_be_the_last_point():
    # LRs 1, 2, 4, 100, 200 (x 1e-6): central differences over log(LR): i = 1: (3 - 5) / ln 4 = -1.44,
    # i = 2: (2.9 - 4) / ln 50 = -0.28, i = 3: (1 - 3) / ln 50 = -0.51: the steepest is i = 1
    x = [1e-6, 2e-6, 4e-6, 1e-4, 2e-4]
    assert suggest(x, losses_for([5, 4, 3, 2.9, 1]))["steepest_lr"] == pytest.approx(2e-6, rel=1e-12)
    # the last central difference counts: (1 - 4.8) at i = 3 against -0.2 before it
    assert suggest(lrs(5), losses_for([5, 4.9, 4.8, 4.7, 1]))["steepest_lr"] == pytest.approx(lrs(5)[3], rel=1e-12)


def test_a_non_finite_loss_ends_the_curve():
    found = suggest(lrs(8), [3, 2.5, 2, 1.8, 1.6, 1.5, float("nan"), 1.0])
    assert found["curve_steps"] == 6


def test_fewer_than_5_steps_before_divergence_is_an_error():
    with pytest.raises(RunFailed, match="diverged after 4 steps"):
        suggest(lrs(6), losses_for([2, 1.5, 1.2, 1, 5, 5]))


@pytest.mark.parametrize("optimizer,rule", [("sgd", "linear"), ("lars", "linear"), ("adam", "sqrt"), ("adamw", "sqrt"),
                                            ("lamb", "sqrt")])
def test_the_suggestion_scales_by_the_optimizers_rule(optimizer, rule):
    assert scaling_rule(optimizer) == rule


def test_scaled_lr_linear_and_sqrt():
    assert scaled_lr(0.1, 1024, 256, "linear") == pytest.approx(0.4, rel=1e-12)
    assert scaled_lr(0.1, 1024, 256, "sqrt") == pytest.approx(0.2, rel=1e-12)
    assert scaled_lr(0.1, 1024, 256, "none") == 0.1


# -- find-batch --------------------------------------------------------------------------------

def test_knee_is_the_smallest_batch_within_5_percent_of_the_best():
    points = [(8, 80.0), (16, 152.0), (32, 160.0), (64, 158.0)]
    assert fb.knee(points) == 16                         # 152 = 0.95 x 160 exactly: within
    assert fb.knee([(8, 80.0), (16, 151.9), (32, 160.0)]) == 32
    assert fb.knee(points, within=0.5) == 8
    assert fb.knee([(4, 10.0)]) == 4


def test_binsearch_doubles_then_bisects_and_respects_the_cap():
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= 41

    assert fb.binsearch(fits, 1, 1000) == (41, 42)
    assert tried == [2, 4, 8, 16, 32, 64, 48, 40, 44, 42, 41]
    assert fb.binsearch(lambda b: True, 1, 20) == (20, None)           # doubling stops at the cap: 16, then 20
    assert fb.binsearch(lambda b: b <= 20, 1, 20) == (20, None)
    assert fb.binsearch(lambda b: b < 2, 1, 100) == (1, 2)


def run_find_batch(tmp_path, monkeypatch, largest: int, **options) -> dict:
    """find_batch on synthetic-cnn, each probe answered from a table: batches up to `largest` fit,
    and run at 10 samples/s a sample up to 16 (the device saturates there)."""
    def probe(values, steps, run_dir, on_cpu):
        batch = values["batch_size"]
        if batch > largest:
            return {"batch": batch, "fits": False, "error": "out of memory", "samples_per_s": None}
        return {"batch": batch, "fits": True, "error": None, "samples_per_s": 10.0 * min(batch, 16)}

    monkeypatch.setattr(fb, "_probe", probe)
    train = {"workload": "synthetic-cnn", "synthetic_samples": 512, "device": "cpu", "memory_limit": "4G"}
    return fb.find_batch(train, tmp_path, **options)


def test_find_batch_takes_the_margin_off_the_largest_batch_that_fitted(tmp_path, monkeypatch):
    result = run_find_batch(tmp_path, monkeypatch, 41)
    # 41 fits, 42 does not; 41 x (1 - 0.05) = 38.95, rounded down: 38
    assert (result["max_batch"], result["first_failed"], result["safe_batch"]) == (41, 42, 38)
    assert result["limited_by"] == "memory"
    # the knee: every batch from 16 on runs at 160 samples/s
    assert result["knee_batch"] == 16 and result["best_samples_per_s"] == 160.0
    assert run_find_batch(tmp_path / "b", monkeypatch, 41, margin=0.1)["safe_batch"] == 36     # 36.9 -> 36


def test_find_batch_without_a_memory_limit_hit_takes_no_margin(tmp_path, monkeypatch):
    capped = run_find_batch(tmp_path, monkeypatch, 1000, max_batch=20)
    assert (capped["max_batch"], capped["first_failed"], capped["safe_batch"]) == (20, None, 20)
    assert capped["limited_by"] == "--max-batch"
    # the training set split over the workers caps it too: 512 samples on one worker
    whole = run_find_batch(tmp_path / "b", monkeypatch, 10**6)
    assert (whole["max_batch"], whole["safe_batch"], whole["limited_by"]) == (512, 512, "the training set")


def test_the_margin_never_goes_below_batch_1(tmp_path, monkeypatch):
    assert run_find_batch(tmp_path, monkeypatch, 1, margin=0.5)["safe_batch"] == 1
    assert math.isclose(0.05, fb.find_batch.__defaults__[0])          # Lightning's default margin
