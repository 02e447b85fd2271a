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
