"""Edges (issue #58) of the probe's summary (launch/probe_summary.py), by hand: when the probe block says the
ranks trained one model together, the garbage collections' sites and the model's own collectives' issuers
summed over the steady steps, the DDP bucket logs kept, and each rank's trace compressed into the kept
file. Records are written as the formula tests write them (`step`, `write_probe`)."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from test_formulas_causes import trace_events
from test_formulas_probe_summary import step, write_probe

from paratrain.launch.probe import RAW_TRACE_FILE, TRACE_FILE
from paratrain.launch.probe_summary import (
    BUCKET_LOGS,
    GC_SITES,
    PROBE_DIR,
    gc_sites,
    keep_trace,
    rank_record,
    summarise,
    synchronised,
)
from paratrain.launch.trace_summary import summarise_trace


def counted(collectives: list[int], **fields) -> list[dict]:
    """Steps of a probe that counted each step's collectives."""
    return [step(i, collectives=c, **fields) for i, c in enumerate(collectives)]


def test_collectives_after_the_first_step_are_summed_only_when_every_step_counted_them():
    # The first step's 5 (a barrier, the weights' broadcast) are set-up; 4 + 0 + 2 + 1 after it.
    assert rank_record(0, counted([5, 4, 0, 2, 1]))["collectives_after_first_step"] == 7
    older = counted([5, 4, 0, 2, 1])
    del older[3]["collectives"]  # one step of a probe that did not count them
    assert "collectives_after_first_step" not in rank_record(0, older)


@pytest.mark.parametrize(
    "ranks, verdict",
    [
        # Two ranks, one collective after the first step on one of them: trained together.
        ([{"steps": 2, "collectives_after_first_step": 1}, {"steps": 2, "collectives_after_first_step": 0}], True),
        # No collective after set-up, no DDP: independent copies.
        ([{"steps": 5, "collectives_after_first_step": 0}, {"steps": 5, "collectives_after_first_step": 0}], False),
        # DDP on one rank is enough, without a counted collective.
        (
            [
                {"steps": 5, "collectives_after_first_step": 0, "ddp": {"bucket_cap_mb": 25}},
                {"steps": 5, "collectives_after_first_step": 0},
            ],
            True,
        ),
        # Three ranks, none synchronising.
        ([{"steps": 3, "collectives_after_first_step": 0}] * 3, False),
        # One rank: nothing to synchronise with.
        ([{"steps": 5, "collectives_after_first_step": 4}], None),
        # A rank with one step, or none recorded: its set-up collectives cannot be told apart.
        ([{"steps": 1, "collectives_after_first_step": 4}, {"steps": 5, "collectives_after_first_step": 4}], None),
        ([{"collectives_after_first_step": 4}, {"steps": 5, "collectives_after_first_step": 4}], None),
        # A rank of a probe that did not count collectives.
        ([{"steps": 5, "ddp": {"bucket_cap_mb": 25}}, {"steps": 5, "collectives_after_first_step": 4}], None),
    ],
)
def test_the_ranks_synchronised_when_one_wrapped_ddp_or_called_a_collective_after_set_up(ranks, verdict):
    assert synchronised(ranks) is verdict


def test_the_probe_block_says_whether_the_ranks_synchronised(tmp_path):
    together = {0: counted([3, 0, 1, 0]), 1: counted([3, 0, 1, 0])}
    apart = {0: counted([3, 0, 0, 0]), 1: counted([3, 0, 0, 0])}
    assert summarise(write_probe(tmp_path / "together", together))["probe"]["synchronised"] is True
    assert summarise(write_probe(tmp_path / "apart", apart))["probe"]["synchronised"] is False
    alone = summarise(write_probe(tmp_path / "alone", {0: counted([3, 0, 1, 0])}))["probe"]
    assert "synchronised" in alone and alone["synchronised"] is None


def test_gc_sites_sum_each_site_over_the_steps_per_step_the_most_first():
    # 4 steps: "b.py" 0.1 + 0.3 = 0.4 s, "a.py" 0.2 s, "d.py" 0.6 s, "c.py" 0.04 s (fourth: left out).
    used = [
        step(0, gc_sites={"b.py": 0.1, "a.py": 0.2}),
        step(1, gc_sites={"b.py": 0.3, "c.py": 0.04}),
        step(2, gc_sites={"d.py": 0.6}),
        step(3),
    ]
    assert GC_SITES == 3
    assert gc_sites(used) == {
        "gc_sites": [["d.py", pytest.approx(0.15)], ["b.py", pytest.approx(0.1)], ["a.py", pytest.approx(0.05)]]
    }
    assert gc_sites([step(0), step(1)]) == {}  # no long collection: no sites at all


