"""The doctor's checks on built-in runs and studies (doctor/checks.py), against hand-computed cases:
each threshold, each predicted gain and each rerun, from run directories written here file by file
(config.json, summary.json, metrics.jsonl, system.jsonl) and read as the doctor reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from paratrain.doctor import checks, study_checks
from paratrain.doctor.evidence import RunEvidence, read_run
from paratrain.runs.records import Trial

BREAKDOWN = {"data_s": 0.01, "compute_s": 0.04, "comm_s": 0.04, "optimizer_s": 0.008, "other_s": 0.002}


def built_run(
    path: Path,
    config: dict[str, Any] | None = None,
    summary: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    system: list[dict[str, Any]] | None = None,
) -> RunEvidence:
    """A run directory of a 2-worker ddp run on CPU (overridden by the arguments), read back."""
    path.mkdir(parents=True)
    config = dict(config or {})
    resolved = {"device": "cpu", "threads_per_worker": 1, "cpu_sets": [[0], [1]], **config.pop("resolved", {})}
    cfg = {"workload": "cifar10-cnn", "workers": 2, "batch_size": 32, "epochs": 4, **config}
    (path / "config.json").write_text(json.dumps({**cfg, "resolved": resolved}))
    base = {"status": "completed", "workers": cfg["workers"], "batch_size": cfg["batch_size"], "grad_accum": 1}
    (path / "summary.json").write_text(json.dumps({**base, "breakdown": BREAKDOWN, **(summary or {})}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events or []))
    (path / "system.jsonl").write_text("".join(json.dumps(s) + "\n" for s in system or []))
    return read_run(path)


def quiet(breakdown: dict[str, float]) -> dict[str, Any]:
    return {"breakdown": breakdown}


# -- oversubscription -------------------------------------------------------------------------------


def test_oversubscription_predicts_the_compute_at_ten_percent_of_a_threads_share_of_the_peak(tmp_path):
    # 2 ranks x 2 threads on 2 cores. The fix: 1 thread each. A rank's compute at 10 % of its threads'
    # share of the peak: 1e6 FLOPs x (32 x 2) samples / (1e9 / 2 threads x 1 thread x 0.10) = 1.28 s,
    # against 4 s measured: 4 / 1.28 = 3.125x, a saving of 1 - 1 / 3.125 = 0.68.
    ev = built_run(
        tmp_path / "r",
        {"resolved": {"threads_per_worker": 2}},
        {
            "grad_accum": 2,
            "flops_per_sample": 1e6,
            "mfu_peak": {"per_device": 1e9},
            "machine_load": {"cores": 2},
            "breakdown": {**BREAKDOWN, "compute_s": 4.0},
        },
    )
    found = checks.oversubscription(ev)
    assert found.finding == "4 threads compete for 2 cores"
    assert found.saving == pytest.approx(0.68)
    assert found.predicted_gain.startswith("3.1x faster on a quiet machine")
    assert "takes 1,280 ms per step, against 4,000 ms measured" in found.predicted_gain
    assert found.rerun == {"threads_per_worker": 1, "allow_oversubscribe": None}
    assert "--threads-per-worker 1" in found.remedy and "--workers 2" in found.remedy  # the same ranks
    assert found.evidence.startswith("2 ranks x 2 threads = 4 threads on 2 cores; step ")


def test_oversubscription_by_ranks_fewer_ranks_and_no_prediction_without_a_flop_count(tmp_path):
    ev = built_run(tmp_path / "r", {"workers": 4}, {"machine_load": {"cores": 2}, "wall_time_s": 3.0})
    found = checks.oversubscription(ev)
    assert found.rerun == {"threads_per_worker": 1, "allow_oversubscribe": None, "workers": 2}
    assert found.saving == 0.5 and found.predicted_gain.startswith("not predicted (no FLOP count")
    # A rank's compute that the fix cannot beat: no gain below 1x.
    slower = built_run(
        tmp_path / "s",
        {"workers": 4},
        {"machine_load": {"cores": 2}, "flops_per_sample": 1e6, "mfu_peak": {"per_device": 1e9}},
    )
    assert checks.oversubscription(slower).saving == 0.0
    assert checks.oversubscription(built_run(tmp_path / "t", {"workers": 2}, {"machine_load": {"cores": 2}})) is None


# -- exposed communication ---------------------------------------------------------------------------


def test_exposed_communication_accumulates_until_the_all_reduce_is_a_tenth(tmp_path):
    # step 0.1 s, comm 0.04 s (40 %). Micro-step work 0.05 s, per-step 0.01 s: 8 micro-steps take
    # 8 x 0.05 + 0.01 + 0.04 = 0.45 s (all-reduce 8.9 %), against 8 x 0.1 = 0.8 s now: saving 0.4375.
    ev = built_run(tmp_path / "r", {"allreduce": "backend"}, {"allreduce": "gloo"})
    found = checks.exposed_communication(ev)
    assert found.finding.startswith("40% of every step is spent in all-reduce")
    assert found.saving == pytest.approx(0.4375)
    assert found.rerun == {"grad_accum": 8}
    assert "--grad-accum 8" in found.remedy and "or --batch-size 256 if it fits" in found.remedy
    shm = found.remedy.split("; and average through shared memory: ")[1]  # --allreduce back to its default, auto
    assert shm.startswith("paratrain train ") and "--allreduce" not in shm and "--grad-accum" not in shm
    assert "450 ms per 8 micro-steps against 800 ms" in found.predicted_gain
    assert found.evidence.endswith("2 workers, 32 samples per worker per step")


def test_exposed_communication_multiplies_the_accumulation_already_there_and_stays_quiet_below_a_fifth(tmp_path):
    ev = built_run(tmp_path / "r", {"grad_accum": 2, "allreduce": "shm"}, {"grad_accum": 2, "allreduce": "shm"})
    found = checks.exposed_communication(ev)
    assert found.rerun == {"grad_accum": 16} and "shared memory" not in found.remedy
    below = {**BREAKDOWN, "comm_s": 0.0199, "compute_s": 0.0601}  # 19.9 %
    assert checks.exposed_communication(built_run(tmp_path / "b", summary=quiet(below))) is None
    # exactly 20 % (binary fractions: 0.25 of a 1.25 s step)
    at = {"data_s": 0.25, "compute_s": 0.5, "comm_s": 0.25, "optimizer_s": 0.125, "other_s": 0.125}
    assert checks.exposed_communication(built_run(tmp_path / "a", summary=quiet(at))) is not None
    one = built_run(tmp_path / "one", {"workers": 1})
    assert checks.exposed_communication(one) is None


# -- data wait --------------------------------------------------------------------------------------


def test_data_wait_saves_the_data_share_and_doubles_the_loader_workers(tmp_path):
    waiting = {"data_s": 0.03, "compute_s": 0.06, "comm_s": 0.0, "optimizer_s": 0.01, "other_s": 0.0}
    ev = built_run(tmp_path / "r", {"loader_workers": 3, "workers": 1}, {"breakdown": waiting, "dataset": "cifar10"})
    found = checks.data_wait(ev)
    assert found.saving == pytest.approx(0.3) and found.rerun == {"loader_workers": 6}
    assert found.finding == "ranks wait for data 30% of every step"
    # 1 rank of 1 thread on 2 cores: a spare core for the loader's workers.
    ev = built_run(tmp_path / "s", {"workers": 1}, {"breakdown": waiting, "machine_load": {"cores": 2}})
    found = checks.data_wait(ev)
    assert found.rerun == {"loader_workers": 2} and "(batches prepared in worker processes" in found.remedy
    # Every core taken: the loader cannot overlap; the dataset's own cost is named.
    ev = built_run(tmp_path / "t", {"workers": 2}, {"breakdown": waiting, "machine_load": {"cores": 2}})
    assert "needs spare cores to overlap" in checks.data_wait(ev).remedy
    assert "(cifar10-cnn: decode and transform once" in checks.data_wait(ev).remedy
    below = {**waiting, "data_s": 0.0149, "compute_s": 0.0751}
    assert checks.data_wait(built_run(tmp_path / "b", summary=quiet(below))) is None


# -- host-side stalls -------------------------------------------------------------------------------


def _steps(rates: list[float], samples_each: int = 100) -> list[dict[str, Any]]:
    return [
        {"event": "step", "step": 10 * (i + 1), "samples": samples_each * (i + 1), "samples_per_s": rate}
        for i, rate in enumerate(rates)
    ]


def test_host_sync_stalls_count_the_time_slow_intervals_lost(tmp_path):
    # The first interval (50) is warm-up. The median of 100, 100, 100, 40, 100 is 100; 40 < 50 stalls:
    # its 100 samples took 2.5 s instead of 1 s, 1.5 s lost of 10 s trained: 15 % (other is 2 %).
    ev = built_run(
        tmp_path / "r",
        {"log_every": 5},
        {"epoch_times_s": [5.0, 5.0]},
        events=_steps([50, 100, 100, 100, 40, 100]),
    )
    found = checks.host_sync_stalls(ev)
    assert found.saving == pytest.approx(0.15)
    assert "1 logging interval(s) below 50% of the median samples/s, losing 1.50 s of 10.0 s" in found.evidence
    assert found.rerun == {"log_every": 50}  # the default: the rerun drops --log-every 5
    assert found.remedy.startswith("paratrain train ") and "--log-every" not in found.remedy
    assert "(each log point reads the loss on the host); also: code change:" in found.remedy
    # Without the stall and with other at 2 %: nothing; other at 20 % alone is a finding.
    calm = built_run(tmp_path / "c", {"log_every": 50}, {"epoch_times_s": [5.0, 5.0]}, _steps([50, 100, 100, 100]))
    assert checks.host_sync_stalls(calm) is None
    busy = {**BREAKDOWN, "other_s": 0.02, "compute_s": 0.022}  # 20 % of a 0.1 s step
    found = checks.host_sync_stalls(built_run(tmp_path / "o", {"log_every": 50}, quiet(busy)))
    assert found.saving == pytest.approx(0.2) and found.rerun is None


# -- monitor: rank 0 alone, straggler ---------------------------------------------------------------


def _system(per_instant: list[tuple[float, ...]], start: float = 100.0) -> list[dict[str, Any]]:
    """The monitor's rank samples: an instant every 0.5 s, the ranks read 20 ms apart (one instant to
    the doctor, which groups samples by the tenth of a second)."""
    return [
        {"time": start + 0.5 * t + 0.02 * rank, "kind": "rank", "rank": rank, "cpu_percent": cpu, "num_threads": 1}
        for t, cpus in enumerate(per_instant)
        for rank, cpu in enumerate(cpus)
    ]


def test_rank0_alone_saves_its_share_times_the_ranks_that_could_share_it(tmp_path):
    # 10 instants: rank 0 alone in 3, both busy in 5, both idle in 2: 30 % alone; over 2 ranks the
    # lone work would take half: saving 0.3 x (1 - 1/2) = 0.15.
    states = [(100, 5)] * 3 + [(100, 100)] * 5 + [(5, 5)] * 2
    found = checks.rank0_alone(built_run(tmp_path / "r", system=_system(states)))
    assert found.saving == pytest.approx(0.15)
    assert found.evidence.startswith("3 of 10 monitor samples: rank 0 at 100 % CPU")
    # Alone in 1 of 10 (below 15 %): nothing.
    states = [(100, 5)] + [(100, 100)] * 9
    assert checks.rank0_alone(built_run(tmp_path / "s", system=_system(states))) is None


def test_a_straggler_leads_often_enough_and_saves_the_others_wait(tmp_path):
    # 10 instants with both ranks busy: rank 1 at 200 % against rank 0's 100 % in 4 (ratio 0.5), even
    # in 6. Share 0.4, saving 0.4 x (1 - 0.5) = 0.2.
    states = [(100, 200)] * 4 + [(100, 100)] * 6
    found = checks.straggler(built_run(tmp_path / "r", system=_system(states)))
    assert found.finding == "rank 1 is a straggler: the others wait for it 40% of the time"
    assert found.saving == pytest.approx(0.2)
    # Twice: fewer than STRAGGLER_MIN_SAMPLES (3), however dominant.
    states = [(100, 200)] * 2 + [(100, 100)] * 8
    assert checks.straggler(built_run(tmp_path / "s", system=_system(states))) is None


# -- evaluation, batch, warmup, load -----------------------------------------------------------------


def test_evaluation_share_saves_half_the_time_between_epochs(tmp_path):
    # Epochs 0-10 s and 14-24 s, training ends at 28 s: 8 s of evaluation against 20 s of training,
    # 8/28 of the run; evaluating half as long saves 4/28.
    events = [
        {"event": "start", "step": 0, "unix_time": 1000.0},
        {"event": "epoch", "epoch": 1, "step": 10, "time_start": 0.0, "time_end": 10.0, "epoch_time_s": 10.0},
        {"event": "epoch", "epoch": 2, "step": 20, "time_start": 14.0, "time_end": 24.0, "epoch_time_s": 10.0},
    ]
    found = checks.evaluation_share(built_run(tmp_path / "r", summary={"train_time_s": 28.0}, events=events))
    assert found.saving == pytest.approx(4 / 28)
    assert found.evidence == "8.0 s between epochs against 20.0 s of training over 2 epoch(s)"  # no monitor
    events[2] = {**events[2], "time_start": 12.0, "time_end": 22.0}  # 2 + 2 s of 24: 17 %
    assert checks.evaluation_share(built_run(tmp_path / "s", summary={"train_time_s": 24.0}, events=events)) is None


def test_small_device_batch_below_eight_and_not_for_scripts(tmp_path):
    found = checks.small_device_batch(built_run(tmp_path / "r", {"batch_size": 7}))
    assert found.rerun == {"batch_size": 8} and found.saving is None
    assert checks.small_device_batch(built_run(tmp_path / "s", {"batch_size": 8})) is None


def test_global_batch_above_sqrt_n_suggests_the_per_worker_batch_that_meets_it(tmp_path):
    # N = 10,000: sqrt 100. Global 256 = 2 workers x 64 x 2 micro-steps: 100 // 4 = 25 per worker.
    ev = built_run(
        tmp_path / "r",
        {"grad_accum": 2, "batch_size": 64, "resolved": {"train_samples": 10_000, "global_batch_size": 256}},
        {"grad_accum": 2, "global_batch_size": 256},
    )
    found = checks.global_batch_sqrt_n(ev)
    assert found.rerun == {"batch_size": 25}
    assert found.evidence == (
        "global batch 256 (2 replica(s) x 64 x 2 micro-steps) for N = 10,000 training samples; 40 steps per epoch"
    )
    # Ranks that share a batch (a tensor-parallel pair, a pipeline's stages): 2 workers, one replica of 64.
    # N = 1,024: sqrt 32, all of it the one replica's (not 16 a worker).
    shared = built_run(
        tmp_path / "shared",
        {"batch_size": 64, "tp": 2, "resolved": {"train_samples": 1_024, "global_batch_size": 64}},
        {"global_batch_size": 64},
    )
    found = checks.global_batch_sqrt_n(shared)
    assert found.rerun == {"batch_size": 32}
    assert found.evidence.startswith("global batch 64 (1 replica(s) x 64) for N = 1,024")
    at = built_run(tmp_path / "s", {"resolved": {"train_samples": 10_000}}, {"global_batch_size": 100})
    assert checks.global_batch_sqrt_n(at) is None


def test_no_warmup_when_the_scaled_lr_is_eight_times_the_base(tmp_path):
    # 1024 against 128: linear 8x (a finding; warmup min(5, 8 epochs / 4) = 2); sqrt 2.8x (none).
    resolved = {"global_batch_size": 1024, "reference_batch_size": 128}
    linear = {"lr_scaling": "linear", "lr": 0.1, "epochs": 8, "resolved": resolved}
    found = checks.no_warmup(built_run(tmp_path / "r", linear))
    assert found.finding == "the LR starts at 8x the base LR without warmup"
    assert found.rerun == {"warmup_epochs": 2.0}
    assert checks.no_warmup(built_run(tmp_path / "s", {**linear, "lr_scaling": "sqrt"})) is None
    assert checks.no_warmup(built_run(tmp_path / "w", {**linear, "warmup_epochs": 1})) is None
    smaller = {**linear, "resolved": {**resolved, "global_batch_size": 1016}}  # 7.9x
    assert checks.no_warmup(built_run(tmp_path / "x", smaller)) is None


def test_contended_names_the_other_work_and_is_advice(tmp_path):
    load = {"cores": 2, "wall_s": 10.0, "other_cpu_s": 8.0, "steal_s": 0.5, "other_fraction": 0.4, "contended": True}
    found = checks.contended(built_run(tmp_path / "r", summary={"machine_load": load}))
    assert found.finding.startswith("other work took 40% of the run's cores")
    assert found.evidence == "machine_load: 8.0 CPU s of other work and 0.5 s stolen on 2 core(s) over 10.0 s"
    assert found.saving is None
    assert checks.contended(built_run(tmp_path / "s", summary={"machine_load": {**load, "contended": False}})) is None


# -- sweeps and studies ------------------------------------------------------------------------------


def _trial(batch: int, rate: float, state: str = "COMPLETE", **metrics: float) -> Trial:
    measured = {"samples_per_s": rate} if rate else {}
    return Trial(number=0, state=state, params={"batch_size": batch}, metrics={**measured, **metrics})


def _best(**params: Any) -> Trial:
    return Trial(number=3, state="COMPLETE", params=params)


def test_batch_knee_is_the_smallest_batch_within_five_percent_of_the_best(tmp_path):
    # 200 samples/s at best: the knee is 32 (196 >= 190), not 16 (180). From 16: 1 - 180/196 saved.
    trials = [_trial(8, 100), _trial(16, 180), _trial(16, 180), _trial(32, 196), _trial(64, 200)]
    found = study_checks.batch_knee(trials, _best(batch_size=16))
    assert found.finding == "the best trial's batch 16 is below the throughput knee (32)"
    assert found.saving == pytest.approx(1 - 180 / 196)
    assert study_checks.batch_knee(trials, _best(batch_size=32)) is None
    assert study_checks.batch_knee(trials[:2], _best(batch_size=8)) is None  # two batches: no knee


def _scored(number: int, value: float, **params: Any) -> Trial:
    return Trial(number=number, state="COMPLETE", params=params, value=value)


BATCHES = {"algorithm": "grid", "parameters": {"batch_size": {"type": "discrete", "values": [16, 8, 32]}}}


def test_a_best_value_at_either_end_of_a_list_of_numbers_is_at_the_edge():
    """The gpt-small study of docs/batch-size.md: bits/byte at batches 8, 16, 32 (lower is better), best at 8,
    the smallest; the next value by the list's own ratio is 4."""
    trials = [_scored(0, 3.5, batch_size=8), _scored(1, 3.7, batch_size=8), _scored(2, 3.8, batch_size=16)]
    trials += [_scored(3, 4.1, batch_size=32)]
    [found] = study_checks.best_at_edge(BATCHES, trials, trials[0], "val_bits_per_byte")
    assert found.check == "best_at_edge" and found.saving is None and found.severity == "advice"
    assert found.finding == "the best trial's batch_size, 8, is at the smallest end of the space"
    # the means over each value's trials, in the values' order: 8's two trials give 3.6
    assert found.evidence == (
        "batch_size searched over 8, 16, 32; val_bits_per_byte by batch_size: 8: 3.600, 16: 3.800, 32: 4.100"
    )
    assert found.remedy == (
        "add batch_size values beyond 8 (e.g. 4) to the config file and rerun the same command: the grid is "
        "extended, its finished trials kept"
    )
    [largest] = study_checks.best_at_edge(BATCHES, trials, _scored(3, 4.1, batch_size=32), "val_bits_per_byte")
    assert "largest end" in largest.finding and "(e.g. 64)" in largest.remedy
    assert study_checks.best_at_edge(BATCHES, trials, _scored(2, 3.8, batch_size=16), "val_bits_per_byte") == []
    # two values: the best is always at one end, which says nothing
    two = {"parameters": {"batch_size": {"type": "discrete", "values": [8, 16]}}}
    assert study_checks.best_at_edge(two, trials, trials[0], "val_bits_per_byte") == []
    assert study_checks.best_at_edge(BATCHES, trials, None, "val_bits_per_byte") == []


