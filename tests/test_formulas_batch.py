"""lr-find's suggestion rule and find-batch's search, safety margin and knee, pinned exactly (issue #25).

The LR finder's curves are built backwards from a chosen smoothed curve (inverting the
bias-corrected moving average by hand below), so the lowest point, the divergence cut and the
steepest descent are known without running the finder's own smoothing. find-batch runs for real on
the synthetic workload with its probe replaced by a table: which batches fit and how fast each ran.
"""

import inspect
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
        average = s * (1 - BETA**i)
        out.append((average - BETA * previous) / (1 - BETA))
        previous = average
    return out


def lrs(n: int) -> list[float]:
    return [1e-6 * 10 ** (i / 4) for i in range(n)]  # 4 points a decade


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


@pytest.mark.parametrize(
    "optimizer,rule", [("sgd", "linear"), ("lars", "linear"), ("adam", "sqrt"), ("adamw", "sqrt"), ("lamb", "sqrt")]
)
def test_the_suggestion_scales_by_the_optimizers_rule(optimizer, rule):
    assert scaling_rule(optimizer) == rule


def test_scaled_lr_linear_and_sqrt():
    assert scaled_lr(0.1, 1024, 256, "linear") == pytest.approx(0.4, rel=1e-12)
    assert scaled_lr(0.1, 1024, 256, "sqrt") == pytest.approx(0.2, rel=1e-12)
    assert scaled_lr(0.1, 1024, 256, "none") == 0.1


# -- find-batch --------------------------------------------------------------------------------


def test_knee_is_the_smallest_batch_within_5_percent_of_the_best():
    points = [(8, 80.0), (16, 152.0), (32, 160.0), (64, 158.0)]
    assert fb.knee(points) == 16  # 152 = 0.95 x 160 exactly: within
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
    assert fb.binsearch(lambda b: True, 1, 20) == (20, None)  # doubling stops at the cap: 16, then 20
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
    assert run_find_batch(tmp_path / "b", monkeypatch, 41, margin=0.1)["safe_batch"] == 36  # 36.9 -> 36


def test_find_batch_without_a_memory_limit_hit_takes_no_margin(tmp_path, monkeypatch):
    capped = run_find_batch(tmp_path, monkeypatch, 1000, max_batch=20)
    assert (capped["max_batch"], capped["first_failed"], capped["safe_batch"]) == (20, None, 20)
    assert capped["limited_by"] == "--max-batch"
    # the training set split over the workers caps it too: 512 samples on one worker
    whole = run_find_batch(tmp_path / "b", monkeypatch, 10**6)
    assert (whole["max_batch"], whole["safe_batch"], whole["limited_by"]) == (512, 512, "the training set")


def test_the_margin_never_goes_below_batch_1(tmp_path, monkeypatch):
    assert run_find_batch(tmp_path, monkeypatch, 1, margin=0.5)["safe_batch"] == 1
    # Lightning's default margin (read through the signature: mutmut's trampoline has no __defaults__)
    assert math.isclose(0.05, inspect.signature(fb.find_batch).parameters["margin"].default)


# -- what find-batch asks its probes and records (mutation-tested) -------------------------------


def recording_probe(monkeypatch, largest: int, calls: list, fail: Exception | None = None):
    """_probe answered from a table as in run_find_batch, recording each call's arguments."""

    def probe(values, steps, run_dir, on_cpu):
        calls.append((values, steps, run_dir, on_cpu))
        if fail is not None:
            raise fail
        batch = values["batch_size"]
        if batch > largest:
            return {"batch": batch, "fits": False, "error": "out of memory", "samples_per_s": None}
        return {"batch": batch, "fits": True, "error": None, "samples_per_s": 10.0 * min(batch, 16)}

    monkeypatch.setattr(fb, "_probe", probe)


TRAIN = {"workload": "synthetic-cnn", "synthetic_samples": 512, "device": "cpu", "memory_limit": "4G"}


