"""The resources generated SLURM jobs ask for, pinned exactly (issue #25): cores per task, GPUs,
nodes, tasks and time, for train, scale and sweep. A job starts one task per node whose elastic
agent starts that node's R ranks: --cpus-per-task = R x the cores of a rank, --gres = R GPUs."""
import json

import pytest

from paratrain.cli import main
from test_slurm import parse_script


def slurm(tmp_path, capsys, *argv) -> dict:
    out = tmp_path / "job"
    code = main(["slurm", *argv, "--time", "02:15:00", "--partition", "p", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return {p.stem: parse_script(p) for p in sorted((out / "slurm").glob("*.sbatch"))}


def resources(script) -> tuple:
    options, _, srun = script
    return (options["--nodes"], options["--ntasks-per-node"], options["--cpus-per-task"], options.get("--gres"),
            options["--time"], srun[1])


def test_cpu_train_asks_for_every_rank_s_cores_in_one_task(tmp_path, capsys):
    jobs = slurm(tmp_path, capsys, "train", "--workers", "4", "--workload", "synthetic-cnn", "--gpus-per-node", "0",
                 "--cpus-per-worker", "3")
    # 4 ranks x 3 cores = 12, in one task on one node; srun is told too
    assert resources(jobs["train"]) == ("1", "1", "12", None, "02:15:00", "--cpus-per-task=12")


def test_threads_per_worker_stands_in_for_cpus_per_worker(tmp_path, capsys):
    jobs = slurm(tmp_path, capsys, "train", "--workers", "2", "--workload", "synthetic-cnn", "--gpus-per-node", "0",
                 "--threads-per-worker", "5")
    assert resources(jobs["train"])[2] == "10"
    # neither given: one core a rank
    jobs = slurm(tmp_path / "b", capsys, "train", "--workers", "3", "--workload", "synthetic-cnn", "--gpus-per-node", "0")
    assert resources(jobs["train"])[2] == "3"


def test_gpu_train_over_two_nodes_asks_per_node(tmp_path, capsys):
    jobs = slurm(tmp_path, capsys, "train", "--workers", "6", "--workload", "synthetic-cnn", "--gpus-per-node", "3",
                 "--nodes", "2", "--cpus-per-worker", "4")
    # 6 ranks on nodes of 3 GPUs: 2 nodes, 3 ranks each: 3 GPUs and 12 cores a node
    assert resources(jobs["train"]) == ("2", "1", "12", "gpu:3", "02:15:00", "--cpus-per-task=12")


def test_cpu_scale_points_and_the_all_cores_reference(tmp_path, capsys):
    jobs = slurm(tmp_path, capsys, "scale", "--workers", "1,2", "--workload", "synthetic-cnn", "--gpus-per-node", "0",
                 "--cpus-per-worker", "2")
    assert sorted(jobs) == ["collect", "synthetic-cnn-w1-all-cores-r0", "synthetic-cnn-w1-r0", "synthetic-cnn-w2-r0"]
    assert resources(jobs["synthetic-cnn-w1-r0"])[2] == "2"
    assert resources(jobs["synthetic-cnn-w2-r0"])[2] == "4"
    # the one-process reference gets the cores of the widest point (2 ranks x 2), not its own 2
    assert resources(jobs["synthetic-cnn-w1-all-cores-r0"])[:4] == ("1", "1", "4", None)
    # the collection: one core, one node, the same time limit
    assert resources(jobs["collect"]) == ("1", "1", "1", None, "02:15:00", "--cpus-per-task=1")


@pytest.fixture
def space(tmp_path):
    path = tmp_path / "space.json"
    path.write_text(json.dumps({"algorithm": "grid", "parameters": {"lr": {"type": "discrete", "values": [0.1, 0.01]}}}))
    return path


def test_sweep_asks_for_jobs_x_workers_per_trial_x_cores(tmp_path, capsys, space):
    jobs = slurm(tmp_path, capsys, "sweep", str(space), "-j", "2", "--workers-per-trial", "3", "--workload", "synthetic-cnn",
                 "--gpus-per-node", "0", "--cpus-per-worker", "2")
    # 2 trials at once x 3 ranks each x 2 cores = 12 cores, one node
    assert resources(jobs["sweep"]) == ("1", "1", "12", None, "02:15:00", "--cpus-per-task=12")
    jobs = slurm(tmp_path / "b", capsys, "sweep", str(space), "-j", "2", "--workers-per-trial", "1", "--workload",
                 "synthetic-cnn", "--gpus-per-node", "0", "--threads-per-worker", "3")
    assert resources(jobs["sweep"])[2] == "6"


def test_gpu_sweep_asks_for_one_gpu_a_rank(tmp_path, capsys, space):
    jobs = slurm(tmp_path, capsys, "sweep", str(space), "-j", "2", "--workers-per-trial", "2", "--workload", "synthetic-cnn",
                 "--gpus-per-node", "4", "--cpus-per-worker", "5")
    assert resources(jobs["sweep"]) == ("1", "1", "20", "gpu:4", "02:15:00", "--cpus-per-task=20")


def test_a_gpu_sweep_wider_than_a_node_is_refused(tmp_path, capsys, space):
    code = main(["slurm", "sweep", str(space), "-j", "3", "--workers-per-trial", "2", "--workload", "synthetic-cnn",
                 "--gpus-per-node", "4", "--time", "01:00:00", "--partition", "p", "--out", str(tmp_path / "job")])
    assert code == 2 and "= 6 GPUs and a node has --gpus-per-node 4" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()
