"""The monitor: a sampler thread of the launching process writing RUN_DIR/system.jsonl."""

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
from conftest import synthetic

import paratrain
from paratrain.cli import main
from paratrain.config import TrainConfig
from paratrain.launch.placement import available_cores
from paratrain.measure.monitor import SYSTEM_FILE, Monitor, ranks_by_environment


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _monitored(tmp_path: Path, run_id: str, proc: psutil.Process) -> float:
    """The monitor run for 2.2 s over the rank of `run_id`; `proc`'s CPU over that time by psutil, in per cent."""
    with Monitor(tmp_path / SYSTEM_FILE, 4.0, ranks_by_environment(run_id)):
        before, started = proc.cpu_times(), time.monotonic()
        time.sleep(2.2)
        after, ended = proc.cpu_times(), time.monotonic()
    return 100 * (after.user + after.system - before.user - before.system) / (ended - started)


def test_a_busy_child_is_sampled_as_psutil_measures_it(tmp_path):
    """A busy loop pinned to one core, found as rank 0 through its environment: the monitor's CPU
    figures agree within 10 % with psutil's own cpu_times over the monitor's life, and the first
    sample is a real figure, not psutil's priming 0.0."""
    core = available_cores()[-1]
    env = {**os.environ, "RANK": "0", "TORCHELASTIC_RUN_ID": "busy-test"}
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, [{core}])\nwhile True: pass"], env=env
    )
    try:
        psutil_percent = _monitored(tmp_path, "busy-test", psutil.Process(busy.pid))
    finally:
        busy.kill()
        busy.wait()
    records = _records(tmp_path / SYSTEM_FILE)
    ranks = [r for r in records if r["kind"] == "rank"]
    hosts = [r for r in records if r["kind"] == "host"]
    assert len(ranks) >= 5 and {r["pid"] for r in ranks} == {busy.pid} and {r["rank"] for r in ranks} == {0}
    assert all(r["cores"] == [core] and r["rss_bytes"] > 0 and r["num_threads"] >= 1 for r in ranks)
    assert ranks[0]["cpu_percent"] > 0.5 * psutil_percent, ranks  # not the priming call's 0.0
    monitored = sum(r["cpu_percent"] for r in ranks) / len(ranks)
    assert abs(monitored - psutil_percent) <= 0.10 * psutil_percent, (monitored, psutil_percent)
    # the host samples see that core busy too, and the memory in use
    assert len(hosts) >= len(ranks) and all(len(h["cpu_percent"]) == psutil.cpu_count() for h in hosts)
    assert min(h["cpu_percent"][core] for h in hosts[1:]) > 0.5 * psutil_percent
    assert all(h["memory_used_bytes"] > 0 for h in hosts)


def test_a_ranks_child_processes_count_in_its_tree_not_in_its_own_figure(tmp_path):
    """A rank that sleeps while a process it started (a grandchild) spins: its own CPU figure
    stays near 0 and its tree's carries the child's, within 10 % of psutil's reading of the child: the doctor
    takes the tree off its cores' busy time, so a rank's workers are never read as other work on its core."""
    core = available_cores()[-1]
    env = {**os.environ, "RANK": "0", "TORCHELASTIC_RUN_ID": "tree-test"}
    code = (
        "import os, subprocess, sys, time\n"
        f"os.sched_setaffinity(0, [{core}])\n"
        # the spinner is a grandchild, as a DataLoader worker of a rank started through a wrapper would be
        'spin = \'import subprocess, sys; print(subprocess.Popen([sys.executable, "-c", "while True: pass"]).pid)\'\n'
        "child = subprocess.Popen([sys.executable, '-c', spin + '; import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        child_percent = _monitored(tmp_path, "tree-test", psutil.Process(int(rank.stdout.readline())))
    finally:
        for proc in psutil.Process(rank.pid).children(recursive=True):
            proc.kill()
        rank.kill()
        rank.wait()
    ranks = [r for r in _records(tmp_path / SYSTEM_FILE) if r["kind"] == "rank"]
    assert len(ranks) >= 5 and {r["pid"] for r in ranks} == {rank.pid}, ranks
    assert max(r["cpu_percent"] for r in ranks) < 10, ranks
    tree = sum(r["tree_cpu_percent"] for r in ranks) / len(ranks)
    assert abs(tree - child_percent) <= 0.10 * child_percent, (tree, child_percent)


def test_a_sample_walks_the_launchers_tree_alone_once_whatever_the_number_of_ranks(tmp_path, monkeypatch):
    """psutil finds a process's children by reading every process on the machine: a walk for each rank's tree cost
    47 ms a sample among 570 processes with 2 ranks, 142 ms with 8, CPU taken from the ranks' cores. Three sleeping
    ranks, each with a child: a sample reads the kernel's lists of children and never psutil's walk of the whole
    table; without those lists, it walks once a sample. Both find the same tree."""
    from paratrain.measure import monitor as module

    env = {**os.environ, "TORCHELASTIC_RUN_ID": "walk-test"}
    sleep = "import time; time.sleep(60)"
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {sleep!r}])\n{sleep}\n"
    ranks = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(r)}) for r in range(3)]
    walks = []
    children = psutil.Process.children
    monkeypatch.setattr(
        psutil.Process, "children", lambda self, *a, **k: walks.append(self.pid) or children(self, *a, **k)
    )
    trees = {}
    try:
        while any(len(children(psutil.Process(r.pid))) < 1 for r in ranks):
            time.sleep(0.05)
        for kernel in (True, False):
            monkeypatch.setattr(module, "_KERNEL_CHILDREN", kernel)
            monitor = Monitor(tmp_path / SYSTEM_FILE, 2.0, ranks_by_environment("walk-test"))
            monitor.sample()  # finds the ranks and takes their baseline
            walks.clear()
            for _ in range(3):
                assert sorted(r["rank"] for r in monitor.sample() if r["kind"] == "rank") == [0, 1, 2]
            assert walks == ([] if kernel else [os.getpid()] * 3), walks
            tree = module._process_tree(monitor.root)
            trees[kernel] = {pid: sorted(child.pid for child in kids) for pid, kids in tree.items() if kids}
        assert all(len(trees[True][r.pid]) == 1 for r in ranks), trees
        assert trees[True] == trees[False]
    finally:
        for rank in ranks:
            for proc in children(psutil.Process(rank.pid), recursive=True):
                proc.kill()
            rank.kill()
            rank.wait()