def test_find_batch_records_its_options_and_every_probe(tmp_path, monkeypatch):
    import json

    calls, events = [], []
    recording_probe(monkeypatch, 3, calls)
    result = fb.find_batch(
        {**TRAIN, "grad_accum": 2},
        tmp_path,
        probe_steps=10,
        knee_within=0.2,
        on_probe=lambda kind, probe: events.append((kind, probe["batch"])),
    )
    # 1, 2, 4 (out of memory), then 3: each with the limit, in a run directory of its own under one scratch
    # directory, which is gone afterwards; a report every third step (10 // 3) where the batch divides the
    # 512 samples into whole steps of 2 micro-batches, every step at 3 (512 % 6 = 2: each epoch ends short,
    # and that step is left out alone)
    assert [c[0] for c in calls] == [
        {**TRAIN, "grad_accum": 2, "batch_size": b, "log_every": every, "memory_limit": "4G"}
        for b, every in ((1, 3), (2, 3), (4, 3), (3, 1))
    ]
    assert [(c[1], c[2].name, c[3]) for c in calls] == [(10, f"batch-{b}", True) for b in (1, 2, 4, 3)]
    assert len({c[2].parent for c in calls}) == 1 and not calls[0][2].parent.exists()
    assert calls[0][2].parent.name.startswith("paratrain-find-batch-")  # whose it is, if one is left behind
    assert events == [(kind, b) for b in (1, 2, 4, 3) for kind in ("start", "done")]
    assert result["options"] == {"margin": 0.05, "max_batch": None, "probe_steps": 10, "knee_within": 0.2}
    assert (result["train"], result["device"], result["workers"]) == ({**TRAIN, "grad_accum": 2}, "cpu", 1)
    assert (result["memory_limit"], result["memory_limit_source"]) == ("4G", "--memory-limit")
    assert (result["probe_steps"], result["margin"], result["knee_within"]) == (10, 0.05, 0.2)
    # 3 x 0.95 = 2.85 -> 2; the knee within 20 %: 30 samples/s at batch 3, 20 at 2 (below 24), so 3
    assert (result["max_batch"], result["first_failed"], result["safe_batch"], result["knee_batch"]) == (3, 4, 2, 3)
    assert [p["batch"] for p in result["probes"]] == [1, 2, 3, 4]
    assert json.loads((tmp_path / fb.RESULT_FILE).read_text()) == result


def test_the_training_set_caps_the_batch_per_accumulated_step(tmp_path, monkeypatch):
    calls = []
    recording_probe(monkeypatch, 10**6, calls)
    # 512 samples, 3 micro-steps a step: at most 512 // 3 = 170 a micro-batch, a whole batch
    result = fb.find_batch({**TRAIN, "grad_accum": 3}, tmp_path)
    assert (result["max_batch"], result["limited_by"]) == (170, "the training set")
    # the defaults recorded: 12 probe steps
    assert result["options"] == {"margin": 0.05, "max_batch": None, "probe_steps": 12, "knee_within": 0.05}


def test_find_batch_stops_probing_after_max_probes(tmp_path, monkeypatch):
    calls = []
    recording_probe(monkeypatch, 10**6, calls)
    monkeypatch.setattr(fb, "MAX_PROBES", 3)
    result = fb.find_batch(TRAIN, tmp_path)
    # 1, 2, 4 probed; from then on a batch counts as not fitting, unprobed
    assert [c[0]["batch_size"] for c in calls] == [1, 2, 4]
    assert (result["max_batch"], result["first_failed"], len(result["probes"])) == (4, 5, 3)