def test_the_next_value_follows_the_lists_step_and_keeps_its_kind():
    evenly = {"parameters": {"dropout": {"type": "discrete", "values": [0.1, 0.2, 0.3]}}}
    [found] = study_checks.best_at_edge(evenly, [], _scored(0, 0.6, dropout=0.3), "val_accuracy")
    assert "beyond 0.3 (e.g. 0.4)" in found.remedy
    # 1, 3, 5 below 1 by its step of 2 is -1: not offered for a list of positive numbers
    odd = {"parameters": {"layers": {"type": "integer", "values": [1, 3, 5]}}}
    [found] = study_checks.best_at_edge(odd, [], _scored(0, 0.6, layers=1), "val_accuracy")
    # not a grid: only a grid's lists of numbers can be extended in place
    assert found.remedy == (
        "add layers values beyond 1 to the config file and sweep again with a new --out (only a grid's lists of "
        "numbers can be extended in place)"
    )
    # 2, 4, 8 below 2 by its ratio is 1; 1, 2, 4 below 1 would be a half: not offered for integers
    assert (
        "(e.g. 1)"
        in study_checks.best_at_edge(
            {"parameters": {"b": {"type": "discrete", "values": [2, 4, 8]}}}, [], _scored(0, 0.6, b=2), "val_accuracy"
        )[0].remedy
    )
    assert (
        "e.g."
        not in study_checks.best_at_edge(
            {"parameters": {"b": {"type": "discrete", "values": [1, 2, 4]}}}, [], _scored(0, 0.6, b=1), "val_accuracy"
        )[0].remedy
    )


