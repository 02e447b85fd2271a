"""The probe on the scripts people write today (issue #56): torch.compile with fullgraph=True, activation
checkpointing, a model on another GPU than the current one, CUDA left alone at `import torch`, no activation
of a step kept alive by the calibration; and the facts it records (collections, loaders, dtypes, trace)."""

import gc
import json
import os

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from paratrain.launch.probe import RAW_TRACE_FILE, hooks
from paratrain.launch.probe.clock import Probe
from paratrain.launch.probe.device import HostEvent, device_timeline, tensor_device
from paratrain.launch.trace_summary import summarise_file


def records(probe, kind="step"):
    probe.flush()
    with open(probe.path) as lines:
        return [r for r in map(json.loads, lines) if r["kind"] == kind]


def state(probe):
    out = {}
    for r in records(probe, "state"):
        out.update(r)
    return out


class Blocks(nn.Module):
    def __init__(self, reentrant=None):
        super().__init__()
        self.stem = nn.Linear(16, 16)  # so that the blocks' inputs ask for gradients (reentrant checkpointing needs it)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(16, 3)
        self.reentrant = reentrant

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            # called as torch.utils.checkpoint.checkpoint: the probe wraps it when torch is imported, and a
            # script imports it after torch (a name bound before the probe was installed keeps the original)
            x = (
                block(x)
                if self.reentrant is None
                else torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
            )
        return self.head(x)


def train(model, steps, batch=8, loss=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        out = model(torch.randn(batch, 16))
        nn.functional.cross_entropy(out, torch.randint(0, 3, (batch,))).backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointings_recompute_is_no_micro_step_and_is_timed_as_recompute(probe, reentrant):
    model = Blocks(reentrant)
    train(model, 8)
    steps = records(probe)
    assert all(s["micro"] == 1 and s["samples"] == 8 for s in steps), steps
    assert all(s["recomputes"] == 4 and s["recompute"] > 0 for s in steps[1:])
    assert set(probe.tops) == {model}  # no block became an outermost module
    assert state(probe)["activation_checkpointing"] is True


def test_compiled_with_fullgraph_runs_under_the_probe_and_counts_its_samples(probe):
    model = torch.compile(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3)), fullgraph=True, backend="aot_eager"
    )
    train(model, 6, batch=12)  # the calibration (step 3) and the narrowing run inside it
    steps = records(probe)
    assert len(steps) == 6 and all(s["micro"] == 1 and s["samples"] == 12 for s in steps)
    assert not records(probe, "fallback")
    assert state(probe)["compiled"] is True and sum(s["compiles"] for s in steps) >= 1


def test_no_cuda_question_at_install(tmp_path, monkeypatch):
    """torch.cuda.is_available() initialises CUDA's driver: asked at `import torch`, it breaks a later fork and
    ignores a CUDA_VISIBLE_DEVICES the script sets after importing torch. The probe never asks it."""
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: asked.append(2) or False)
    installed = Probe(str(tmp_path / "rank0.jsonl"), 0)
    try:
        hooks.install(installed, torch)
        assert asked == []
        torch.ones(3).sum().item()  # a host read of a CPU tensor: no sync, and no question either
        assert asked == [] and installed.syncs == 0
    finally:
        for undo in reversed(installed.restore):
            undo()


class Cuda:
    """Stand-ins for torch.cuda and a tensor on cuda:1, to test which stream the timeline records on."""

    def __init__(self):
        self.streams = []
        self.Event = lambda enable_timing: HostEvent()

    def current_stream(self, device):
        self.streams.append(device)
        return f"stream of {device}"


def test_the_device_timeline_records_on_the_device_the_model_is_on():
    class Device:
        type, index = "cuda", 1

    class Param:
        device = Device()

    class Model:
        def parameters(self):
            return iter([Param()])

    class FakeTorch:
        Tensor = torch.Tensor
        cuda = Cuda()

    device = tensor_device(FakeTorch, Model(), ())
    assert device.index == 1  # the parameters', not the current device (0)
    timeline = device_timeline(FakeTorch, device, stand_in=False)
    timeline.enter("forward")
    timeline.leave("forward")
    assert FakeTorch.cuda.streams == [device, device, device]
    assert tensor_device(torch, nn.Linear(2, 2), (torch.ones(2),)) is None  # a CPU model: no timeline
    assert device_timeline(torch, None, stand_in=False) is None


