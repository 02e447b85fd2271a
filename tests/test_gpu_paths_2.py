"""GPU paths, round 2 (issue #31): CPU stand-ins for what the first GPU cluster would have hit.

No GPU here: NVML, the device count, the accelerator torch was built for and the CUDA flags are
faked; the process groups are real (gloo, two spawned ranks) and the memory limit is real
(RLIMIT_DATA). Each test failed on the code before the fix (docs/training.md, "On GPUs").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import free_port, start_ranks, synthetic, train_spawned

import paratrain
from paratrain.errors import RunFailed, UsageError
from paratrain.measure.monitor import SYSTEM_FILE, Monitor


class FakeNVML(types.SimpleNamespace):
    """A CPU stand-in for `pynvml`: four GPUs whose NVML index order is not their PCI order."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM = 1
    BUS = ("00000000:81:00.0", "00000000:01:00.0", "00000000:C1:00.0", "00000000:41:00.0")  # NVML index -> PCI bus id

    def __init__(self):
        super().__init__(calls=[])

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.BUS)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.BUS):
            raise self.NVMLError("Invalid Argument")
        return f"nvml{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if not uuid.startswith("MIG-"):
            raise self.NVMLError("Not Found")
        return uuid

    def nvmlDeviceGetPciInfo(self, handle):
        return types.SimpleNamespace(busId=self.BUS[int(handle[4:])].encode())  # bytes, as older releases give

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{int(handle[4:]) * 1111:04d}-{handle}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=10 + (int(handle[4:]) if handle.startswith("nvml") else 90), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=2**30, total=16 * 2**30, free=15 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100_000

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1410


def _gpu_samples(path: Path) -> dict[int, int]:
    """CUDA device number -> the NVML index its samples came from (utilisation = 10 + index; 100: a MIG device)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["index"]: r["utilization_percent"] - 10 for r in records if r["kind"] == "gpu"}


def _sample_once(tmp_path: Path, cuda_ranks: int, environ: dict[str, str]) -> dict[int, int]:
    nvml = FakeNVML()
    monitor = Monitor(tmp_path / SYSTEM_FILE, 1.0, lambda proc: None, cuda_ranks=cuda_ranks, nvml=nvml, environ=environ)
    monitor.start()
    records = monitor.sample()
    monitor.stop()
    assert nvml.calls == ["init", "shutdown"]
    return {r["index"]: r["utilization_percent"] - 10 for r in records if r["kind"] == "gpu"}


@pytest.mark.parametrize(
    "visible, expected",
    [
        # PCI order of the NVML indices: 1 (01:00), 3 (41:00), 0 (81:00), 2 (C1:00).
        (None, {0: 1, 1: 3, 2: 0, 3: 2}),
        ("1,3", {0: 3, 1: 2}),
        ("3,0", {0: 2, 1: 1}),
        ("GPU-3333,GPU-0000", {0: 3, 1: 0}),  # UUID prefixes, CUDA's own matching
        ("2,7,1", {0: 0}),  # the list ends at the first index that names no device
        ("MIG-1a2b/1/0", {0: 90}),
        ("1,1", {}),  # a device named twice: CUDA sees none
    ],
)
def test_monitor_maps_cuda_devices_through_visible_devices_in_pci_order(tmp_path, visible, expected):
    environ = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})}
    assert _sample_once(tmp_path, 4, environ) == expected


def test_more_ranks_than_visible_gpus_sample_each_gpu_once(tmp_path):
    """8 local ranks on the 2 GPUs they see (rank r on r % 2): two devices sampled, no IndexError."""
    assert _sample_once(tmp_path, 8, {"CUDA_VISIBLE_DEVICES": "0,2"}) == {0: 1, 1: 0}


@pytest.fixture
def fake_gpu_host(monkeypatch):
    """torch sees two GPUs and pynvml is the fake above (the monitor imports it by name)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