def test_a_best_value_in_the_outer_tenth_of_a_range_is_at_the_edge():
    # 1e-4 to 1e-1 in log space: 3 decades, a tenth of them 0.3; 1.5e-4 is 0.18 decades from the bottom
    lr = {"parameters": {"lr": {"type": "float", "scaling": "loguniform", "low": 1e-4, "high": 0.1}}}
    [found] = study_checks.best_at_edge(lr, [], _scored(0, 0.6, lr=1.5e-4), "val_accuracy")
    assert found.finding == "the best trial's lr, 0.00015, is at the smallest end of the space"
    assert found.evidence == (
        "lr searched from 0.0001 to 0.1 in log space; the best trial's 0.00015 is within the lowest 10% of it"
    )
    assert found.remedy == "move lr's min beyond 0.00015 and sweep again with a new --out"
    assert study_checks.best_at_edge(lr, [], _scored(0, 0.6, lr=2.1e-4), "val_accuracy") == []  # 0.32 decades up
    assert "largest end" in study_checks.best_at_edge(lr, [], _scored(0, 0.6, lr=0.06), "val_accuracy")[0].finding
    # uniform: the outer tenth of 0 to 0.5 is above 0.45
    uniform = {"parameters": {"dropout": {"type": "float", "scaling": "uniform", "low": 0.0, "high": 0.5}}}
    assert study_checks.best_at_edge(uniform, [], _scored(0, 0.6, dropout=0.46), "val_accuracy")[0].remedy == (
        "move dropout's max beyond 0.46 and sweep again with a new --out"
    )
    assert study_checks.best_at_edge(uniform, [], _scored(0, 0.6, dropout=0.44), "val_accuracy") == []


