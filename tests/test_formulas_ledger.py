"""The doctor's account of the step (doctor/ledger.py) on hand-made probe records, each case computed by hand:
what no finding explains in `other`, an optimizer out of proportion, the user's Python inside forward and DDP's
own work in forward, each at its exact threshold (binary fractions, so the shares are exact floats), with the
texts a user reads: what ran and its share, where it was called from, the DDP settings and collectives quoted;
and the model's work against its expected cost once every other explanation is taken off."""

import json

import pytest
from test_formulas_doctor import probed_run

from paratrain.doctor.evidence import read_run
from paratrain.doctor.finding import Finding
from paratrain.doctor.ledger import (
    COMM_SHARE,
    DDP_FORWARD_SHARE,
    OPTIMIZER_SHARE,
    PYTHON_SHARE,
    UNEXPLAINED_SHARE,
    unexplained,
)
from paratrain.launch.trace_summary import PROBE_LABEL


def account(tmp_path, ranks, findings=(), strip=()):
    """The ledger's findings by check on a run of `ranks`, given the other `findings`; `strip`: keys left out of
    every rank's record (a probe from before they were recorded), "phases_s.<phase>" for a phase."""
    run = probed_run(tmp_path, ranks)
    if strip:
        summary = json.loads((run / "summary.json").read_text())
        for r in summary["probe"]["ranks"]:
            for key in strip:
                if key.startswith("phases_s."):
                    del r["phases_s"][key.removeprefix("phases_s.")]
                else:
                    del r[key]
        (run / "summary.json").write_text(json.dumps(summary))
    return {f.check: f for f in unexplained(read_run(run), list(findings))}


def explaining(**seconds):
    """Another check's finding that accounts for these seconds per step, by phase."""
    return Finding("garbage_collection", "", "", "", "", "", 0.1, explains=seconds)


def trace(phases=None, collectives=None):
    """A rank's profiled steps as launch/trace_summary.py records them."""
    out = {"steps": 2, "phases": phases or {}, "dtypes_s": {"float": 0.5}}
    return out if collectives is None else {**out, "collectives": collectives}


# -- the thresholds, at exactly their share of the step ----------------------------------------------------------


def test_other_at_exactly_a_tenth_of_the_step_is_unexplained_and_under_it_is_not(tmp_path):
    assert UNEXPLAINED_SHARE == 0.10
    found = account(tmp_path / "edge", [{"phases_s": {"forward": 0.5, "backward": 0.4, "other": 0.1}}] * 2)
    other = found["unexplained_other"]
    assert (
        other.finding == "10% of every step goes between the phases: the script's own Python, and no check explains it"
    )
    assert other.evidence == (
        "step 1,000 ms; 100 ms a step between the phases: the script's own Python; no trace was recorded (the "
        "profiler was off or failed)"
    )
    assert other.remedy == (
        "code change in train.py: look at the loop's code between optimizer steps; remove it from the step, do it "
        "less often, or move it out of the loop"
    )
    assert other.where is None and other.share == other.saving == pytest.approx(0.1) and other.bound
    assert other.explains == {"other": pytest.approx(0.1)} and other.predicted_gain.startswith("up to 1.11x faster")
    # 125 ms of a 1,000 ms step, 62.5 ms of it explained by another check: 6.25 % left, under the line
    under = [{"phases_s": {"forward": 0.5, "backward": 0.375, "other": 0.125}}] * 2
    assert "unexplained_other" in account(tmp_path / "whole", under)
    assert account(tmp_path / "part", under, [explaining(other=0.0625)]) == {}