def test_node_0_of_a_two_node_gpu_run_monitors_its_own_four_ranks(tmp_path, monkeypatch, fake_gpu_host):
    """--nodes 2 --workers 8 on a node whose ranks see CUDA_VISIBLE_DEVICES=0,1: the monitor opens
    node 0's devices only (not 8), in PCI order, and the ranks are started with PCI_BUS_ID order."""
    import paratrain.launch.builtin as launch
    from paratrain.config import TrainConfig
    from paratrain.engine.distributed import Placement
    from paratrain.launch.local import RanksFailed
    from paratrain.runs import RunDir
    from paratrain.workloads import load_data

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    seen = {}

    def ranks(cfg, placement, run_dir, tasks):
        seen["order"] = os.environ.get("CUDA_DEVICE_ORDER")
        time.sleep(0.3)  # the monitor samples meanwhile
        raise RanksFailed("rank 5 failed: stand-in")

    monkeypatch.setattr(launch, "run_ranks", ranks)
    cfg = TrainConfig(**synthetic(tmp_path, workers=8, nodes=2, node_rank=0, rdzv="127.0.0.1:29400", monitor_hz=20.0))
    placement = Placement(backend="nccl", device_type="cuda", threads_per_worker=1)
    run = RunDir(tmp_path / "run")
    with pytest.raises(RanksFailed):
        launch._launch(cfg, run, placement, load_data(cfg), 0.0, time.perf_counter())
    assert _gpu_samples(run.path / SYSTEM_FILE) == {0: 1, 1: 3}
    assert seen["order"] == "PCI_BUS_ID" and "CUDA_DEVICE_ORDER" not in os.environ


def test_launch_env_visible_devices_reach_the_monitor(tmp_path, monkeypatch, fake_gpu_host):
    """`launch --env CUDA_VISIBLE_DEVICES=3` on GPU ranks: the ranks' devices, not this process's,
    are sampled, and the ranks run with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    from paratrain.config import LaunchConfig
    from paratrain.launch import script as launch_script
    from paratrain.runs import RunDir

    script = tmp_path / "rank.py"
    script.write_text(
        "import os, time\nopen(os.path.join(os.environ['PARATRAIN_RUN_DIR'], 'order' + os.environ['RANK']), 'w')"
        ".write(os.environ.get('CUDA_DEVICE_ORDER', '') + ' ' + os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "time.sleep(0.5)\n"
    )
    cfg = LaunchConfig(
        script=script,
        workers=2,
        env={"CUDA_VISIBLE_DEVICES": "3"},
        probe=False,
        monitor_hz=20.0,
        run_dir=tmp_path / "run",
    )
    run = RunDir(tmp_path / "run")
    summary = launch_script._launch(cfg, run, script, [sys.executable, str(script)], True, 1, None)
    assert summary["status"] == "completed", summary
    # Both ranks see one device (CUDA 0 = NVML's PCI-ordered device 3, NVML index 2).
    assert _gpu_samples(run.path / SYSTEM_FILE) == {0: 2}
    assert {(run.path / f"order{r}").read_text() for r in (0, 1)} == {"PCI_BUS_ID 3"}


def test_a_task_bound_to_one_gpu_computes_on_device_0(monkeypatch):
    """srun --gpus-per-task=1: the task of local rank 3 sees one GPU, device 0 (not cuda:3); four
    such tasks on a machine pass placement, while tasks that all see the same two GPUs do not."""
    from paratrain.config import TrainConfig
    from paratrain.engine.distributed import Placement, init_rank
    from paratrain.launch.nodes import adopt_tasks, task_placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    env = {
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_LOCALID": "3",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_JOB_ID": "77",
        "CUDA_VISIBLE_DEVICES": "2",
    }
    cfg, tasks = adopt_tasks(TrainConfig(device="cuda"), env)
    placement = task_placement(cfg, tasks)
    assert placement.device_type == "cuda" and tasks.local_rank == 3
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "1")  # no process group: only the device choice is under test
    ctx = init_rank(Placement(backend="nccl", device_type="cuda", threads_per_worker=torch.get_num_threads()))
    assert ctx.device == torch.device("cuda", 0) and chosen == [torch.device("cuda", 0)]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UsageError, match="srun started 4 tasks on this machine and each sees the same 2 GPUs"):
        task_placement(cfg, tasks)


def test_commbench_refuses_more_gpu_ranks_than_gpus(monkeypatch, capsys):
    from paratrain.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert main(["commbench", "--workers", "2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers 2 needs 2 GPUs but 1 are visible" in err, err


# -- two real gloo ranks: fsdp under a CUDA build's accelerator, the pipeline's checkpoint gather ----

SPAWNED = {
    "fsdp-cuda-build": dict(strategy="fsdp", workers=2, epochs=1, synthetic_samples=256, checkpoint_every=1),
    "pipeline-gather": dict(strategy="pipeline", workers=2, epochs=1, synthetic_samples=256, checkpoint_every=1),
}


def _spawned_rank(rank: int, out: str, ports: list[int]) -> None:
    """Both runs on CPU ranks of a torch that says its accelerator is CUDA, as a CUDA build on a GPU
    host does under --device cpu (what users patch to try "FSDP2 on CPU"); during the pipeline run
    the default group also claims to be NCCL, and every gather_object records its group's backend."""
    import torch.distributed as dist

    cuda = torch.device("cuda")
    torch._C._get_accelerator = lambda: cuda
    torch.accelerator.current_accelerator = lambda check_available=False: cuda
    real_backend, real_gather = dist.get_backend, dist.gather_object
    gathers = []

    def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
        gathers.append("default" if group is None else real_backend(group))
        return real_gather(obj, object_gather_list, dst=dst, group=group, group_dst=group_dst)

    dist.gather_object = gather_object
    placement = dict(backend="gloo", device_type="cpu", threads_per_worker=1)
    train_spawned(rank, Path(out), ports[:1], {"fsdp-cuda-build": (SPAWNED["fsdp-cuda-build"], placement)})
    gathers.clear()  # DCP's own gathers of the fsdp run's save plans are not the pipeline's
    dist.get_backend = lambda group=None: "nccl" if group is None else real_backend(group)
    train_spawned(rank, Path(out), ports[1:], {"pipeline-gather": (SPAWNED["pipeline-gather"], placement)})
    (Path(out) / f"gathers{rank}.json").write_text(json.dumps(gathers))


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    out = tmp_path_factory.mktemp("spawned")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARATRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        ranks = start_ranks(_spawned_rank, (str(out), [free_port(), free_port()]), nprocs=2, join=False)
        while not ranks.join():
            pass
    return out