def test_find_batch_without_a_memory_limit_splits_what_is_available(tmp_path, monkeypatch):
    import psutil

    calls = []
    recording_probe(monkeypatch, 5, calls)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": 3 * 2**30 + 5})())
    train = {
        "workload": "synthetic-cnn",
        "synthetic_samples": 512,
        "device": "cpu",
        "workers": 2,
        "threads_per_worker": 1,
    }
    result = fb.find_batch(train, tmp_path)
    # 3 GiB over 2 workers: 1536 MiB each, given to every probe
    assert (result["memory_limit"], result["memory_limit_source"]) == (
        "1536M",
        "the memory available when the search started, split over 2 worker(s)",
    )
    assert {c[0]["memory_limit"] for c in calls} == {"1536M"}


def test_find_batch_on_gpus_passes_no_memory_limit(tmp_path, monkeypatch):
    import dataclasses

    from paratrain.launch import placement

    calls = []
    recording_probe(monkeypatch, 5, calls)
    real = placement.plan_placement
    # the placement a GPU node gives (no GPU here): only its device type matters to find-batch
    monkeypatch.setattr(placement, "plan_placement", lambda cfg: dataclasses.replace(real(cfg), device_type="cuda"))
    train = {"workload": "synthetic-cnn", "synthetic_samples": 512}
    result = fb.find_batch(train, tmp_path)
    assert (result["device"], result["memory_limit"], result["memory_limit_source"]) == ("cuda", None, None)
    assert "memory_limit" not in calls[0][0] and {c[3] for c in calls} == {False}
    from paratrain.errors import UsageError

    recording_probe(monkeypatch, 0, calls)
    with pytest.raises(UsageError, match=r"at batch 1 \(out of memory\); use a smaller model or more GPU memory$"):
        fb.find_batch(train, tmp_path / "b")


def test_find_batch_refusals(tmp_path, monkeypatch):
    from paratrain.errors import UsageError

    calls = []
    recording_probe(monkeypatch, 0, calls)
    with pytest.raises(UsageError, match=r"^paratrain find-batch sets --run-dir itself"):
        fb.find_batch({**TRAIN, "run_dir": "x"}, tmp_path / "a")
    with pytest.raises(UsageError, match=r"^paratrain find-batch chooses --batch-size itself"):
        fb.find_batch({**TRAIN, "batch_size": 8}, tmp_path / "b")
    with pytest.raises(UsageError, match=r"^--memory-limit 1K is below the model's own state"):
        fb.find_batch({**TRAIN, "memory_limit": "1K"}, tmp_path / "c")
    assert calls == []  # all refused before any probe
    with pytest.raises(
        UsageError, match=r"^the workload does not run at batch 1 \(out of memory\); raise --memory-limit"
    ):
        fb.find_batch(TRAIN, tmp_path / "d")
    assert not calls[0][2].parent.exists()  # nothing of the search is left


def test_a_probe_that_fails_for_another_reason_keeps_its_run_directory(tmp_path, monkeypatch):
    import shutil

    calls = []
    recording_probe(monkeypatch, 8, calls, fail=RunFailed("rank 0 exited with status 1; see its log"))
    with pytest.raises(RunFailed, match="rank 0 exited"):
        fb.find_batch(TRAIN, tmp_path)
    scratch = calls[0][2].parent
    assert scratch.is_dir()  # the error names a log there
    shutil.rmtree(scratch)


# -- recommend's choice, on measurements written by hand (nothing runs) --------------------------


