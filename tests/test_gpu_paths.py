"""GPU logic that cannot run here, tested with CPU stand-ins (no GPU on this machine or in CI).

- `HostTensorAudit` stands in for a CUDA device: it marks every tensor made on the host without
  naming a device (what would be a CPU tensor on a GPU run), follows the mark through operations
  whose inputs are all host tensors, and records host tensors copied to a device (blocking copies on
  a GPU) and host tensors handed to a collective (NCCL refuses them).
- A faked device count and environment for placement and sweep trials.
- A checkpoint that says it came from GPU ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import traceback
import weakref
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import synthetic
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import paratrain
from paratrain.config import TrainConfig
from paratrain.engine import memory
from paratrain.engine.distributed import RankContext
from paratrain.errors import UsageError
from paratrain.launch.placement import plan_placement
from paratrain.sweep.trial import visible_devices

_FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.linspace,
    torch.eye,
}


def _names_device(args: tuple, kwargs: dict) -> bool:
    return kwargs.get("device") is not None or any(isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])


def _where() -> str:
    frames = [f for f in traceback.extract_stack() if "/paratrain/" in f.filename]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


class _TensorSet:
    """Tensors by identity (a WeakSet would compare tensors with ==, elementwise)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, t: torch.Tensor) -> None:
        self._refs[id(t)] = weakref.ref(t)

    def discard(self, t: torch.Tensor) -> None:
        self._refs.pop(id(t), None)

    def __contains__(self, t: object) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t


