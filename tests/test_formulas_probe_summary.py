"""The probe's records turned into summary.json's `breakdown` and `probe` blocks (launch/probe_summary.py),
against hand-computed cases: which steps are steady, each per-step mean, the excess of evaluation and
checkpoint steps, the loader workers' pauses, the device's phases, and the status when there is
nothing to summarise. Records are written as launch/probe.py writes them, one JSON line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from paratrain.launch.probe import DEVICE_PHASES, PHASES
from paratrain.launch.probe_summary import (
    PROBE_DIR,
    device_record,
    excess_s,
    off,
    own_time_s,
    rank_record,
    steady,
    summarise,
    unequal_wait_s,
    used_steps,
    worker_pause_record,
)


def step(number: int, wall: float = 0.1, **fields: Any) -> dict[str, Any]:
    """A step record: 0.1 s of which data 0.01, forward 0.02, backward 0.03, comm 0.01, optimizer 0.02,
    other 0.01; 32 samples in 2 micro-steps and 1 all-reduce round."""
    phases = dict.fromkeys(PHASES, 0.0) | {
        "data": 0.01,
        "forward": 0.02,
        "backward": 0.03,
        "comm": 0.01,
        "optimizer": 0.02,
        "other": 0.01,
    }
    return {
        "kind": "step",
        "step": number,
        "wall_s": wall,
        **phases,
        "samples": 32,
        "micro": 2,
        "rounds": 1,
        "data_cpu": 0.004,
        "ddp_overhead": 0.001,
        **fields,
    }


def write_probe(run: Path, ranks: dict[int, list[dict[str, Any]]]) -> Path:
    (run / PROBE_DIR).mkdir(parents=True)
    for rank, records in ranks.items():
        (run / PROBE_DIR / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.parametrize(
    "count, first_steady",
    [(30, 3), (20, 2), (10, 2), (6, 2), (5, 2), (4, 2), (3, 1), (1, 0)],  # a tenth, at least 2 while as many remain
)
def test_the_steady_steps_follow_a_tenth_of_the_run_or_its_first_half(count, first_steady):
    steps = list(range(count))
    assert steady(steps) == steps[first_steady:]


def test_a_rank_record_means_its_steady_steps_and_keeps_its_last_state():
    # 10 steps: 2 of warm-up. Of the 8 steady: one with an evaluation (0.3 s), one with a checkpoint
    # (0.5 s), six plain (0.1 s). A plain step is the median 0.1 s: evaluation costs (0.3 - 0.1) / 8 =
    # 0.025 s a step, checkpoints (0.5 - 0.1) / 8 = 0.05 s.
    records = [
        {"kind": "state", "step": 0, "threads": 4, "ddp": {"bucket_cap_mb": 25}},
        *[step(i) for i in range(2)],
        *[step(i) for i in range(2, 8)],
        step(8, wall=0.3, eval=0.2),
        step(9, wall=0.5, checkpoint=0.4, syncs=2, sync_wait=0.08),
        {"kind": "state", "step": 5, "threads": 2},
        *[{"kind": "device", "step": s, "span_s": 0.09, **dict.fromkeys(DEVICE_PHASES, 0.02)} for s in (1, 5)],
    ]
    record = rank_record(1, records)
    assert record["rank"] == 1 and (record["steps"], record["steady_steps"]) == (10, 8)
    assert record["threads"] == 2 and record["ddp"] == {"bucket_cap_mb": 25}  # the last state, merged
    assert record["step_s"] == pytest.approx(1.4 / 8) and record["wall_s"] == pytest.approx(1.4)  # 6 x 0.1 + 0.3 + 0.5
    assert record["step_s_median"] == pytest.approx(0.1)
    assert record["phases_s"]["forward"] == pytest.approx(0.02)
    assert record["phases_s"]["eval"] == pytest.approx(0.2 / 8)
    assert record["phases_s"]["checkpoint"] == pytest.approx(0.4 / 8)
    assert (record["samples_per_step"], record["micro_per_step"], record["rounds_per_step"]) == (32, 2, 1)
    assert record["syncs_per_step"] == pytest.approx(2 / 8) and record["sync_wait_s"] == pytest.approx(0.01)
    assert record["data_cpu_s"] == pytest.approx(0.004) and record["ddp_overhead_s"] == pytest.approx(0.001)
    assert (record["eval_steps"], record["checkpoint_steps"]) == (1, 1)
    assert record["eval_excess_s"] == pytest.approx(0.025) and record["checkpoint_excess_s"] == pytest.approx(0.05)
    assert "fallback" not in record and "paused_steps" not in record
    assert "kind" not in record and "step" not in record  # a state record's own keys
    assert record["device_steps"] == 1 and record["device_step_s"] == pytest.approx(0.09)  # step 1 is warm-up


def test_phases_an_older_probe_did_not_record_count_as_none():
    bare = [{k: v for k, v in step(i).items() if k != "collective"} for i in range(10)]
    phases = rank_record(0, bare)["phases_s"]
    assert phases["collective"] == 0.0 and phases["data"] == pytest.approx(0.01)


def test_a_rank_without_steps_has_no_means_and_a_fallback_is_named():
    records = [{"kind": "fallback", "where": "Module.__call__", "error": "TypeError: boom"}]
    assert rank_record(0, records) == {
        "rank": 0,
        "steps": 0,
        "steady_steps": 0,
        "fallback": "Module.__call__: TypeError: boom",
    }


def test_excess_needs_a_plain_step_and_counts_only_what_exceeds_it():
    assert excess_s([step(0, eval=0.1), step(1, checkpoint=0.1)]) == {}
    # plain steps 0.1, 0.2, 0.3 (median 0.2); an evaluation step faster than that adds nothing
    used = [step(0, 0.1), step(1, 0.2), step(2, 0.3), step(3, 0.15, eval=0.05), step(4, 0.6, eval=0.4)]
    assert excess_s(used) == {"eval_excess_s": pytest.approx(0.4 / 5), "checkpoint_excess_s": 0.0}


def test_the_loader_workers_paused_steps_and_what_they_cost():
    # Steady steps: forward + backward 0.05 s over 2 micro-steps (0.025 each). Two pauses of one
    # DataLoader iterator: 0.02 s a micro-step without its workers; between the pauses the workers
    # used 1.5 CPU s for 30 batches (0.05 s a batch); a batch made in the rank took 0.04 and 0.06 s.
    used = [step(i) for i in range(2, 10)]
    paused = [
        step(3, loader_id=7, paused_micro=1, paused_fb=0.02, loader_cpu_s=2.0, loader_batches=10, inline_load_s=0.04),
        step(6, loader_id=7, paused_micro=2, paused_fb=0.04, loader_cpu_s=3.5, loader_batches=40, inline_load_s=0.06),
    ]
    record = worker_pause_record(used + paused, used)
    assert record == pytest.approx(
        {
            "paused_steps": 2,
            "fb_per_micro_s": 0.025,
            "paused_fb_per_micro_s": 0.02,
            "loader_cpu_per_batch_s": 0.05,
            "inline_load_s": 0.05,
        }
    )
    # Two iterators: each one's own readings; without batches in between, no cost per batch.
    other = [
        step(4, loader_id=8, paused_micro=1, paused_fb=0.02, loader_cpu_s=9.0, loader_batches=5),
        step(8, loader_id=8, paused_micro=1, paused_fb=0.02, loader_cpu_s=9.5, loader_batches=15),
    ]
    both = worker_pause_record(used + paused + other, used)
    assert both["loader_cpu_per_batch_s"] == pytest.approx((1.5 + 0.5) / (30 + 10))
    still = [{**s, "loader_batches": 10} for s in paused]
    assert "loader_cpu_per_batch_s" not in worker_pause_record(used + still, used)
    assert worker_pause_record(used, used) == {} and worker_pause_record(paused, []) == {}
    # One batch between the pauses is enough; a steady step of one micro-step counts, one of none is left out.
    one = [{**paused[0], "loader_batches": 10}, {**paused[1], "loader_batches": 11}]
    assert worker_pause_record(used + one, used)["loader_cpu_per_batch_s"] == pytest.approx(1.5)
    single = [step(i, micro=1) for i in range(2, 10)] + [step(10, micro=0, forward=0.0, backward=0.0)]
    assert worker_pause_record(single + paused, single)["fb_per_micro_s"] == pytest.approx(0.05)


def test_the_device_phases_of_the_steady_steps_only():
    records = [
        {"kind": "device", "step": s, "span_s": 0.1 * s, **dict.fromkeys(DEVICE_PHASES, 0.01 * s)} for s in (1, 2, 4)
    ]
    record = device_record(records, {2, 4})
    assert record["device_steps"] == 2 and record["device_step_s"] == pytest.approx(0.3)
    assert record["device_phases_s"] == pytest.approx(dict.fromkeys(DEVICE_PHASES, 0.03))
    assert device_record(records, {3}) == {}


def test_summarise_two_ranks_into_the_five_phases_and_the_runs_samples_per_second(tmp_path):
    # Rank 0 as step() (0.1 s); rank 1 0.2 s a step: other 0.11, checkpoints 0.01, its own collectives 0.02.
    # Means of the two: comm 0.01 + collective 0.01; other 0.06 + checkpoints 0.005.
    # The five phases are the ranks' means; samples/s: both ranks' 8 steady steps x 32 samples, over the
    # slower rank's 1.6 s.
    slow = [step(i, wall=0.2, other=0.11, checkpoint=0.01, collective=0.02) for i in range(10)]
    run = write_probe(tmp_path, {0: [step(i) for i in range(10)], 1: slow})
    out = summarise(run)
    assert out["breakdown"] == pytest.approx(
        {"data_s": 0.01, "compute_s": 0.05, "comm_s": 0.02, "optimizer_s": 0.02, "other_s": 0.065}
    )
    assert out["probe"]["status"] == "on" and [r["rank"] for r in out["probe"]["ranks"]] == [0, 1]
    assert out["probe"]["step_s"] == pytest.approx(0.15)
    assert out["probe"]["phases_s"] == pytest.approx(
        dict.fromkeys(PHASES, 0.0)
        | {"data": 0.01, "forward": 0.02, "backward": 0.03, "comm": 0.01, "collective": 0.01, "optimizer": 0.02}
        | {"other": 0.06, "checkpoint": 0.005}
    )
    # Steps that report no samples: no samples/s.
    empty = summarise(write_probe(tmp_path / "empty", {0: [step(i, samples=0) for i in range(10)]}))
    assert "samples_per_s" not in empty["probe"]
    assert out["probe"]["samples_per_s"] == pytest.approx(2 * 8 * 32 / 1.6)
    assert out["probe"]["all_reduce_s"] == pytest.approx(0.01)  # both ranks' comm, 10 ms every step
    assert "all_reduce_s" not in empty["probe"]  # one rank: no all-reduce to time


def test_the_all_reduce_is_the_least_waiting_rank_in_each_step_over_the_steps_all_ranks_ran(tmp_path):
    # 10 steps, the first 2 warm-up. From step 2 each rank waits 40 ms for the other in alternate steps (each
    # lost its core in turn): each rank's mean comm is 30 ms, the all-reduce's own 10 ms.
    rank0 = [step(i, comm=0.05 if i % 2 else 0.01) for i in range(10)]
    rank1 = [step(i, comm=0.01 if i % 2 else 0.05) for i in range(10)]
    run = write_probe(tmp_path / "alternate", {0: rank0, 1: rank1})
    out = summarise(run)
    assert [r["phases_s"]["comm"] for r in out["probe"]["ranks"]] == pytest.approx([0.03, 0.03])
    assert out["probe"]["all_reduce_s"] == pytest.approx(0.01)
    # Steps 2..9 steady; only the steps both ranks ran count (rank 1 has no step 9), and the loader-paused step 3
    # of rank 0 is left out: per step min(0.002 i, 0.003 i) over steps 2, 4..8 = 0.002 x (2+4+5+6+7+8) / 6.
    rank0 = [step(i, comm=0.002 * i) for i in range(10)]
    rank0[3]["loader_id"] = 1
    rank1 = [step(i, comm=0.003 * i) for i in range(9)]
    steady_steps = [rank_record(0, rank0), rank_record(1, rank1)]
    assert [r["steady_steps"] for r in steady_steps] == [7, 7]
    assert own_time_s([used_steps(rank0), used_steps(rank1)], "comm") == pytest.approx(0.002 * 32 / 6)
    assert own_time_s([used_steps(rank0)], "comm") is None
    assert own_time_s([used_steps(rank0), []], "comm") is None
    # the script's own collectives alike: a barrier that rank 1 waits at while rank 0 evaluates
    rank0 = [step(i, collective=0.001) for i in range(10)]
    rank1 = [step(i, collective=0.021) for i in range(10)]
    out = summarise(write_probe(tmp_path / "barrier", {0: rank0, 1: rank1}))
    assert out["probe"]["collective_own_s"] == pytest.approx(0.001) and out["probe"]["all_reduce_s"] == 0.01


def test_summarise_orders_ranks_by_number_and_says_why_it_has_nothing(tmp_path):
    run = write_probe(tmp_path / "many", {r: [step(i) for i in range(4)] for r in (10, 2, 0)})
    assert [r["rank"] for r in summarise(run)["probe"]["ranks"]] == [0, 2, 10]
    assert summarise(tmp_path / "none") == {
        "probe": {"status": "no data", "reason": "no rank wrote probe records (did the script import torch?)"}
    }
    fallback = [{"kind": "fallback", "where": "Optimizer.step", "error": "boom"}, *[step(i) for i in range(4)]]
    fallback0 = [{"kind": "fallback", "where": "Module.__call__", "error": "bad"}]
    fell = summarise(write_probe(tmp_path / "fell", {0: fallback0, 1: fallback}))
    assert fell == {
        "probe": {
            "status": "fell back",
            "ranks": fell["probe"]["ranks"],
            "reason": "rank 0: Module.__call__: bad; rank 1: Optimizer.step: boom (the script ran on untouched; only "
            "the monitor's samples describe this run)",
        }
    }
    states = summarise(write_probe(tmp_path / "states", {0: [{"kind": "state", "step": 0, "threads": 2}]}))
    assert states["probe"]["status"] == "no steps" and "breakdown" not in states
    assert states["probe"]["reason"] == (
        "no optimizer step was seen: the script never called optimizer.step() of a torch.optim optimizer"
    )
    assert off("--no-probe") == {"probe": {"status": "off", "reason": "--no-probe"}}


def test_the_wait_for_another_ranks_longer_collections_step_by_step():
    # step 1: 10 and 30 ms of collections -> the ranks wait (20 + 0) / 2 = 10 ms; step 2: 50 and 20 -> (0 + 30) / 2 =
    # 15 ms; step 3 only on rank 0: left out. Mean of 10 and 15: 12.5 ms
    rank0 = [{"step": 1, "gc_s": 0.01}, {"step": 2, "gc_s": 0.05}, {"step": 3, "gc_s": 0.9}]
    rank1 = [{"step": 1, "gc_s": 0.03}, {"step": 2, "gc_s": 0.02}]
    assert unequal_wait_s([rank0, rank1], "gc_s") == pytest.approx(0.0125)
    assert unequal_wait_s([rank0], "gc_s") is None
    assert unequal_wait_s([rank0, []], "gc_s") is None