def test_no_edge_without_an_order_or_bounds():
    words = {"parameters": {"optimizer": {"type": "categorical", "values": ["sgd", "adam", "adamw"]}}}
    assert study_checks.best_at_edge(words, [], _scored(0, 0.6, optimizer="sgd"), "val_accuracy") == []
    prior = {"parameters": {"lr": {"type": "float", "scaling": "lognormal", "mu": -5.0, "sigma": 1.0}}}
    assert study_checks.best_at_edge(prior, [], _scored(0, 0.6, lr=1e-6), "val_accuracy") == []
    assert study_checks.best_at_edge({}, [], _scored(0, 0.6, lr=1e-6), "val_accuracy") == []


def _study(rows, mode):
    """A scaling.json as its record, the fields these checks do not read filled in."""
    from paratrain.runs.records import Study

    filled = [{"workload": "w", "samples_per_s": 100.0, "speedup": 1.0, "efficiency": 1.0, **r} for r in rows]
    return Study.model_validate({"mode": mode, "rows": filled})


def test_lr_not_scaled_in_a_weak_study_that_grew_the_batch(tmp_path):
    rows = [
        {"workers": 1, "global_batch_size": 64, "lr": 0.1, "val_accuracy": 0.5, "run_dir": "a"},
        {"workers": 2, "global_batch_size": 128, "lr": 0.1, "val_accuracy": 0.45, "run_dir": "b"},
    ]
    configs = {"a": {"lr_scaling": "none"}, "b": {"lr_scaling": "none"}}
    found = study_checks.lr_not_scaled(_study(rows, "weak"), configs)
    assert found.finding == "weak scaling grew the global batch 2x but not the LR"
    assert found.remedy.startswith("paratrain scale --workers 1,2 --lr-scaling linear")
    assert study_checks.lr_not_scaled(_study(rows, "strong"), configs) is None
    scaled = {"a": {"lr_scaling": "linear"}, "b": {"lr_scaling": "linear"}}
    assert study_checks.lr_not_scaled(_study(rows, "weak"), scaled) is None


