"""GPU paths, round 3 (issue #60): CPU stand-ins for what a GPU cluster would have hit.

No GPU here: the device count, CUDA's events and a process group's backend are faked; the sharded
models and the process groups whose timeouts are checked are real (torch's fake backend stands in for
the ranks of a world, as in test_layouts.py). Each test failed on the code before its fix
(docs/training.md, "On GPUs").
"""

from __future__ import annotations

import json
import os
import pickle
import time
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import synthetic

import paratrain
from paratrain.engine import distributed
from paratrain.engine.distributed import Placement, RankContext

SRC = Path(paratrain.__file__).parent


# -- DTensor's random-number tracker ----------------------------------------------------------------


def test_dtensor_random_is_seeded_on_the_ranks_own_gpu_without_a_broadcast(fake_world, monkeypatch):
    """Rank 2 of 2 nodes x 2 ranks, each node with 4 GPUs: its GPU is cuda:0 (local rank 0), where torch
    would put the tracker on cuda:2 (global rank % GPUs), and build it with a broadcast over the world that
    pipeline stages without dropout never join. Seeded at start-up instead: on cuda:0, no broadcast."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import _random

    fake_world(2, 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(_random, "_rng_tracker", None)

    def broadcast(*args, **kwargs):
        raise AssertionError("the tracker broadcast rank 0's generator state")

    monkeypatch.setattr(dist, "broadcast", broadcast)
    mesh = DeviceMesh("cuda", torch.arange(4).view(2, 2), mesh_dim_names=("pp", "tp"), _init_backend=False)
    assert _random._resolve_device(mesh) == torch.device("cuda", 2), "torch's own choice"
    with torch.random.fork_rng(devices=[]):
        distributed.seed_dtensor_random(mesh, 7, torch.device("cuda", 0))
        assert torch.initial_seed() == 7
    tracker = _random._rng_tracker
    assert isinstance(tracker, _random.OffsetBasedRNGTracker) and tracker._device == torch.device("cuda", 0)


def test_every_mesh_and_group_of_the_engine_is_made_where_it_is_seeded_and_bounded():
    """engine/distributed.py's device_mesh and new_group seed DTensor's generator and pass --timeout; a
    strategy that called torch's directly would skip both."""
    direct = [
        f"{path.relative_to(SRC)}:{n}"
        for path in (SRC / "engine").rglob("*.py")
        if path.name != "distributed.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "init_device_mesh(" in line or "dist.new_group(" in line
    ]
    assert not direct, direct


# -- --timeout reaches every group ---------------------------------------------------------------


def _timeout(group: dist.ProcessGroup | None) -> timedelta:
    return (group or dist.group.WORLD)._get_backend(torch.device("cpu")).options._timeout


def test_every_group_waits_as_long_as_the_run_says(monkeypatch):
    """A group made by new_group and a mesh's groups get the start-up wait (not gloo's 30 minutes), and
    --timeout with the default group when training starts."""
    ctx = RankContext(0, 1, 0, torch.device("cpu"), timeout_s=42)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=600))
    try:
        made = dist.new_group([0])  # what init_device_mesh makes for a dimension short of the world
        assert _timeout(made) == timedelta(minutes=30), "torch's default for a new gloo group"
        mesh = types.SimpleNamespace(device_type="cpu", get_all_groups=lambda: [made])
        monkeypatch.setattr(distributed, "init_device_mesh", lambda device_type, shape, mesh_dim_names: mesh)
        assert distributed.device_mesh(ctx, (1,), ("tp",), seed=0) is mesh
        group = distributed.new_group(ctx, [0])
        assert _timeout(made) == _timeout(group) == timedelta(seconds=600)
        distributed.bound_collectives(ctx.timeout_s)
        assert _timeout(None) == _timeout(made) == _timeout(group) == timedelta(seconds=42)
    finally:
        distributed.shutdown()
    assert not distributed._GROUPS


# -- --cpu-offload ------------------------------------------------------------------------------------