def test_the_calibration_keeps_no_activation_of_the_step(probe):
    """The small-batch calibration notes each leaf layer's inputs as shapes and dtypes, not tensors: an
    activation that autograd does not save dies with the forward (before, a detached reference to every
    layer's input lived on through backward: out of memory for a large model)."""
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 3))  # ReLU saves its output, not input
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    model[1].register_forward_hook(lambda m, args, out: seen.append(StorageWeakRef(args[0].untyped_storage())))
    for step in range(3):  # batch 4: calibrated at step 3, whose forward records the leaf calls
        loss = nn.functional.cross_entropy(model(torch.randn(4, 16)), torch.randint(0, 3, (4,)))
        if step == 2:
            gc.collect()
            assert probe.layers and seen[-1].expired()  # the calls were noted, their inputs' memory freed
        loss.backward()
        optimizer.step()
    assert state(probe).get("batch_slope_s") is not None  # the twins were timed, from the shapes


def test_collections_are_timed_and_charged_to_the_line_that_called_them(probe):
    model = nn.Linear(16, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    garbage = [[i] for i in range(200_000)]  # a heap worth walking
    for _ in range(4):
        nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 3, (8,))).backward()
        optimizer.step()
        gc.collect()
    steps = records(probe)
    assert all(s["gc_n"] >= 1 and s["gc_s"] > 0 for s in steps[1:])
    assert any(
        "test_probe_robust.py" in where and "gc.collect()" in where for s in steps[1:] for where in s["gc_sites"]
    )
    del garbage


def test_a_loader_is_described_and_its_samples_counted(probe):
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 3, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model = nn.Linear(16, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    (described,) = state(probe)["loaders"]
    assert described["length"] == 64 and described["batches_per_epoch"] == 8 and described["sampler"] == "RandomSampler"
    assert described["epochs"] == 2 and described["samples"] == 128 and described["epoch_samples"] == 64
    assert described["world"] == 1 and described["first_batch_sum"] is not None


def test_the_dtypes_of_the_model_and_its_inputs(probe):
    model = nn.Sequential(nn.Linear(16, 3)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        nn.functional.cross_entropy(
            model(torch.randn(4, 16, dtype=torch.float64)), torch.randint(0, 3, (4,))
        ).backward()
        optimizer.step()
    seen = state(probe)
    assert seen["param_dtypes"] == {"float64": 51} and seen["input_dtypes"] == ["float64"] and seen["autocast"] is None
    assert seen["float64_penalty"] > 0  # the twins timed at float32 too (the calibration of a float64 model)


def test_a_few_steps_are_profiled_kept_apart_and_their_trace_read(probe, tmp_path):
    model = Blocks()
    train(model, 12)
    steps = records(probe)
    profiled = [s["step"] for s in steps if s.get("profiled")]
    assert profiled == [6, 7, 8]
    trace = summarise_file(tmp_path / RAW_TRACE_FILE.format(rank=0))  # the launcher compresses it later
    assert trace["steps"] == 3
    assert {"forward", "backward", "optimizer"} <= set(trace["phases"])
    assert any(name.startswith("aten::") for name, _ in trace["phases"]["forward"]["what"])
    assert trace["dtypes_s"]["float"] > 0


def test_the_hooks_go_in_when_a_library_asked_for_torchs_spec_before_importing_it(tmp_path):
    """Hugging Face datasets and transformers ask importlib.util.find_spec("torch") at their import, before any
    import of torch: the probe's import hook must wait for the import itself (it once left at the question, and
    a script importing datasets first ran unprobed: no step recorded)."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import importlib.util\n"
        "assert importlib.util.find_spec('torch') is not None\n"
        "import torch\n"
        "model = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(4):\n"
        "    model(torch.randn(8, 4)).sum().backward()\n"
        "    optimizer.step()\n"
    )
    env = {**os.environ, "PARATRAIN_RUN_DIR": str(tmp_path / "run"), "PARATRAIN_PROBE_TRACE": "0"}
    subprocess.run([sys.executable, "-m", "paratrain.launch.probe", str(script)], check=True, env=env, timeout=120)
    with open(tmp_path / "run" / "probe" / "rank0.jsonl") as records:
        steps = [r for r in map(json.loads, records) if r["kind"] == "step"]
    assert len(steps) == 4