# -- edges and branches (each case kills a plausible mistake: scripts/mutate.py doctor/checks.py) -----

EXACT = {"data_s": 0.1875, "compute_s": 0.8125, "comm_s": 0.125, "optimizer_s": 0.0625, "other_s": 0.0625}  # 1.25 s


def test_oversubscription_needs_cpu_ranks_with_known_threads_and_counts_what_the_monitor_saw(tmp_path):
    gpu = built_run(
        tmp_path / "g", {"resolved": {"device": "cuda", "threads_per_worker": 2}}, {"machine_load": {"cores": 2}}
    )
    assert checks.oversubscription(gpu) is None
    unknown = built_run(tmp_path / "u", {"resolved": {"threads_per_worker": None}}, {"machine_load": {"cores": 1}})
    assert checks.oversubscription(unknown) is None
    # 2 ranks x 2 threads on 3 cores: 1 thread each (3 // 2); the monitor's thread counts in the evidence.
    system = [{**s, "num_threads": 4 - s["rank"]} for s in _system([(100, 100)] * 2)]
    seen = built_run(
        tmp_path / "s",
        {"resolved": {"threads_per_worker": 2}},
        {"machine_load": {"cores": 3}, "breakdown": None, "wall_time_s": 3.0},
        system=system,
    )
    found = checks.oversubscription(seen)
    assert found.rerun == {"threads_per_worker": 1, "allow_oversubscribe": None}
    assert found.evidence == (
        "2 ranks x 2 threads = 4 threads on 3 cores; the monitor counted 4, 3 threads per rank; wall time 3.0 s"
    )
    bare = built_run(
        tmp_path / "b", {"resolved": {"threads_per_worker": 2}}, {"machine_load": {"cores": 3}, "breakdown": None}
    )
    assert checks.oversubscription(bare).evidence.endswith("; wall time 0.0 s")


def test_oversubscription_gives_the_fix_a_share_of_the_peak_for_each_thread_it_keeps(tmp_path):
    # 2 ranks x 4 threads on 4 cores: 2 threads each. 1e6 x 32 / (1e9 / 4 x 2 x 0.10) = 0.64 s against
    # 1.6 s: 2.5x, saving 0.6. Without a batch or a peak: not predicted.
    peak = {"flops_per_sample": 1e6, "mfu_peak": {"per_device": 1e9}, "machine_load": {"cores": 4}}
    ev = built_run(
        tmp_path / "r",
        {"resolved": {"threads_per_worker": 4}},
        {**peak, "breakdown": {**BREAKDOWN, "compute_s": 1.6}},
    )
    found = checks.oversubscription(ev)
    assert found.rerun["threads_per_worker"] == 2 and found.saving == pytest.approx(0.6)
    no_batch = built_run(
        tmp_path / "n", {"batch_size": None, "resolved": {"threads_per_worker": 4}}, {**peak, "batch_size": None}
    )
    assert checks.oversubscription(no_batch).predicted_gain.startswith("not predicted")
    no_peak = built_run(tmp_path / "p", {"resolved": {"threads_per_worker": 4}}, {**peak, "mfu_peak": None})
    assert checks.oversubscription(no_peak).saving == 0.5


def test_shared_memory_is_suggested_only_to_cpu_ranks_with_cores_of_their_own_averaging_through_the_backend(tmp_path):
    def shm(name, config, summary):
        found = checks.exposed_communication(built_run(tmp_path / name, config, summary))
        return "average through shared memory" in found.remedy

    assert shm("gloo", {"allreduce": "backend"}, {"allreduce": "gloo"})
    assert not shm("no-cpu-sets", {"allreduce": "backend", "resolved": {"cpu_sets": []}}, {"allreduce": "gloo"})
    assert not shm("already", {"allreduce": "backend"}, {"allreduce": "shm"})
    assert not shm("auto", {"allreduce": "auto"}, {"allreduce": "gloo"})


def test_data_wait_at_its_threshold_and_the_loader_workers_in_evidence_and_remedy(tmp_path):
    ev = built_run(tmp_path / "r", summary=quiet(EXACT))  # data exactly 15 %
    found = checks.data_wait(ev)
    assert found.saving == pytest.approx(0.15) and "; --loader-workers 0; dataset cifar10-cnn" in found.evidence
    assert "--loader-workers 2" in found.remedy
    assert found.remedy.endswith(
        " needs spare cores to overlap: here the ranks take every core, so also make the dataset's __getitem__ "
        "cheaper (cifar10-cnn: decode and transform once, keep tensors in memory)"
    )
    three = built_run(
        tmp_path / "t", {"loader_workers": 3, "workers": 1}, {"machine_load": {"cores": 2}, **quiet(EXACT)}
    )
    assert "--loader-workers 6" in checks.data_wait(three).remedy
    assert checks.data_wait(three).remedy.endswith(" (batches prepared in worker processes while the step runs)")
    # 1 rank of 2 threads on 2 cores: no spare core.
    busy = built_run(
        tmp_path / "b",
        {"workers": 1, "resolved": {"threads_per_worker": 2}},
        {"machine_load": {"cores": 2}, **quiet(EXACT)},
    )
    assert "needs spare cores" in checks.data_wait(busy).remedy


def test_stalls_from_the_second_interval_on_summed_and_counted(tmp_path):
    # After the first: 40 (the second interval) and 20 stall (median 100): 100/40 - 1 + 100/20 - 1 = 5.5 s of 20.
    events = _steps([50, 40, 100, 100, 20, 100, 100])
    ev = built_run(tmp_path / "r", summary={"epoch_times_s": [10.0, 10.0]}, events=events)
    found = checks.host_sync_stalls(ev)
    assert "; 2 logging interval(s) below 50% of the median samples/s, losing 5.50 s of 20.0 s" in found.evidence
    assert found.saving == pytest.approx(5.5 / 20)
    # At half the median exactly: not a stall. Three intervals: too few to tell; four do.
    edge = built_run(tmp_path / "e", summary={"epoch_times_s": [5.0, 5.0]}, events=_steps([50, 100, 100, 50, 100]))
    assert checks.host_sync_stalls(edge) is None
    few = built_run(tmp_path / "f", summary={"epoch_times_s": [5.0, 5.0]}, events=_steps([50, 10, 100, 100]))
    assert checks.host_sync_stalls(few) is None
    four = built_run(tmp_path / "4", summary={"epoch_times_s": [5.0, 5.0]}, events=_steps([50, 10, 100, 100, 100]))
    assert checks.host_sync_stalls(four).saving == pytest.approx(0.9)  # four intervals: 100/10 - 1 = 9 s of 10


