"""The probe's hooks in one process (launch/probe.py): what it counts per step once the global module
hooks have given way to hooks on the outermost modules, which is what keeps its cost per step low."""
import json

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from paratrain.launch import probe as probe_module


@pytest.fixture
def probe(tmp_path):
    installed = probe_module.Probe(str(tmp_path / "rank0.jsonl"), 0)
    installed.install(torch)
    yield installed
    for undo in reversed(installed.restore):
        undo()


def steps(probe):
    probe.flush()
    with open(probe.path) as records:
        return [r for r in map(json.loads, records) if r["kind"] == "step"]


def train(model, optimizer, batches, loss=None):
    for _ in range(batches):
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        out = model(x)
        (loss(out, y) if loss else nn.functional.cross_entropy(out, y)).backward()
        optimizer.step()
        optimizer.zero_grad()


def test_after_the_first_steps_only_the_outermost_modules_keep_hooks(probe):
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, probe_module.NARROW_AFTER_STEP)
    assert not probe.global_hooks
    assert all(h is not probe.hook_pair[0] for h in module_hooks._global_forward_pre_hooks.values())
    assert set(probe.tops) == {model}
    assert model._forward_pre_hooks and not model[0]._forward_pre_hooks
    train(model, optimizer, 3)
    later = steps(probe)[probe_module.NARROW_AFTER_STEP:]
    assert len(later) == 3
    assert all(s["forward"] > 0 and s["micro"] == 1 and s["samples"] == 8 for s in later), later


def test_a_loss_module_is_forward_time_but_not_a_micro_step(probe):
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, 5, loss=nn.CrossEntropyLoss())
    assert all(s["micro"] == 1 and s["samples"] == 8 for s in steps(probe))


def test_a_model_switched_to_eval_after_the_first_steps_is_evaluation(probe):
    model, held_out_model = nn.Linear(4, 3), nn.Linear(4, 3)     # say, an EMA copy used only to evaluate
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, probe_module.NARROW_AFTER_STEP + 1)
    held_out_model.eval()
    with torch.no_grad():
        for _ in range(20):
            held_out_model(torch.randn(64, 4))
    train(model, optimizer, 1)
    last = steps(probe)[-1]
    assert last["eval"] > 0, last
    assert held_out_model in set(probe.tops)


def test_device_times_come_from_events_read_once_the_device_has_passed_them(tmp_path, monkeypatch):
    # The host clock stands in for CUDA events (PARATRAIN_PROBE_DEVICE_EVENTS=cpu) and the CPU for the
    # device whose host reads are syncs (PARATRAIN_PROBE_SYNC_DEVICE=cpu): on a GPU rank the same code
    # records torch.cuda.Event(enable_timing=True) at the outermost phase boundaries.
    from paratrain.launch import probe_summary
    monkeypatch.setenv(probe_module.DEVICE_EVENTS_ENV, "cpu")
    monkeypatch.setenv(probe_module.SYNC_DEVICE_ENV, "cpu")
    probe = probe_module.Probe(str(tmp_path / "rank0.jsonl"), 0)
    probe.install(torch)
    try:
        model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            loss = nn.functional.cross_entropy(model(torch.randn(32, 4)), torch.randint(0, 3, (32,)))
            loss.backward()
            loss.item()                 # a host read: a sync on the device
            optimizer.step()
            optimizer.zero_grad()
        probe.flush()
    finally:
        for undo in reversed(probe.restore):
            undo()
    records = [json.loads(line) for line in open(probe.path)]
    device = [r for r in records if r["kind"] == "device"]
    assert [r["step"] for r in device] == [2, 3, 4, 5, 6]      # from the second step on
    for r in device:
        phases = sum(r[p] for p in probe_module.DEVICE_PHASES)
        assert r["forward"] > 0 and r["backward"] > 0 and r["optimizer"] > 0 and phases <= r["span_s"], r
    assert all(s["syncs"] == 1 and s["sync_wait"] > 0 for s in steps_of(records))      # the reads timed
    summary = probe_summary.rank_record(0, records)
    assert summary["device_steps"] >= 3 and summary["device_step_s"] > 0
    assert set(summary["device_phases_s"]) == set(probe_module.DEVICE_PHASES)


def test_no_device_times_on_a_cpu_rank(probe):
    model = nn.Linear(4, 3)
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), 4)
    probe.flush()
    assert probe.timeline is None
    assert not [line for line in open(probe.path) if '"device"' in line]


def steps_of(records):
    return [r for r in records if r["kind"] == "step"]
