"""The probe under the other wrappers issue #26 names: FSDP2 (`fully_shard`) and a bare model, the planted-fault
script's healthy loop otherwise unchanged (DDP and Lightning: test_doctor_probe.py, test_lightning.py)."""

import json

import pytest
from test_doctor_probe import launch

from paratrain.doctor import diagnose


def test_fsdp2_steps_are_timed_and_its_collectives_are_communication(tmp_path):
    run = launch(tmp_path, "fsdp")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["probe"]["status"] == "on", summary["probe"]
    ranks = summary["probe"]["ranks"]
    assert [r["steps"] for r in ranks] == [48, 48] and not ranks[0].get("ddp")
    for r in ranks:
        p = r["phases_s"]
        # every second charged to one phase; FSDP2's all-gathers and reduce-scatters (Work.wait inside
        # forward and backward, from Python) are communication, not the model's compute
        assert sum(p.values()) == pytest.approx(r["step_s"], rel=1e-3)
        assert p["forward"] > 0 and p["backward"] > 0 and p["optimizer"] > 0 and p["comm"] > 0, p
    # Each conv and the head its own FSDP unit, on a model this small: the only cause the doctor may rank high is
    # those units' collectives, named as FSDP's own (unexplained_comm, with their count), never another phase's.
    high = [f for f in diagnose(run)["findings"] if f["severity"] == "high"]
    assert {f["check"] for f in high} <= {"unexplained_comm"}, high
    calls = sum(r["inner_calls_per_step"] for r in ranks) / len(ranks)
    assert all(f"{calls:.0f} calls a step" in f["evidence"] for f in high), (high, calls)


def test_a_bare_model_on_one_rank_is_timed_without_communication(tmp_path):
    run = launch(tmp_path, "bare", ranks=1)
    summary = json.loads((run / "summary.json").read_text())
    (rank,) = summary["probe"]["ranks"]
    assert rank["steps"] == 48 and rank["samples_per_step"] == 32 and not rank.get("ddp")
    p = rank["phases_s"]
    assert sum(p.values()) == pytest.approx(rank["step_s"], rel=1e-3)
    assert p["forward"] > 0 and p["backward"] > 0 and p["comm"] == 0 and p["collective"] < 0.01 * rank["step_s"], p
    assert not [f for f in diagnose(run)["findings"] if f["severity"] == "high"]