def test_host_sync_stalls_at_both_thresholds_and_not_without_a_breakdown(tmp_path):
    # Stalls exactly 10 %: 100 samples at 100/s against a median of 400/s lose 0.75 s of 7.5 s.
    events = _steps([400, 400, 400, 100, 400])
    stalled = built_run(tmp_path / "s", {"log_every": 10}, {"epoch_times_s": [3.75, 3.75]}, events)
    found = checks.host_sync_stalls(stalled)
    assert found.saving == pytest.approx(0.1) and found.rerun is None  # every 10 steps is often enough
    assert found.remedy.startswith("code change: do not read tensors on the host every step")
    other = checks.host_sync_stalls(
        built_run(tmp_path / "o", summary=quiet({**EXACT, "data_s": 0.0625, "other_s": 0.1875}))
    )
    assert other.saving == pytest.approx(0.15) and "0 logging interval(s)" in other.evidence
    big_stall = _steps([50, 10, 100, 100, 100])
    none = built_run(tmp_path / "n", summary={"breakdown": None, "epoch_times_s": [5.0, 5.0]}, events=big_stall)
    assert checks.host_sync_stalls(none) is None


def test_rank0_alone_at_the_edges_of_idle_and_of_its_shares(tmp_path):
    # A rank at exactly 10 % is busy: the same 3 of 10 as before.
    states = [(10, 5)] * 3 + [(10, 10)] * 5 + [(5, 5)] * 2
    found = checks.rank0_alone(built_run(tmp_path / "r", system=_system(states)))
    assert found.saving == pytest.approx(0.15) and found.evidence.startswith("3 of 10 monitor samples")
    # Alone and together exactly 15 % each (3 of 20): a finding.
    states = [(100, 5)] * 3 + [(100, 100)] * 3 + [(5, 5)] * 14
    assert checks.rank0_alone(built_run(tmp_path / "e", system=_system(states))).saving == pytest.approx(0.075)
    # Together in 1 of 10: rank 0 is not alone in a run whose ranks never work at once.
    states = [(100, 5)] * 5 + [(100, 100)] + [(5, 5)] * 4
    assert checks.rank0_alone(built_run(tmp_path / "t", system=_system(states))) is None
    # Four instants are enough; one rank is never alone.
    four = [(100, 5)] + [(100, 100)] * 3
    assert checks.rank0_alone(built_run(tmp_path / "f", system=_system(four))).saving == pytest.approx(0.125)
    one = built_run(tmp_path / "o", {"workers": 1}, system=_system([(100,)] * 10))
    assert checks.rank0_alone(one) is None and checks.straggler(one) is None


def test_a_straggler_at_the_edges_and_as_rank_0(tmp_path):
    # 13 against 10 (exactly 1.3x, both busy at 10 %): rank 1 leads in 4 of 10; saving 0.4 x 3/13.
    states = [(10, 13)] * 4 + [(100, 100)] * 6
    found = checks.straggler(built_run(tmp_path / "r", system=_system(states)))
    assert found.saving == pytest.approx(0.4 * 3 / 13)
    # Rank 0 as the straggler; 4 instants are enough.
    found = checks.straggler(built_run(tmp_path / "z", system=_system([(200, 100)] * 3 + [(100, 100)])))
    assert found.finding.startswith("rank 0 is a straggler") and found.saving == pytest.approx(0.75 * 0.5)
    # Exactly 15 % (3 of 20) and exactly the 3 samples needed: a finding.
    states = [(100, 200)] * 3 + [(100, 100)] * 17
    assert checks.straggler(built_run(tmp_path / "e", system=_system(states))).saving == pytest.approx(0.075)


def test_evaluation_share_at_a_quarter_and_the_ranks_idle_during_it(tmp_path):
    # Epochs 0-3 s and 4-7 s, training ends at 8 s: 2 s of 8 evaluate (25 %). Monitor samples during
    # evaluation (3.5 s, 7.5 s on the run's clock): rank 0 idle, rank 1 busy; one outside it, ignored.
    events = [
        {"event": "start", "step": 0, "unix_time": 1000.0},
        {"event": "epoch", "epoch": 1, "step": 10, "time_start": 0.0, "time_end": 3.0, "epoch_time_s": 3.0},
        {"event": "epoch", "epoch": 2, "step": 20, "time_start": 4.0, "time_end": 7.0, "epoch_time_s": 3.0},
    ]
    system = _system([(5, 100)], start=1003.5) + _system([(5, 100)], start=1007.5) + _system([(100, 5)], start=1001.0)
    ev = built_run(tmp_path / "r", summary={"train_time_s": 8.0}, events=events, system=system)
    found = checks.evaluation_share(ev)
    assert found.saving == pytest.approx(0.125)
    assert found.evidence.endswith("over 2 epoch(s); idle during evaluation: rank 0 100%, rank 1 0.0%")


def test_first_epoch_overhead_one_epoch_two_epochs_and_a_quarter(tmp_path):
    one = checks.first_epoch_overhead(built_run(tmp_path / "one", summary={"epoch_times_s": [4.0]}))
    assert one.rerun == {"epochs": 2} and one.saving is None and one.severity == "advice"
    assert " --epochs 2" in one.remedy and one.remedy.endswith(" (the summary then times the epochs after the first)")
    script = built_run(tmp_path / "script", {"script": "train.py"}, {"epoch_times_s": [4.0]})
    assert checks.first_epoch_overhead(script) is None
    two = checks.first_epoch_overhead(built_run(tmp_path / "two", summary={"epoch_times_s": [5.0, 1.0]}))
    assert two.finding == "start-up costs 67% of the training time"
    quarter = built_run(tmp_path / "q", summary={"epoch_times_s": [3.0, 1.0, 1.0, 1.0, 1.0, 1.0]})  # (3 - 1) / 8
    assert checks.first_epoch_overhead(quarter).finding == "start-up costs 25% of the training time"