def test_collectives_in_forward_and_backward_at_exactly_a_fifth_of_the_step_are_named_with_count_and_size(tmp_path):
    # an FSDP-like step of 1,000 ms: 200 ms in the parallelism's collectives, 40 calls (8 of them a layer's own,
    # which model_collectives prices) moving 4 MiB: 32 calls of 128 KiB, 6.25 ms each
    assert COMM_SHARE == 0.20
    rank = {
        "phases_s": {"forward": 0.3, "backward": 0.5, "comm": 0.2},
        "ddp": False,
        "inner_calls_per_step": 40,
        "model_calls_per_step": 8,
        "inner_bytes_per_step": 4 * 2**20,
    }
    comm = account(tmp_path / "edge", [rank] * 2)["unexplained_comm"]
    assert comm.finding == "20% of every step is collectives inside forward and backward that compute does not hide"
    assert "200 ms a step waiting on collectives in forward and backward: 32 calls a step of 128 KiB on average" in (
        comm.evidence
    )
    assert comm.evidence.endswith("(6.2 ms each)"), comm.evidence
    assert (
        comm.saving == comm.share == pytest.approx(0.2) and comm.bound and comm.explains == {"comm": pytest.approx(0.2)}
    )
    assert "fully_shard each block" in comm.remedy and comm.predicted_gain.startswith("up to 1.25x")
    # a quarter of it explained by another check: 15 % left, under the line
    assert "unexplained_comm" not in account(tmp_path / "part", [rank] * 2, [explaining(comm=0.05)])
    # a DDP rank's comm is its all-reduce's exposed tail (exposed_communication's), and with no collective issued
    # inside forward or backward there is nothing of another parallelism's to name
    assert "unexplained_comm" not in account(tmp_path / "ddp", [{**rank, "ddp": True}] * 2)
    assert "unexplained_comm" not in account(tmp_path / "none", [{**rank, "inner_calls_per_step": 0}] * 2)
    # a 500 ms step with 125 ms of it (25 %) in collectives, one rank recording no layer's own calls and no bytes
    # (a probe that did not count them): 36 calls on average, 2 MiB moved, 3.5 ms each; the profiled steps name what
    # ran in comm, as shares of the phase
    short = {**rank, "phases_s": {"forward": 0.125, "backward": 0.25, "comm": 0.125}}
    bare = {k: v for k, v in short.items() if k not in ("model_calls_per_step", "inner_bytes_per_step")}
    ran = {"comm": {"s": 0.5, "what": [["gloo:all_gather", 0.375], ["gloo:reduce_scatter", 0.125]]}}
    named = account(tmp_path / "short", [{**short, "trace": trace(ran)}, bare])["unexplained_comm"]
    assert named.finding == "25% of every step is collectives inside forward and backward that compute does not hide"
    assert named.evidence == (
        "step 500 ms; 125 ms a step waiting on collectives in forward and backward: 36 calls a step of 57 KiB on "
        "average (3.5 ms each); in the profiled steps: gloo:all_gather (75%), gloo:reduce_scatter (25%)"
    )
    assert named.where == "the parallelism's collectives in forward and backward" and named.share == 0.25


def test_an_optimizer_step_of_exactly_a_quarter_of_the_step_is_out_of_proportion(tmp_path):
    assert OPTIMIZER_SHARE == 0.25
    rank = {"phases_s": {"forward": 0.5, "backward": 0.25, "optimizer": 0.25}}
    optimizer = account(tmp_path / "edge", [rank] * 2)["unexplained_optimizer"]
    assert optimizer.finding == "25% of every step goes inside optimizer.step(), and no check explains it"
    assert optimizer.evidence.startswith("step 1,000 ms; 250 ms a step inside optimizer.step(); no trace")
    assert optimizer.explains == {"optimizer": pytest.approx(0.25)} and optimizer.share == pytest.approx(0.25)
    # what another check explains is taken off: 187.5 ms left, 18.75 %
    assert account(tmp_path / "part", [rank] * 2, [explaining(optimizer=0.0625)]) == {}