class _FakeNVML(types.SimpleNamespace):
    """A CPU stand-in for the `pynvml` module: two GPUs, the second without power readings."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM = 1

    def __init__(self):
        super().__init__(calls=[])

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return 4

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"nvml{index}"

    def nvmlDeviceGetPciInfo(self, handle):
        return types.SimpleNamespace(busId=f"00000000:{handle[-1]}0:00.0")

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu={"nvml3": 87, "MIG-abc": 12}[handle], memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30, free=13 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle == "MIG-abc":
            raise self.NVMLError("Not Supported")
        return 215_500  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1410


def test_gpu_samples_follow_nvml_through_cuda_visible_devices(tmp_path):
    """CPU stand-in for pynvml (this machine has no GPU; never run on one): CUDA devices 0 and 1
    under CUDA_VISIBLE_DEVICES=3,MIG-abc are NVML index 3 and that MIG device; power in W; a reading
    the device does not support is null, not an error."""
    nvml = _FakeNVML()
    with Monitor(
        tmp_path / SYSTEM_FILE,
        20.0,
        lambda proc: None,
        cuda_ranks=2,
        nvml=nvml,
        environ={"CUDA_VISIBLE_DEVICES": "3,MIG-abc"},
    ):
        time.sleep(0.3)
    gpus = [r for r in _records(tmp_path / SYSTEM_FILE) if r["kind"] == "gpu"]
    assert nvml.calls == ["init", "shutdown"]
    first, second = gpus[0], gpus[1]
    assert first == {
        "time": first["time"],
        "kind": "gpu",
        "index": 0,
        "utilization_percent": 87,
        "memory_used_bytes": 3 * 2**30,
        "memory_total_bytes": 16 * 2**30,
        "power_w": 215.5,
        "sm_clock_mhz": 1410,
    }
    assert second["index"] == 1 and second["utilization_percent"] == 12 and second["power_w"] is None


def test_a_two_worker_train_run_records_both_ranks(tmp_path):
    """`train --workers 2`: system.jsonl holds host samples and both ranks, each its own process
    pinned to its own core, sampled from the launching process."""
    summary = paratrain.train(synthetic(tmp_path, workers=2, epochs=1, synthetic_samples=256, monitor_hz=5.0))
    records = _records(Path(summary["run_dir"]) / SYSTEM_FILE)
    ranks = [r for r in records if r["kind"] == "rank"]
    assert any(r["kind"] == "host" for r in records)
    by_rank = {r["rank"]: r for r in ranks}
    assert set(by_rank) == {0, 1}
    assert by_rank[0]["pid"] != by_rank[1]["pid"] and os.getpid() not in {r["pid"] for r in ranks}
    assert by_rank[0]["cores"] != by_rank[1]["cores"] and all(len(r["cores"]) == 1 for r in ranks)
    assert all(r["rss_bytes"] > 0 for r in ranks)


def test_monitor_hz_is_run_control_and_must_be_positive(tmp_path, monkeypatch, capsys):
    assert TrainConfig(monitor_hz=10).identity() == TrainConfig().identity()
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--monitor-hz", "0", "--run-dir", "r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["paratrain train: error: --monitor-hz: Input should be greater than 0 (got 0.0)"]
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_script_trial_is_sampled_from_its_trial_process(tmp_path):
    """A script trial runs as a child of its trial process, which monitors it into TRIAL_DIR/system.jsonl
    and ends with the script's exit status."""
    from paratrain.sweep.trial import ScriptCommand, Slot, TrialProcess

    script = tmp_path / "busy.py"
    script.write_text(
        "import os, time\nend = time.time() + 1.2\nwhile time.time() < end: pass\nprint(os.getpid())\nraise "
        "SystemExit(4)\n"
    )
    trial = TrialProcess(ScriptCommand(str(script)), {}, tmp_path / "trial", Slot(0, (available_cores()[-1],)), 0, 1, 0)
    trial.wait(30)
    assert trial.outcome([]).reason.startswith("exit status 4")
    script_pid = int((tmp_path / "trial" / "stdout.log").read_text())
    ranks = [r for r in _records(tmp_path / "trial" / SYSTEM_FILE) if r["kind"] == "rank"]
    assert ranks and {(r["rank"], r["pid"]) for r in ranks} == {(0, script_pid)} and script_pid != trial.pid
    assert max(r["cpu_percent"] for r in ranks) > 50