def test_batch_sqrt_n_and_warmup_edges(tmp_path):
    script = built_run(tmp_path / "script", {"script": "train.py", "batch_size": 4}, {"batch_size": 4})
    assert checks.small_device_batch(script) is None
    # sqrt(N) over 2 workers x 3 micro-steps: 100 // 6 = 16.
    six = built_run(
        tmp_path / "six",
        {"grad_accum": 3, "resolved": {"train_samples": 10_000}},
        {"grad_accum": 3, "global_batch_size": 192},
    )
    found = checks.global_batch_sqrt_n(six)
    assert found.rerun == {"batch_size": 16} and "--batch-size 16" in found.remedy and found.saving is None
    many = built_run(
        tmp_path / "many",
        {"grad_accum": 8, "resolved": {"train_samples": 100}},
        {"grad_accum": 8, "global_batch_size": 512},
    )
    # ...and 2 replicas x 8 micro-steps alone exceed sqrt(100) = 10: the micro-steps go down to 10 // 2 = 5 (at a
    # batch of 1 and 8 micro-steps the rerun's global batch of 16 would still exceed the bound).
    fewer = checks.global_batch_sqrt_n(many)
    assert fewer.rerun == {"batch_size": 1, "grad_accum": 5} and "--grad-accum 5" in fewer.remedy
    assert fewer.global_batch_factor == 10 / 512
    unknown_n = built_run(tmp_path / "n", summary={"global_batch_size": 512})
    assert checks.global_batch_sqrt_n(unknown_n) is None
    # warmup: none without a global or a base batch; none for --lr-scaling none even at 64x; at most 5 epochs.
    resolved = {"global_batch_size": 8192, "reference_batch_size": 128}
    for name, config in {
        "no-g": {"lr_scaling": "linear", "resolved": {**resolved, "global_batch_size": None}},
        "no-ref": {"lr_scaling": "linear", "resolved": {**resolved, "reference_batch_size": None}},
        "none": {"lr_scaling": "none", "resolved": resolved},
    }.items():
        assert checks.no_warmup(built_run(tmp_path / name, config)) is None, name
    long = checks.no_warmup(built_run(tmp_path / "long", {"lr_scaling": "sqrt", "epochs": 40, "resolved": resolved}))
    assert long.rerun == {"warmup_epochs": 5.0} and "--warmup-epochs 5" in long.remedy and long.saving is None
    unset = checks.no_warmup(
        built_run(tmp_path / "unset", {"lr_scaling": "sqrt", "epochs": None, "resolved": resolved})
    )
    assert unset.rerun == {"warmup_epochs": 0.25}


def test_idle_devices_names_the_gpus_idle_a_fifth_of_the_run(tmp_path):
    def gpu(index, utilisations):
        return [
            {"time": 100.0 + t, "kind": "gpu", "index": index, "utilization_percent": u}
            for t, u in enumerate(utilisations)
        ]

    # GPU 0 idle in 2 of 10 samples (exactly 20 %), GPU 1 in 1 (10 %, not named).
    system = gpu(0, [5, 5] + [90] * 8) + gpu(1, [5] + [90] * 9)
    found = checks.idle_devices(built_run(tmp_path / "r", {"resolved": {"device": "cuda"}}, system=system))
    assert found.finding == "GPU 0 idle 20% of the run" and found.saving is None
    assert found.evidence == "share of the monitor's samples with utilisation under 10 %: GPU 0 20% of 10"
    assert checks.idle_devices(built_run(tmp_path / "s", system=gpu(0, [5] + [90] * 9))) is None


def test_the_knee_among_complete_trials_with_a_rate_and_a_best_trial_with_a_batch(tmp_path):
    trials = [_trial(8, 100), _trial(16, 180), _trial(32, 190), _trial(64, 200)]  # 190 is exactly 95 %
    assert "knee (32)" in study_checks.batch_knee(trials, _best(batch_size=16)).finding
    failed = _trial(128, 1000, state="FAIL")
    unmeasured = _trial(256, 0)
    assert "knee (32)" in study_checks.batch_knee([*trials, failed, unmeasured], _best(batch_size=16)).finding
    assert "knee (32)" in study_checks.batch_knee(trials[1:], _best(batch_size=16)).finding  # 3 batches suffice
    assert study_checks.batch_knee(trials, _best(lr=0.1)) is None
    assert study_checks.batch_knee(trials, _best()) is None
    assert study_checks.batch_knee(trials, None) is None


def test_lr_not_scaled_reads_the_scaling_rows_from_first_to_last(tmp_path):
    rows = [
        {"workers": n, "global_batch_size": 64 * n, "lr": 0.1, "val_accuracy": 0.5, "run_dir": str(n)}
        for n in (1, 2, 4)
    ]
    reference = {**rows[0], "point": "all_cores_reference", "run_dir": "ref"}
    configs = {r["run_dir"]: {"lr_scaling": "none"} for r in [*rows, reference]}
    found = study_checks.lr_not_scaled(_study([*rows, reference], "weak"), configs)
    assert found.finding == "weak scaling grew the global batch 4x but not the LR"
    assert study_checks.lr_not_scaled(_study(rows, "weak"), {"1": {"lr_scaling": "none"}}) is None
    moved = [*rows[:2], {**rows[2], "lr": 0.4}]
    assert study_checks.lr_not_scaled(_study(moved, "weak"), configs) is None
    flat = [{**r, "global_batch_size": 64} for r in rows]
    assert study_checks.lr_not_scaled(_study(flat, "weak"), configs) is None


# -- a batch that grew (--batch-schedule) ----------------------------------------------------------------


def grown(kind: str, start: int, final: int, largest: int, per_rank: tuple[int, int], noise: float | None = None):
    """summary.json's batch_schedule block: global batches (start, final, largest), per-rank (final, largest)."""
    return {
        "batch_schedule": {
            "kind": kind,
            "start_global_batch": start,
            "final_global_batch": final,
            "largest_global_batch": largest,
            "final_per_rank_batch": per_rank[0],
            "largest_per_rank_batch": per_rank[1],
            "noise_scale": noise,
        }
    }