def test_the_users_python_in_forward_at_exactly_fifteen_percent_of_the_step(tmp_path):
    assert PYTHON_SHARE == 0.15
    # forward 500 ms, traced 500 ms of which 150 ms in model.py's own bytecode (torch's Python and operators
    # are not the user's): 150 ms of a 1,000 ms step
    what = [["aten::mm", 0.3], ["model.py(12): forward", 0.15], ["torch/nn/modules/linear.py(125): forward", 0.05]]
    rank = {"phases_s": {"forward": 0.5, "backward": 0.5}, "trace": trace({"forward": {"s": 0.5, "what": what}})}
    forward = account(tmp_path / "edge", [rank] * 2)["unexplained_forward"]
    assert forward.finding == (
        "15% of every step goes in the user's own Python inside forward, not operators, and no check explains it"
    )
    assert forward.explains == {"forward": pytest.approx(0.15)}
    # with no `call` table the evidence names what ran, each a share of the traced forward
    assert forward.evidence == (
        "step 1,000 ms; 150 ms a step in the user's own Python inside forward, not operators; in the profiled "
        "steps: aten::mm (60%), model.py(12): forward (30%), torch/nn/modules/linear.py(125): forward (10%)"
    )
    less = [["aten::mm", 0.35], ["model.py(12): forward", 0.125]]  # 125 ms: 12.5 %
    rank = {**rank, "trace": trace({"forward": {"s": 0.5, "what": less}})}
    assert account(tmp_path / "under", [rank] * 2) == {}


def test_ddps_own_forward_work_at_exactly_a_tenth_of_the_step(tmp_path):
    assert DDP_FORWARD_SHARE == 0.10
    rank = {"phases_s": {"forward": 0.5, "backward": 0.5}, "ddp_overhead_s": 0.1}
    found = account(tmp_path / "edge", [rank] * 2)["unexplained_ddp_forward"]
    assert found.share == found.saving == pytest.approx(0.1) and found.explains == {"ddp_forward": pytest.approx(0.1)}
    # 125 ms of which find_unused_parameters' finding explains 62.5 ms: 6.25 % left
    rank = {**rank, "ddp_overhead_s": 0.125}
    assert account(tmp_path / "part", [rank] * 2, [explaining(ddp_forward=0.0625)]) == {}


# -- what ran, where it was called from ----------------------------------------------------------------------------


def test_the_evidence_names_what_the_users_code_called_with_its_share_and_where_from(tmp_path):
    # 500 ms of a 1,000 ms step in `other`; the trace's `call` table (what the user's code called) is named over
    # its `what` table (the operators), the probe's own hooks left out, the first three calls and two places
    calls = [
        ["json/__init__.py(183): dumps", 0.25],
        [PROBE_LABEL, 0.125],
        ["torch/serialization.py(600): save", 0.0625],
        ["os.py(700): fsync", 0.03125],
        ["time.py(1): sleep", 0.015625],
    ]
    where = [
        ["log.py(7): write_metrics", 0.25],
        [PROBE_LABEL, 0.125],
        ["ckpt.py(3): save_state", 0.0625],
        ["train.py(40): <module>", 0.03125],
    ]
    other = {"s": 0.5, "call": calls, "what": [["aten::copy_", 0.5]], "where": where, "module": []}
    rank = {"phases_s": {"forward": 0.25, "backward": 0.25, "other": 0.5}, "trace": trace({"other": other})}
    found = account(tmp_path / "r", [rank] * 2)["unexplained_other"]
    assert found.evidence == (
        "step 1,000 ms; 500 ms a step between the phases: the script's own Python; in the profiled steps: "
        "json/__init__.py(183): dumps (50%), torch/serialization.py(600): save (12%), os.py(700): fsync (6%), "
        "called from log.py(7): write_metrics, ckpt.py(3): save_state"
    )
    assert found.where == "log.py(7): write_metrics, ckpt.py(3): save_state"
    assert found.remedy == (
        "code change in train.py: look at log.py(7): write_metrics, ckpt.py(3): save_state "
        "(json/__init__.py(183): dumps); remove it from the step, do it less often, or move it out of the loop"
    )
    assert found.cause == "time the step spends outside the model's own work, in code the doctor has no model for"
    assert found.share == found.saving == pytest.approx(0.5) and found.explains == {"other": pytest.approx(0.5)}
    assert found.predicted_gain == "up to 2.00x faster if that time were free (a bound)" and found.bound