def test_init_weights_of_offloaded_shards_differs_between_shards(fake_world, monkeypatch, tmp_path):
    """ResNet-18 built on meta, sharded over 2 ranks with --cpu-offload, initialised by its init_weights (He et al.'s
    over the whole model): the shards live in host memory, where DTensor's generator does not reach (the mesh
    stands in for a GPU one). Each rank's half of a weight must be its own draw from the same distribution, not
    the other half again."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    from paratrain.config import TrainConfig
    from paratrain.engine.strategies import fsdp
    from paratrain.workloads import models

    monkeypatch.setattr(fsdp, "is_rng_supported_mesh", lambda mesh: True)  # a GPU mesh's answer
    monkeypatch.setattr(fsdp, "CPUOffloadPolicy", lambda: CPUOffloadPolicy(pin_memory=False))  # pinning needs CUDA
    cfg = TrainConfig(workload="cifar10-resnet18", strategy="fsdp", workers=2, cpu_offload=True, run_dir=tmp_path)
    halves = []
    for rank in (0, 1):
        fake_world(rank, 2)
        ctx = RankContext(rank, 2, rank, torch.device("cpu"))
        strategy = fsdp.FullyShardedDataParallel(cfg, ctx, time.perf_counter)
        model = strategy.wrap(strategy.build(lambda: models.build_model("resnet18")))
        weight = model.blocks[0].conv1.weight.to_local()
        assert weight.device.type == "cpu" and weight.shape == (32, 64, 3, 3)
        halves.append(weight.detach().clone())
        dist.destroy_process_group()
    assert not torch.equal(halves[0], halves[1]), "every shard drew the same values"
    for half in halves:  # He et al.'s normal, fan out: std sqrt(2 / (64 x 3 x 3))
        assert half.std().item() == pytest.approx((2 / (64 * 9)) ** 0.5, rel=0.1)


def test_offloaded_gradient_norms_are_summed_on_the_groups_device(monkeypatch):
    """--grad-noise / adaptive under FSDP's CPUOffloadPolicy: the shards' squared norms are host tensors,
    and NCCL takes only GPU ones. The sum goes where the group's collectives go (a stand-in device here)."""
    from paratrain.engine import grad_noise

    handed = []
    monkeypatch.setattr(grad_noise, "group_device", lambda: torch.device("meta"))
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *args, **kwargs: handed.append(tensor.device))
    grad_noise.ShardNorms(replicas=2).complete(torch.ones(3, dtype=torch.float64))
    assert handed == [torch.device("meta")]