def test_fsdp_on_cpu_ranks_of_a_cuda_build_shards_on_a_cpu_mesh(spawned):
    summary = json.loads((spawned / "fsdp-cuda-build" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["strategy"] == "fsdp" and summary["workers"] == 2


def test_the_pipeline_checkpoint_gathers_over_a_gloo_group_when_the_default_is_nccl(spawned):
    summary = json.loads((spawned / "pipeline-gather" / "summary.json").read_text())
    assert summary["status"] == "completed"
    for rank in (0, 1):
        gathers = json.loads((spawned / f"gathers{rank}.json").read_text())
        assert gathers == ["gloo"], gathers  # one checkpoint, over the host group


# -- a model larger than the memory limit, built on meta and sharded ------------------------------


def test_an_fsdp_model_larger_than_the_memory_limit_trains_on_two_ranks(tmp_path, monkeypatch):
    """user_factories.frozen_tower's 1.37 GB exceed --memory-limit 1150M; each rank builds it on meta
    and materialises its half (beside torch's ~300 MiB), so both ranks train, and each one's peak
    stays below one whole copy of the model (building it whole first, as before, failed the limit)."""
    from user_factories import frozen_tower

    monkeypatch.chdir(Path(__file__).parent)  # user_factories.py is found from the working directory
    summary = paratrain.train(
        synthetic(
            tmp_path,
            workers=2,
            strategy="fsdp",
            model="user_factories:frozen_tower",
            synthetic_samples=64,
            batch_size=4,
            epochs=1,
            log_every=1,
            memory_limit="1150M",
            shard_unit="Linear",
            max_steps=2,
        )
    )
    assert summary["status"] == "completed"
    full = sum(p.numel() * 4 for p in frozen_tower().parameters())
    assert full > 1150 * 2**20
    held = summary["memory"]["parameters_bytes"]
    assert all(h == pytest.approx(full / 2, rel=0.01) for h in held), held
    assert max(summary["peak_memory_bytes"]) < full, summary["peak_memory_bytes"]


# -- MFU and find-batch ---------------------------------------------------------------------------


def test_fp32_mfu_counts_tf32_where_torch_allows_it():
    """A100 at fp32: convolutions run in TF32 by default (cudnn.allow_tf32), matrix products only when
    allowed (float32 matmul precision "high"); the peak is the rate of the run's own mix. And "L4"
    is not "L40"."""
    from paratrain.engine import flops

    a100 = "NVIDIA A100-SXM4-80GB"
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32, "torch's defaults"
    assert flops.gpu_peak(a100, "32", convolution_share=1.0)[0] == pytest.approx(156e12)
    assert flops.gpu_peak(a100, "32", convolution_share=0.0)[0] == pytest.approx(19.5e12)
    mixed, source = flops.gpu_peak(a100, "32", convolution_share=0.9)
    assert mixed == pytest.approx(1e12 / (0.9 / 156 + 0.1 / 19.5)) and "TF32" in source
    torch.set_float32_matmul_precision("high")
    try:
        assert flops.gpu_peak(a100, "32", convolution_share=0.0)[0] == pytest.approx(156e12)
    finally:
        torch.set_float32_matmul_precision("highest")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert flops.gpu_peak(a100, "32", convolution_share=1.0)[0] == pytest.approx(19.5e12)
    assert flops.gpu_peak("NVIDIA L40", "bf16")[0] == pytest.approx(181e12)
    assert flops.gpu_peak("NVIDIA L4", "bf16")[0] == pytest.approx(121e12)
    assert flops.gpu_peak("Tesla T4", "32", convolution_share=1.0)[0] == pytest.approx(8.1e12), "Turing has no TF32"


def test_a_cnn_runs_convolution_flops_the_mfu_peak_weighs(tmp_path):
    """The FLOP count that weighs the peak: the tutorial CNN's are mostly convolutions."""
    from paratrain.engine.flops import count_flops
    from paratrain.workloads.models import TutorialCNN
    from paratrain.workloads.objective import Objective

    count = count_flops(TutorialCNN(), Objective(), torch.zeros(1, 3, 32, 32), torch.zeros(1, dtype=torch.long))
    assert 0.8 < count.convolution / count.total < 1.0, count


CUDNN_FAILURE = """Traceback (most recent call last):
  File "loop.py", line 300, in train_epoch
RuntimeError: Unable to find a valid cuDNN algorithm to run convolution
"""
CUBLAS_FAILURE = """RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
paratrain: rank 0 failed: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


def test_find_batch_bisects_through_cudnn_and_cublas_allocation_failures(tmp_path, monkeypatch):
    """GPU probes (child processes) stood in for: batches up to 37 fit; 64 fails as cuDNN does when no
    algorithm's workspace fits, larger ones as cuBLAS does, its marker lines above the last."""
    from paratrain.batch import find_batch as fb
    from paratrain.engine.distributed import Placement

    monkeypatch.setattr(
        "paratrain.launch.placement.plan_placement",
        lambda cfg: Placement(backend="nccl", device_type="cuda", threads_per_worker=1),
    )
    probed = []

    def child(argv, **kwargs):
        run_dir = Path(argv[-1]).with_suffix("")  # the probe's config file is RUN_DIR.json
        batch = int(run_dir.name.removeprefix("batch-"))
        probed.append(batch)
        if batch > 37:
            return types.SimpleNamespace(returncode=1, stderr=CUDNN_FAILURE if batch == 64 else CUBLAS_FAILURE)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(
            json.dumps(
                {
                    "status": "completed",
                    "samples_per_s": 100.0 * batch,
                    "peak_memory_bytes": [batch],
                    "memory": {"activations_peak_bytes": [batch]},
                }
            )
        )
        (run_dir / "metrics.jsonl").write_text(  # one worker, a step of the batch logged each step
            "".join(
                json.dumps({"event": "step", "samples": batch * (step + 1), "samples_per_s": 100.0 * batch}) + "\n"
                for step in range(3)
            )
        )
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(fb, "subprocess", types.SimpleNamespace(run=child))
    # The failed search keeps its scratch directory for the user to read: here, inside tmp_path
    # (test_batch checks that no search leaves one in the system's temporary directory).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    train = {k: v for k, v in synthetic(tmp_path).items() if k not in ("batch_size", "run_dir", "quiet")}
    result = fb.find_batch(train, tmp_path / "out")
    assert result["max_batch"] == 37 and result["first_failed"] == 38 and result["limited_by"] == "memory"
    assert 64 in probed and probed[-1] in (37, 38)
    # Any other failure still ends the search, naming it.
    with pytest.raises(RunFailed, match="something else"):
        monkeypatch.setattr(
            fb,
            "subprocess",
            types.SimpleNamespace(
                run=lambda argv, **kw: types.SimpleNamespace(returncode=1, stderr="RuntimeError: something else\n")
            ),
        )
        fb.find_batch(train, tmp_path / "out2")