def test_shares_are_of_the_traced_phase_from_the_first_rank_that_traced_it_else_of_what_was_listed(tmp_path):
    # rank 0's trace has no `other` phase: rank 1's 400 ms of `other` is the whole the shares are of
    other = {"s": 0.4, "call": [["json/__init__.py(183): dumps", 0.1], ["pickle.py(9): dump", 0.05]]}
    phases = {"forward": 0.25, "backward": 0.25, "other": 0.5}
    ranks = [
        {"phases_s": phases, "trace": trace({"forward": {"s": 0.25}})},
        {"phases_s": phases, "trace": trace({"other": other})},
    ]
    found = account(tmp_path / "second", ranks)["unexplained_other"]
    assert found.evidence.endswith(
        "in the profiled steps: json/__init__.py(183): dumps (25%), pickle.py(9): dump (12%)"
    )
    assert (
        found.where is None
        and "look at the loop's code between optimizer steps (json/__init__.py(183): dumps);" in found.remedy
    )
    # a phase traced without its total: the shares are of the calls listed (100 + 50 ms)
    untimed = {"call": other["call"]}
    found = account(tmp_path / "untimed", [{"phases_s": phases, "trace": trace({"other": untimed})}] * 2)
    assert found["unexplained_other"].evidence.endswith("dumps (67%), pickle.py(9): dump (33%)")


# -- DDP's own work in forward -------------------------------------------------------------------------------------


def test_ddps_forward_quotes_its_settings_and_the_forward_collectives_ddp_itself_issued(tmp_path):
    collectives = [
        {"name": "broadcast", "phase": "forward", "issuer": "DistributedDataParallel_0", "calls": 2.0, "bytes": 2**20},
        {"name": "broadcast", "phase": "forward", "issuer": "DistributedDataParallel_1", "calls": 1.0, "bytes": 2**19},
        # DDP's all-reduce in backward and a batch norm's in forward are not DDP's forward
        {"name": "allreduce", "phase": "backward", "issuer": "DistributedDataParallel_0", "calls": 4.0, "bytes": 2**22},
        {"name": "allreduce", "phase": "forward", "issuer": "SyncBatchNorm_3", "calls": 8.0, "bytes": 2**10},
    ]
    settings = {"broadcast_buffers": True, "find_unused_parameters": False, "ddp_overhead_s": 0.125}
    phases = {"forward": 0.5, "backward": 0.5}
    first = {"phases_s": phases, **settings, "trace": trace(collectives=collectives)}
    second = {"phases_s": phases, **settings, "trace": trace(collectives=[])}  # the first rank's trace is quoted
    found = account(tmp_path / "r", [first, second])["unexplained_ddp_forward"]
    assert found.finding == "12% of every step is DistributedDataParallel's own work in forward, outside the model"
    assert found.evidence == (
        "step 1,000 ms; DDP's forward took 125 ms a step beyond the wrapped model's (broadcast_buffers=True, "
        "find_unused_parameters=False); in the profiled steps DDP issued 2 broadcast a step (1.00 MiB); "
        "1 broadcast a step (0.50 MiB)"
    )
    assert found.where == "DistributedDataParallel(broadcast_buffers=...)"
    assert found.share == found.saving == pytest.approx(0.125) and found.bound
    assert found.explains == {"ddp_forward": pytest.approx(0.125)}
    assert found.remedy.startswith("code change in train.py: DistributedDataParallel(..., broadcast_buffers=False)")
    assert found.predicted_gain == "up to 1.14x faster if that work were free (a bound)"
    # a trace recorded before collectives were: the settings alone
    older = {"phases_s": phases, **settings, "trace": trace()}
    found = account(tmp_path / "older", [older] * 2)["unexplained_ddp_forward"]
    assert found.evidence.endswith("(broadcast_buffers=True, find_unused_parameters=False)")