def test_a_groups_device_is_the_current_gpu_under_nccl_and_the_host_under_gloo(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    assert distributed.group_device() == torch.device("cuda", 1)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert distributed.group_device() == torch.device("cpu")


# -- mid-epoch checkpoints --------------------------------------------------------------------------


def test_mid_epoch_tallies_travel_as_plain_numbers():
    """The epoch's sums saved with a mid-epoch checkpoint are gathered by an object collective: as GPU
    tensors each would unpickle onto its sender's GPU, on every rank. Plain numbers, and they resume."""
    from paratrain.engine.loop import EpochTally

    tally = EpochTally.zeros(torch.device("cpu"), 0.0, 0.0)
    tally.add(torch.tensor(0.5), torch.tensor(3.0), 4)
    tally.next_interval(1.0)
    tally.add(torch.tensor(0.25), torch.tensor(1.0), 2)
    partial = pickle.loads(pickle.dumps(tally.partial()))
    assert json.loads(json.dumps(partial)) == {"totals": [2.0, 3.0, 4.0], "interval": [0.5, 1.0, 2.0]}
    resumed = EpochTally.zeros(torch.device("cpu"), 0.0, 0.0)
    resumed.resume(partial)
    assert torch.equal(resumed.totals, tally.totals) and torch.equal(resumed.interval, tally.interval)
    # a checkpoint written before, with the sums as tensors, resumes too
    resumed.resume({"totals": tally.totals.clone(), "interval": tally.interval.clone()})
    assert torch.equal(resumed.totals, tally.totals)


# -- the host group across nodes ------------------------------------------------------------------


def test_an_nccl_rank_across_hosts_gives_its_gloo_groups_the_interface_towards_rank_0(monkeypatch):
    """--nodes 2 on GPUs: the default group is NCCL, and the pipeline's checkpoint gather runs on a gloo
    group, which binds to the host name's address unless GLOO_SOCKET_IFNAME names an interface."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    joined = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: joined.append(backend))
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "unset")  # recorded, so that the test's own setting is undone after
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    threads = torch.get_num_threads()
    placement = Placement(backend="nccl", device_type="cuda", threads_per_worker=threads, spans_hosts=True)
    distributed.init_rank(placement)
    assert joined == ["nccl"]
    assert os.environ["GLOO_SOCKET_IFNAME"] == distributed.interface_of("127.0.0.1") == "lo"


# -- CUDA timing events -------------------------------------------------------------------------------


class FakeEvent:
    """A CUDA event stand-in: a perf_counter reading; `alive` counts those not yet let go."""

    alive = 0

    def __init__(self) -> None:
        FakeEvent.alive += 1
        self.at = time.perf_counter()

    def __del__(self) -> None:
        FakeEvent.alive -= 1

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0


def test_cuda_events_are_let_go_at_each_log_point(tmp_path, monkeypatch):
    """16 steps logged every 2: the events the loop stamps are resolved at each log point, not kept until
    the epoch's end (5 spans a step), and the breakdown still adds up to the step."""
    from paratrain.engine import loop, timing

    def cuda_clock(self, device):
        self.cuda = True

    monkeypatch.setattr(timing.Clock, "__init__", cuda_clock)
    monkeypatch.setattr(timing.Clock, "stamp", lambda self: FakeEvent())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    held = []
    log_point = loop.Trainer._log_point

    def counted(self, *args):
        log_point(self, *args)
        held.append(FakeEvent.alive)

    monkeypatch.setattr(loop.Trainer, "_log_point", counted)
    cfg = synthetic(tmp_path, workers=1, synthetic_samples=256, batch_size=16, epochs=1, log_every=2)
    summary = paratrain.train(cfg)
    assert len(held) == 8 and max(held) == held[0] <= 6, held
    assert summary["breakdown"]["compute_s"] > 0


def test_the_pipelines_busy_spans_are_seconds_once_resolved(monkeypatch):
    from paratrain.engine.strategies.pipeline import BusyClock

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    before = FakeEvent.alive
    clock = BusyClock(FakeEvent)
    for _ in range(3):
        start = clock.stamp()
        clock.timed(lambda: None)
        clock.step_done(start, clock.stamp(), keep=True)
    del start
    assert FakeEvent.alive == before + 3 * 4
    clock.resolve()
    assert FakeEvent.alive == before and len(clock.busy_and_step_seconds()) == 3
    assert all(0 <= busy <= step for busy, step in clock.busy_and_step_seconds())


# -- device tables ----------------------------------------------------------------------------------


def test_hopper_variants_take_their_own_peaks():
    """H100 NVL is not H100 SXM; H200 and GH200 had no row (no MFU at all); A100 40GB is A100's compute."""
    from paratrain.engine.flops import gpu_peak

    peaks = {
        "NVIDIA H100 NVL": 835.5,
        "NVIDIA H100 80GB HBM3": 989.4,
        "NVIDIA H200": 989.4,
        "NVIDIA H200 NVL": 835.5,
        "NVIDIA GH200 480GB": 989.4,
        "NVIDIA A100-SXM4-40GB": 312.0,
    }
    assert {name: gpu_peak(name, "bf16")[0] / 1e12 for name in peaks} == pytest.approx(peaks)


def test_plan_has_rows_for_h200(capsys):
    from paratrain.cli import main
    from paratrain.plan.devices import GPUS

    assert main(["plan", "--workload", "gpt-tiny", "--device", "h200", "--gpus", "8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["rows"] and all(row["fits"] for row in plan["rows"])
    h200 = GPUS["h200"]
    assert h200.memory_bytes == 141e9 and h200.memory_bandwidth == 4.8e12
    assert h200.peak_flops == GPUS["h100"].peak_flops and GPUS["gh200"].peak_flops == GPUS["h100"].peak_flops
    assert GPUS["a100-40gb"].memory_bytes == 40e9 and GPUS["a100-40gb"].peak_flops == GPUS["a100"].peak_flops


def test_the_probes_layer_copies_on_a_gpu_take_at_most_a_quarter_of_its_free_memory():
    """At its calibration step the probe copies the model's leaf layers to time them alone. On a GPU those copies
    sit beside the script's tensors: they may take up to a quarter of the device memory free at that moment (and
    never more than 256 MiB), so a model near the device's limit is timed in part rather than run out of memory.
    Stand-in: torch itself, with a CUDA whose driver reports 2 MiB free; three 256 KiB layers whose inputs were on
    cuda:0 (recorded as specs: no CUDA tensor is made)."""
    from paratrain.launch.probe import twins

    class WithSmallGpu:
        cuda = types.SimpleNamespace(mem_get_info=lambda device: (2 * 2**20, 80 * 2**30), synchronize=lambda: None)

        def __getattr__(self, name):
            return getattr(torch, name)

    layers = [torch.nn.Linear(256, 255) for _ in range(3)]  # 256 x 255 + 255 floats: 256 KiB each
    on_gpu = ("tensor", (8, 256), torch.float32, torch.device("cuda", 0), True)
    on_cpu = ("tensor", (8, 256), torch.float32, torch.device("cpu"), True)
    assert twins.copy_budget(WithSmallGpu(), [(layer, (on_gpu,)) for layer in layers]) == 2**19
    gpu = twins.LayerTwins(WithSmallGpu(), [(layer, (on_gpu,)) for layer in layers], 8)
    assert len(gpu.twins) == 2 and gpu.layers == 3 and gpu.cuda
    cpu = twins.LayerTwins(WithSmallGpu(), [(layer, (on_cpu,)) for layer in layers], 8)
    assert len(cpu.twins) == 3 and not cpu.cuda