def test_a_grown_batch_is_judged_where_it_ended(tmp_path):
    # 2 workers of 4 growing to 16 a rank: no longer small; held at 4 by the per-rank limit: raise the limit
    grew = built_run(tmp_path / "grew", {"batch_size": 4}, grown("warmup", 8, 32, 32, (16, 16)))
    assert checks.small_device_batch(grew) is None
    held = built_run(tmp_path / "held", {"batch_size": 4}, grown("warmup", 8, 32, 32, (4, 4)))
    found = checks.small_device_batch(held)
    assert found.rerun == {"max_batch_size": 8} and "--max-batch-size 8" in found.remedy
    assert found.evidence.startswith("--max-batch-size 4 on 2 worker(s)")
    # adaptive could have grown it to 16 and timed that it did not pay: nothing to say
    timed = built_run(tmp_path / "timed", {"batch_size": 4}, grown("adaptive", 8, 8, 64, (4, 16), noise=50.0))
    assert checks.small_device_batch(timed) is None
    # N = 10,000 (sqrt 100): grown from 32 to 512, the cap goes to 100 (room to double from 32); grown from 64,
    # whose double is past 100, the start goes down to 100 // 2 a worker
    resolved = {"resolved": {"train_samples": 10_000}}
    past = built_run(
        tmp_path / "past",
        {"batch_size": 16, **resolved},
        {"batch_size": 16, "global_batch_size": 32, **grown("adaptive", 32, 512, 512, (256, 256))},
    )
    found = checks.global_batch_sqrt_n(past)
    assert found.rerun == {"max_global_batch": 100} and "--max-global-batch 100" in found.remedy
    assert found.evidence.startswith("global batch 512 (--batch-schedule adaptive grew it from 32, 2 replica(s) x 16)")
    high = built_run(tmp_path / "high", resolved, {"global_batch_size": 64, **grown("warmup", 64, 512, 512, (64, 64))})
    assert checks.global_batch_sqrt_n(high).rerun == {"batch_size": 50}


def test_an_adaptive_batch_stopped_by_its_cap_while_the_noise_allows_more(tmp_path):
    capped = built_run(tmp_path / "capped", {}, grown("adaptive", 64, 256, 256, (128, 128), noise=1100.0))
    found = checks.batch_growth_capped(capped)
    assert found.rerun == {"max_global_batch": 1024} and "--max-global-batch 1024" in found.remedy
    assert found.saving is None and "noise scale at 1100" in found.finding
    # A cap off the powers of two (8 x 3 ranks x 8): its doublings under the noise, 192 x 2 = 384, not 256.
    three = built_run(tmp_path / "three", {}, grown("adaptive", 24, 192, 192, (64, 64), noise=400.0))
    assert checks.batch_growth_capped(three).rerun == {"max_global_batch": 384}
    # below twice the cap, short of the cap, or a fixed ramp: nothing
    assert (
        checks.batch_growth_capped(built_run(tmp_path / "a", {}, grown("adaptive", 64, 256, 256, (128, 128), 500.0)))
        is None
    )
    assert (
        checks.batch_growth_capped(built_run(tmp_path / "b", {}, grown("adaptive", 64, 128, 256, (64, 128), 1e4)))
        is None
    )
    assert (
        checks.batch_growth_capped(built_run(tmp_path / "c", {}, grown("warmup", 64, 256, 256, (128, 128), 1e4)))
        is None
    )
    # the all-reduce share is the adaptive schedule's to weigh: exposed_communication leaves it
    heavy = built_run(tmp_path / "heavy", {}, grown("adaptive", 64, 256, 256, (128, 128), 100.0))
    assert heavy.share("comm_s") >= checks.COMM_SHARE and checks.exposed_communication(heavy) is None


def test_a_grown_batch_at_its_edges(tmp_path):
    """Each case kills a plausible mistake in the grown-batch branches (scripts/mutate.py doctor/checks.py)."""
    # adaptive that never had room above the batch it ended at (largest per-rank = final): not timed, so said
    same = built_run(tmp_path / "same", {"batch_size": 4}, grown("adaptive", 8, 8, 64, (4, 4), noise=50.0))
    assert checks.small_device_batch(same).rerun == {"max_batch_size": 8}
    # a summary written before the per-rank limit was recorded: the batch itself stands in for it
    older = grown("adaptive", 8, 8, 64, (4, 4), noise=50.0)
    del older["batch_schedule"]["largest_per_rank_batch"]
    found = checks.small_device_batch(built_run(tmp_path / "older", {"batch_size": 4}, older))
    assert found.evidence.startswith("--max-batch-size 4 on 2 worker(s)")
    # started at 6 a rank and held under a limit of 7: the remedy's limit is twice the start, the evidence names 7
    held = built_run(tmp_path / "held", {"batch_size": 6}, grown("warmup", 12, 48, 48, (6, 7)))
    found = checks.small_device_batch(held)
    assert found.rerun == {"max_batch_size": 12} and found.evidence.startswith("--max-batch-size 7 on 2 worker(s)")
    # N = 10,000 (sqrt 100), started at exactly half of it: the growth is capped at 100
    resolved = {"resolved": {"train_samples": 10_000}}
    half = built_run(
        tmp_path / "half",
        {"batch_size": 25, **resolved},
        {"batch_size": 25, "global_batch_size": 50, **grown("adaptive", 50, 400, 400, (200, 200))},
    )
    assert checks.global_batch_sqrt_n(half).rerun == {"max_global_batch": 100}
    # the noise scale at exactly twice the cap: the growth was capped
    twice = built_run(tmp_path / "twice", {}, grown("adaptive", 64, 256, 256, (128, 128), noise=512.0))
    assert checks.batch_growth_capped(twice).rerun == {"max_global_batch": 512}


def test_lr_not_scaled_names_the_accuracy_change_and_needs_both_global_batches(tmp_path):
    rows = [
        {"workers": 1, "global_batch_size": 64, "lr": 0.1, "val_accuracy": 0.5, "run_dir": "a"},
        {"workers": 2, "global_batch_size": 128, "lr": 0.1, "val_accuracy": 0.4, "run_dir": "b"},
    ]
    configs = {"a": {"lr_scaling": "none"}, "b": {"lr_scaling": "none"}}
    found = study_checks.lr_not_scaled(_study(rows, "weak"), configs)
    assert (
        found.evidence == "global batch 64 -> 128, LR 0.1 at every point (--lr-scaling none); accuracy 50.0% -> 40.0%"
    )
    for missing in ({"val_accuracy": None}, {}):
        unmeasured = [{**rows[0], **missing}, {**rows[1], "val_accuracy": None}]
        found = study_checks.lr_not_scaled(_study(unmeasured, "weak"), configs)
        assert found.evidence.endswith("(--lr-scaling none)")
    # a script's study reports no global batch at its first point: nothing to compare
    first_unknown = [{**rows[0], "global_batch_size": None}, rows[1]]
    assert study_checks.lr_not_scaled(_study(first_unknown, "weak"), configs) is None