class HostTensorAudit(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.host = _TensorSet()
        self.created: Counter[str] = Counter()  # host tensors made in paratrain code, by place
        self.moved: Counter[str] = Counter()  # host tensors copied to "the device", by place

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _FACTORIES:
            if kwargs.get("device") is None and isinstance(out, torch.Tensor):
                self.host.add(out)
                self.created[_where()] += 1
            return out
        if func in (torch.Tensor.to, torch.Tensor.cuda) and (func is torch.Tensor.cuda or _names_device(args, kwargs)):
            if args[0] in self.host:
                self.moved[_where()] += 1
                if out is args[0]:
                    # A no-op on CPU; on a GPU the copy is a new tensor and the host one stays.
                    out = out.clone()
                self.host.discard(out)
            return out
        if getattr(func, "__name__", "") == "__set__" and len(args) == 2 and isinstance(args[1], torch.Tensor):
            # `param.data = moved` (Module.to): the parameter now holds device memory.
            if args[1] not in self.host:
                self.host.discard(args[0])
            return out
        if func is torch.Tensor.copy_ and args[1] in self.host and args[0] not in self.host:
            self.moved[_where()] += 1
            return out
        if func is torch.Tensor.cpu:
            self.host.add(out)
            return out
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if inputs and all(t in self.host for t in inputs):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.host.add(t)
        return out


def _audited_run(tmp_path: Path, name: str, samples: int, monkeypatch) -> tuple[HostTensorAudit, list[str]]:
    audit = HostTensorAudit()
    to_collectives: list[str] = []
    plain_sum = RankContext.sum

    def checked_sum(self, tensor):
        if tensor in audit.host:
            to_collectives.append(_where())
        return plain_sum(self, tensor)

    monkeypatch.setattr(RankContext, "sum", checked_sum)
    cfg = synthetic(
        tmp_path,
        workers=1,
        synthetic_samples=samples,
        augment="flip,crop,jitter",
        optimizer="lamb",
        lr=0.001,
        run_dir=tmp_path / name,
    )
    with audit:
        paratrain.train(cfg)
    monkeypatch.setattr(RankContext, "sum", plain_sum)
    return audit, to_collectives


def test_no_host_tensor_reaches_a_collective_or_is_copied_to_the_device_per_step(tmp_path, monkeypatch):
    """4 and then 16 steps per epoch: whatever is made on the host and copied over must not grow
    with the steps (per epoch is fine: the shuffle), and nothing handed to a collective may be a
    host tensor (fix 1: the breakdown's all-reduce; fix 3: augmentation and LAMB's step counter)."""
    few, few_sums = _audited_run(tmp_path, "few", 128, monkeypatch)
    many, many_sums = _audited_run(tmp_path, "many", 512, monkeypatch)
    assert not few_sums and not many_sums, f"host tensors handed to a collective at {few_sums + many_sums}"
    grew = {
        place: (few.moved[place], many.moved[place])
        for place in few.moved | many.moved
        if many.moved[place] != few.moved[place]
    }
    assert not grew, f"host-to-device copies that grow with the steps (4 vs 16 steps/epoch): {grew}"
    grew = {
        place: (few.created[place], many.created[place])
        for place in few.created | many.created
        if many.created[place] != few.created[place]
    }
    assert not grew, f"host tensors made at every step: {grew}"


def test_the_audit_sees_a_host_tensor_copied_at_every_step():
    """The stand-in itself: the pattern the old augmentation had is caught."""
    generator = torch.Generator().manual_seed(0)
    with HostTensorAudit() as audit:
        for _ in range(3):
            torch.rand(4, generator=generator).to(torch.device("cpu"))
    assert sum(audit.moved.values()) == 3


def test_peak_memory_is_the_runs_own_not_the_process_high_water_mark(tmp_path):
    """One worker runs in this process; a 1.5 GB tensor touched and freed before it must not count."""
    big = torch.ones(1536 * 2**20 // 4)
    del big
    resident = int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
    summary = paratrain.train(synthetic(tmp_path, workers=1))
    peak = summary["peak_memory_bytes"][0]
    assert resident * 0.5 < peak < resident + 512 * 2**20, (peak, resident)


def test_gpu_peak_memory_is_reset_at_the_start_and_the_cache_released_at_the_end(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append(("reset", d)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: calls.append(("peak", d)) or 123)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty",)))
    gpu = torch.device("cuda", 1)
    memory.reset_peak_memory(gpu)
    assert memory.peak_memory_bytes(gpu) == 123
    memory.release_cached_memory(gpu)
    assert calls == [("reset", gpu), ("peak", gpu), ("empty",)]


@pytest.mark.parametrize(
    "inherited, gpus, expected",
    [
        (None, (2, 3), "2,3"),
        ("", (0,), "0"),
        ("4,5,6,7", (2, 3), "6,7"),
        ("4, 5 ,6,7", (1,), "5"),
        ("GPU-8f2a,GPU-77c1,MIG-1a2b/1/0", (2, 0), "MIG-1a2b/1/0,GPU-8f2a"),
    ],
)
def test_trial_gpus_are_taken_from_the_inherited_list_by_position(inherited, gpus, expected):
    assert visible_devices(gpus, inherited) == expected


def test_sweep_trials_run_on_the_inherited_devices(tmp_path, monkeypatch):
    """A script sweep on a 'GPU' machine (the count faked): each trial sees one inherited entry."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nopen(os.path.join(os.environ['PARATRAIN_TRIAL_DIR'], 'devices.txt'), 'w')"
        ".write(os.environ.get('CUDA_VISIBLE_DEVICES', ''))\nprint('score=1')\n"
    )
    space = tmp_path / "space.json"
    space.write_text(
        json.dumps(
            {
                "algorithm": "grid",
                "parameters": {"x": {"type": "discrete", "values": [1, 2]}},
                "spec": {"metric": "score", "objective": "minimize"},
            }
        )
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    monkeypatch.setattr("paratrain.sweep.driver.gpu_count", lambda: 2)
    from paratrain.cli import main

    assert (
        main(["sweep", str(space), "-j", "2", "--out", str(tmp_path / "out"), "--script", str(script), "--quiet"]) == 0
    )
    seen = sorted(p.read_text() for p in (tmp_path / "out").rglob("devices.txt"))
    assert seen in (["GPU-aaaa", "GPU-bbbb"], ["GPU-aaaa", "GPU-aaaa"], ["GPU-bbbb", "GPU-bbbb"]), seen
    assert all(s in ("GPU-aaaa", "GPU-bbbb") for s in seen)


@pytest.fixture
def two_fake_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)


def test_device_cpu_runs_cpu_ranks_on_a_gpu_host(two_fake_gpus):
    cpu = plan_placement(TrainConfig(workers=2, device="cpu", threads_per_worker=1))
    assert (cpu.device_type, cpu.backend) == ("cpu", "gloo") and cpu.cpu_sets is not None
    gpu = plan_placement(TrainConfig(workers=2, device="auto"))
    assert (gpu.device_type, gpu.backend) == ("cuda", "nccl")
    with pytest.raises(UsageError, match="needs 3 GPUs"):
        plan_placement(TrainConfig(workers=3, device="cuda"))


def test_a_checkpoint_from_gpu_ranks_is_not_resumed_on_cpu(tmp_path):
    run = tmp_path / "run"
    paratrain.train(synthetic(tmp_path, workers=1, checkpoint_every=1, run_dir=run))
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["device"] == "cpu"
    # What GPU ranks write: the device kind and a CUDA generator state per rank.
    ckpt["device"] = "cuda"
    ckpt["rng"][0]["cuda"] = torch.zeros(16, dtype=torch.uint8)
    torch.save(ckpt, run / "checkpoint.pt")
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paratrain",
            "train",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "512",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--lr",
            "0.01",
            "--threads-per-worker",
            "1",
            "--log-every",
            "4",
            "--device",
            "cpu",
            "--checkpoint-every",
            "1",
            "--run-dir",
            str(run),
            "--resume",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cuda" in lines[0] and "--device" in lines[0], proc.stderr
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before, "the run directory was touched"