# -- the user's Python in forward ----------------------------------------------------------------------------------


def test_the_users_python_is_read_from_the_first_rank_that_traced_forward_scaled_to_its_own_forward(tmp_path):
    # rank 0's profiler failed (no trace); rank 1 traced 250 ms of forward, half in model.py: half of its
    # measured 750 ms forward is 375 ms of a 1,000 ms step
    what = [["model.py(12): forward", 0.125], ["aten::mm", 0.125]]
    ranks = [
        {"phases_s": {"forward": 0.5, "backward": 0.5}},
        {"phases_s": {"forward": 0.75, "backward": 0.25}, "trace": trace({"forward": {"s": 0.25, "what": what}})},
    ]
    found = account(tmp_path / "r", ranks)["unexplained_forward"]
    assert found.share == pytest.approx(0.375) and found.explains == {"forward": pytest.approx(0.375)}
    # a traced forward with no `what` table: nothing is known to be the user's
    bare = {"phases_s": {"forward": 0.75, "backward": 0.25}, "trace": trace({"forward": {"s": 0.25, "where": []}})}
    assert account(tmp_path / "bare", [bare] * 2) == {}


def test_a_record_without_a_phase_or_ddps_overhead_counts_them_as_none(tmp_path):
    # an older probe's record: no `other`, no `optimizer`, no `ddp_overhead_s`
    rank = {"phases_s": {"forward": 0.5, "backward": 0.5}}
    strip = ("phases_s.other", "phases_s.optimizer", "ddp_overhead_s")
    assert account(tmp_path / "older", [rank] * 2, strip=strip) == {}


# -- the model's work against its expected cost, with every other explanation taken off ------------------------------

# forward 60 + backward 100 ms of a 200 ms step; the layers alone take 40 ms (doctor/expected.py)
PRICED = {"layers_alone_s": 0.04, "twins_timed": 10, "twins_seen": 10}
PHASES = {"forward": 0.06, "backward": 0.10, "comm": 0.02, "other": 0.02}


def test_the_models_work_beyond_its_layers_less_what_other_findings_and_ddps_forward_explain(tmp_path):
    alone = account(tmp_path / "alone", [{"phases_s": PHASES, **PRICED}] * 2)["model_work_excess"]
    # 160 - 40 ms, in forward's and backward's shares of their 160: 45 and 75 ms
    assert alone.explains == {"forward": pytest.approx(0.045), "backward": pytest.approx(0.075)}
    # another check explains 10 ms of forward and 20 ms of backward; DDP's own forward took 5 ms (under its
    # line, yet no part of the model's work): 120 - 10 - 20 - 5 = 85 ms, 42.5 %
    rank = {"phases_s": PHASES, **PRICED, "ddp_overhead_s": 0.005}
    found = account(tmp_path / "taken", [rank] * 2, [explaining(forward=0.01, backward=0.02)])["model_work_excess"]
    assert sum(found.explains.values()) == pytest.approx(0.085) and found.share == pytest.approx(0.425)
    # the user's Python in forward, 40 of 60 ms (an unexplained finding of the ledger's own), is taken off too
    what = [["model.py(12): forward", 0.04], ["aten::mm", 0.02]]
    python = {"phases_s": PHASES, **PRICED, "trace": trace({"forward": {"s": 0.06, "what": what}})}
    found = account(tmp_path / "python", [python] * 2)
    assert found["unexplained_forward"].explains == {"forward": pytest.approx(0.04)}
    # 80 ms beyond, in what is left of forward (20 ms) and backward (100 ms): 13.3 and 66.7 ms
    assert found["model_work_excess"].explains == {
        "forward": pytest.approx(0.08 / 6),
        "backward": pytest.approx(0.4 / 6),
    }