def _recommend_on(tmp_path, monkeypatch, *, critical, stderr, knee=32, safe=102, workers=2, samples=4096):
    """recommend() with find-batch's, noise-scale's and lr-find's results already in OUT (as a rerun
    reuses them); a measurement it would start instead fails the test."""
    import json

    from paratrain.batch import lr_find, noise_scale
    from paratrain.batch.recommend import recommend

    def measuring(*args, **kwargs):
        raise AssertionError("recommend ran a measurement instead of reusing the recorded one")

    tmp_path.mkdir(exist_ok=True)

    monkeypatch.setattr(fb, "find_batch", measuring)
    monkeypatch.setattr(noise_scale, "measure_noise_scale", measuring)
    monkeypatch.setattr(lr_find, "find_lr", measuring)
    train = {
        "workload": "cifar10-cnn",
        "dataset": "synthetic",
        "synthetic_samples": samples,
        "synthetic_shape": "3,16,16",
        "epochs": 10,
        "optimizer": "sgd",
    }
    probes = [[8, 900.0], [16, 1500.0], [32, 2000.0], [64, 2050.0], [128, 2080.0]]
    (tmp_path / "find_batch.json").write_text(
        json.dumps(
            {
                "train": {**train, "workers": 1},
                # made as recommend asks for it: up to 20 optimizer steps an epoch, 4,096 / (20 x 2) = 102
                "options": {"max_batch": samples // (20 * workers)},
                "limited_by": "at least 20 optimizer steps an epoch",
                "knee_batch": knee,
                "safe_batch": safe,
                "margin": 0.05,
                "probes": [{"batch": b, "fits": True, "samples_per_s": r} for b, r in probes],
            }
        )
    )
    (tmp_path / "noise_scale.json").write_text(
        json.dumps(
            {
                "train": {**train, "workers": workers, "batch_size": knee},
                "options": {"steps": 200},
                "critical_batch": critical,
                "b_simple_stderr": stderr,
            }
        )
    )
    results = {}
    for batch in range(1, safe + 1):  # the LR range test of whichever batch recommend chooses
        (tmp_path / "lr_find.json").write_text(
            json.dumps(
                {
                    "train": {**train, "workers": 1, "batch_size": batch},
                    "options": {"steps": 100, "rule": lr_find.RULE},
                    "suggested_lr": 0.01,
                    "global_batch_size": batch,
                    "rule": "a tenth of the minimum",
                }
            )
        )
        try:
            results[batch] = recommend(dict(train), workers, tmp_path)
        except AssertionError:
            continue
    assert len(results) == 1, results.keys()
    return next(iter(results.values()))


def test_recommend_keeps_the_knee_when_the_sqrt_rule_caps_the_global_batch(tmp_path, monkeypatch):
    # 4096 samples: √ = 64 caps the global batch below the critical batch 150. Options: the knee 32
    # (also √/2 = 32) and the critical batch / 2 = 75; 75 x 2 = 150 > 64 is ruled out, so 32 per
    # worker, global 64; lr-find's LR 0.01 at batch 32, linear scaling to 64: 0.02; warmup 10 x 5/90
    # = 0.6, raised to at least 1 epoch.
    r = _recommend_on(tmp_path, monkeypatch, critical=150.0, stderr=20.0)
    assert (r["per_worker_batch"]["value"], r["global_batch"]["value"]) == (32, 64)
    options = {o["batch"]: o for o in r["per_worker_batch"]["options"]}
    assert set(options) == {32, 75} and options[32]["ruled_out"] is None
    assert options[75]["ruled_out"] == "its global batch 150 exceeds the √(training samples) 64"
    assert r["lr"]["value"] == pytest.approx(0.02) and r["lr_scaling"] == "linear"
    assert r["warmup_epochs"]["value"] == 1.0


def test_recommend_goes_below_the_knee_only_when_the_noise_scale_rules_the_knee_out(tmp_path, monkeypatch):
    # critical 30 ± 5: even +2 standard errors (40) is below the knee's global batch 2 x 32 = 64, so
    # the options below the knee are allowed: critical / 2 = 15 per worker (and √ / 2 = 32, the knee).
    r = _recommend_on(tmp_path, monkeypatch, critical=30.0, stderr=5.0)
    assert r["per_worker_batch"]["value"] == 15
    assert any("each worker runs below its knee" in note and "(+2 standard errors: 40)" in note for note in r["notes"])
    # the same measurement with a wide error bar (30 ± 20: up to 70 > 64) keeps the knee
    r = _recommend_on(tmp_path / "wide", monkeypatch, critical=30.0, stderr=20.0)
    assert r["per_worker_batch"]["value"] == 32
    assert any("within its error bar (+2 standard errors: 70)" in note for note in r["notes"])