def test_a_rank_record_sums_the_model_issuers_and_keeps_the_first_bucket_logs():
    # 12 steps: 2 of warm-up, 10 steady. The model's own collectives' issuers over the steady steps:
    # "a" 10 x 2 = 20, "m" 7 once, "z" 2 x 3 = 6 (steps 0 and 1 are warm-up), "b" 1 once (fourth: left out);
    # per step: / 10.
    # Each steady step i logs its buckets; the first 8 are kept, with its backward's span.
    def issued(i: int) -> dict:
        return {"z": 3, "a": 2} if i < 4 else {"a": 2, "m": 7 if i == 5 else 0, "b": 1 if i == 6 else 0}

    records = [step(i, model_issuers=issued(i), bucket_log=[[i, 0.001 * i]], backward_span=0.01 * i) for i in range(12)]
    record = rank_record(0, records)
    assert record["model_issuers"] == [["a", 2.0], ["m", pytest.approx(0.7)], ["z", pytest.approx(0.6)]]
    assert BUCKET_LOGS == 8
    assert record["bucket_logs"] == [
        {"buckets": [[i, 0.001 * i]], "backward_s": 0.01 * i} for i in range(2, 2 + BUCKET_LOGS)
    ]
    # Steps without issuers or bucket logs: neither key.
    plain = rank_record(0, [step(i, bucket_log=[]) for i in range(12)])
    assert "model_issuers" not in plain and "bucket_logs" not in plain


def write_trace(path, rank: int = 0) -> bytes:
    """A rank's plain trace, as torch's export writes it: one step of forward, backward, optimizer."""
    events = trace_events([("forward", 0, 100), ("backward", 100, 250), ("optimizer", 250, 300)], [])
    raw = json.dumps({"traceEvents": events}).encode()
    (path / RAW_TRACE_FILE.format(rank=rank)).write_bytes(raw)
    return raw


def test_a_ranks_trace_is_compressed_into_the_kept_file_and_the_plain_one_removed(tmp_path):
    raw = write_trace(tmp_path, rank=3)
    kept = keep_trace(tmp_path, 3)
    assert kept == tmp_path / "trace-rank3.json.gz" == tmp_path / TRACE_FILE.format(rank=3)
    assert gzip.decompress(kept.read_bytes()) == raw
    # A middle level: gzip's header flags the extremes (2 for level 9, 4 for level 1), 0 in between.
    assert kept.read_bytes()[8] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace-rank3.json.gz"]
    # Nothing to compress (no profiled steps, or already compressed): the kept name, nothing written.
    assert keep_trace(tmp_path, 4) == tmp_path / "trace-rank4.json.gz"
    assert keep_trace(tmp_path, 3) == kept and gzip.decompress(kept.read_bytes()) == raw
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace-rank3.json.gz"]


def test_a_trace_that_cannot_be_compressed_is_kept_plain(tmp_path):
    # The disk fills while compressing (the kept file's writes go to /dev/full): the half-written file is
    # removed and the plain one kept.
    raw = write_trace(tmp_path, rank=1)
    os.symlink("/dev/full", tmp_path / "trace-rank1.json.gz")
    assert keep_trace(tmp_path, 1) == tmp_path / "trace-rank1.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace-rank1.json"]
    assert (tmp_path / "trace-rank1.json").read_bytes() == raw
    # The plain trace cannot be read (a directory in its place): nothing was written to remove.
    (tmp_path / "trace-rank2.json").mkdir()
    assert keep_trace(tmp_path, 2) == tmp_path / "trace-rank2.json"
    assert not (tmp_path / "trace-rank2.json.gz").exists()


def test_summarise_keeps_each_ranks_trace_and_its_summary(tmp_path):
    run = write_probe(tmp_path, {0: [step(i) for i in range(4)], 1: [step(i) for i in range(4)]})
    write_trace(run / PROBE_DIR, rank=1)
    ranks = summarise(run)["probe"]["ranks"]
    with gzip.open(run / PROBE_DIR / "trace-rank1.json.gz", "rt") as f:
        expected = summarise_trace(json.load(f)["traceEvents"])
    assert expected is not None and ranks[1]["trace"] == expected
    assert "trace" not in ranks[0]  # rank 0 profiled nothing
    assert not (run / PROBE_DIR / "trace-rank1.json").exists()


def test_steps_that_began_an_epoch_are_priced_over_the_median_plain_step_by_phase():
    from paratrain.launch.probe_summary import excess_s

    def s(wall, data, other, began=False, evaluated=0.0):
        return {"wall_s": wall, "data": data, "other": other, "eval": evaluated, "checkpoint": 0.0} | (
            {"epoch_began": True} if began else {}
        )

    steps = [
        s(0.010, 0.001, 0.002),
        s(0.012, 0.001, 0.004),
        s(0.011, 0.003, 0.003),
        s(0.211, 0.051, 0.153, began=True),  # 200 ms over the 11 ms median: 50 ms data, 150 ms other
        s(0.111, 0.001, 0.103, began=True),  # 100 ms over: no data, 100 ms other
        s(0.511, 0.001, 0.003, began=True, evaluated=0.5),  # began an epoch while evaluating: evaluation's
    ]
    out = excess_s(steps)
    assert out["epoch_starts"] == 2
    assert out["epoch_start_excess_s"] == pytest.approx(0.300 / 6)
    # medians of the plain steps: data 1 ms, other 3 ms
    assert out["epoch_start_phases_s"] == pytest.approx({"data": 0.050 / 6, "other": 0.250 / 6})
    assert out["eval_excess_s"] == pytest.approx(0.500 / 6)
    assert "epoch_starts" not in excess_s(steps[:3])
    # a loader iterated afresh every step begins an epoch every step: nothing to price it against, and the
    # evaluation's excess is still over the median step without one (211 and 111 ms: 161 ms; 350 ms over)
    every = excess_s(steps[3:])
    assert "epoch_starts" not in every and every["eval_excess_s"] == pytest.approx(0.350 / 3)
