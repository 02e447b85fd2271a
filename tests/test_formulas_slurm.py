"""The resources generated SLURM jobs ask for, pinned exactly (issue #25): cores per task, GPUs,
nodes, tasks and time, for train, scale and sweep. A job starts one task per node whose elastic
agent starts that node's R ranks: --cpus-per-task = R x the cores of a rank, --gres = R GPUs."""

import json
from pathlib import Path

import pytest
from test_slurm import parse_script

from paratrain.cli import main


def slurm(tmp_path, capsys, *argv) -> dict:
    out = tmp_path / "job"
    code = main(["slurm", *argv, "--time", "02:15:00", "--partition", "p", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return {p.stem: parse_script(p) for p in sorted((out / "slurm").glob("*.sbatch"))}


def resources(script) -> tuple:
    options, _, srun = script
    return (
        options["--nodes"],
        options["--ntasks-per-node"],
        options["--cpus-per-task"],
        options.get("--gres"),
        options["--time"],
        srun[1],
    )


def test_cpu_train_asks_for_every_rank_s_cores_in_one_task(tmp_path, capsys):
    jobs = slurm(
        tmp_path,
        capsys,
        "train",
        "--workers",
        "4",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "0",
        "--cpus-per-worker",
        "3",
    )
    # 4 ranks x 3 cores = 12, in one task on one node; srun is told too
    assert resources(jobs["train"]) == ("1", "1", "12", None, "02:15:00", "--cpus-per-task=12")


def test_threads_per_worker_stands_in_for_cpus_per_worker(tmp_path, capsys):
    jobs = slurm(
        tmp_path,
        capsys,
        "train",
        "--workers",
        "2",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "0",
        "--threads-per-worker",
        "5",
    )
    assert resources(jobs["train"])[2] == "10"
    # neither given: one core a rank
    jobs = slurm(
        tmp_path / "b", capsys, "train", "--workers", "3", "--workload", "synthetic-cnn", "--gpus-per-node", "0"
    )
    assert resources(jobs["train"])[2] == "3"


def test_gpu_train_over_two_nodes_asks_per_node(tmp_path, capsys):
    jobs = slurm(
        tmp_path,
        capsys,
        "train",
        "--workers",
        "6",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "3",
        "--nodes",
        "2",
        "--cpus-per-worker",
        "4",
    )
    # 6 ranks on nodes of 3 GPUs: 2 nodes, 3 ranks each: 3 GPUs and 12 cores a node
    assert resources(jobs["train"]) == ("2", "1", "12", "gpu:3", "02:15:00", "--cpus-per-task=12")


def test_cpu_scale_points_and_the_all_cores_reference(tmp_path, capsys):
    jobs = slurm(
        tmp_path,
        capsys,
        "scale",
        "--workers",
        "1,2",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "0",
        "--cpus-per-worker",
        "2",
    )
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
    path.write_text(
        json.dumps({"algorithm": "grid", "parameters": {"lr": {"type": "discrete", "values": [0.1, 0.01]}}})
    )
    return path


def test_sweep_asks_for_jobs_x_workers_per_trial_x_cores(tmp_path, capsys, space):
    jobs = slurm(
        tmp_path,
        capsys,
        "sweep",
        str(space),
        "-j",
        "2",
        "--workers-per-trial",
        "3",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "0",
        "--cpus-per-worker",
        "2",
    )
    # 2 trials at once x 3 ranks each x 2 cores = 12 cores, one node
    assert resources(jobs["sweep"]) == ("1", "1", "12", None, "02:15:00", "--cpus-per-task=12")
    jobs = slurm(
        tmp_path / "b",
        capsys,
        "sweep",
        str(space),
        "-j",
        "2",
        "--workers-per-trial",
        "1",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "0",
        "--threads-per-worker",
        "3",
    )
    assert resources(jobs["sweep"])[2] == "6"


def test_gpu_sweep_asks_for_one_gpu_a_rank(tmp_path, capsys, space):
    jobs = slurm(
        tmp_path,
        capsys,
        "sweep",
        str(space),
        "-j",
        "2",
        "--workers-per-trial",
        "2",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "4",
        "--cpus-per-worker",
        "5",
    )
    assert resources(jobs["sweep"]) == ("1", "1", "20", "gpu:4", "02:15:00", "--cpus-per-task=20")


def test_a_gpu_sweep_wider_than_a_node_is_refused(tmp_path, capsys, space):
    code = main(
        [
            "slurm",
            "sweep",
            str(space),
            "-j",
            "3",
            "--workers-per-trial",
            "2",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "4",
            "--time",
            "01:00:00",
            "--partition",
            "p",
            "--out",
            str(tmp_path / "job"),
        ]
    )
    assert code == 2 and "= 6 GPUs and a node has --gpus-per-node 4" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


# -- the whole script, the flags given back, submission and refusals (mutation-tested) ----------


def test_a_one_node_script_line_by_line(tmp_path, capsys):
    out = tmp_path / "job"
    code = main(
        [
            "slurm",
            "train",
            "--workers",
            "2",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--account",
            "acct",
            "--setup",
            "module load py",
            "--setup",
            "source v/bin/activate",
            "--sbatch-option=--qos=low",
            "--sbatch-option=--mem=8G",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    lines = (out / "slurm" / "train.sbatch").read_text().splitlines()
    # sbatch's options in this order, the setup lines in theirs, then the one srun line
    assert lines[:13] == [
        "#!/bin/bash",
        "#SBATCH --job-name=paratrain-train",
        "#SBATCH --partition=p",
        "#SBATCH --time=00:10:00",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",
        f"#SBATCH --output={out}/slurm/logs/%x-%j.out",
        "#SBATCH --account=acct",
        "#SBATCH --qos=low",
        "#SBATCH --mem=8G",
        "set -euo pipefail",
        "module load py",
    ]
    assert lines[13] == "source v/bin/activate" and len(lines) == 15
    assert lines[14].startswith("srun --cpus-per-task=2 paratrain train ")
    assert (out / "slurm" / "logs").is_dir()
    # not submitted: the command that would submit it
    printed = capsys.readouterr().out
    assert printed == f'{out}/slurm/train.sbatch\nsubmit: for s in {out}/slurm/train.sbatch; do sbatch "$s"; done\n'


def test_a_two_node_script_meets_at_node_0_and_gives_each_node_its_rank(tmp_path, capsys):
    jobs = slurm(
        tmp_path,
        capsys,
        "train",
        "--workers",
        "4",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "2",
        "--gres",
        "gpu:a100:2",
        "--nodes",
        "3",
    )
    options, setup, srun = jobs["train"]
    # 4 ranks on nodes of 2: 2 of the 3 nodes allowed
    assert (options["--nodes"], options["--gres"], options["--cpus-per-task"]) == ("2", "gpu:a100:2", "2")
    assert setup == [
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'export PARATRAIN_RDZV="$head:$((29500 + SLURM_JOB_ID % 2000))"',
    ]
    assert srun[:4] == ["srun", "--cpus-per-task=2", "bash", "-c"]
    inner = srun[4]
    assert inner.startswith("exec paratrain train ")
    assert inner.endswith(' --nodes 2 --node-rank "$SLURM_NODEID" --rdzv "$PARATRAIN_RDZV"')


def srun_words(tmp_path, capsys, *argv) -> list:
    return slurm(tmp_path, capsys, "train", "--workload", "synthetic-cnn", "--gpus-per-node", "0", *argv)["train"][2]


def test_the_job_gives_back_exactly_the_flags_set(tmp_path, capsys):
    words = srun_words(
        tmp_path,
        capsys,
        "--workers",
        "2",
        "--strategy",
        "fsdp",
        "--reshard-after-forward",
        "false",
        "--augment",
        "flip,crop",
        "--compile",
        "--data-dir",
        "data",
    )
    command = words[words.index("paratrain") :]
    # a flag whose default is true is written with its value; one whose default is false only when
    # set; a list joined by commas; a path made absolute (the job runs elsewhere)
    assert command[command.index("--reshard-after-forward") + 1] == "false"
    assert "--compile" in command and command[command.index("--compile") + 1].startswith("--")
    assert "--cpu-offload" not in command and "--resume" not in command
    assert command[command.index("--augment") + 1] == "flip,crop"
    assert command[command.index("--data-dir") + 1] == str(Path("data").absolute())
    # what the job sets itself: the device of the nodes, one thread a rank, the run directory under --out
    assert command[command.index("--device") + 1] == "cpu" and command[command.index("--threads-per-worker") + 1] == "1"
    assert command[command.index("--run-dir") + 1] == str(tmp_path / "job" / "run")
    assert "--batch-size" not in command  # not set: not written
    words = srun_words(tmp_path / "b", capsys, "--strategy", "fsdp", "--reshard-after-forward", "true")
    assert words[words.index("--reshard-after-forward") + 1] == "true"


def test_a_sweep_job_runs_the_sweep_with_its_own_flags_and_the_script_s_arguments(tmp_path, capsys, space):
    script = tmp_path / "train.py"
    script.write_text("print('val_loss=1')\n")
    out = tmp_path / "job"
    code = main(
        [
            "slurm",
            "sweep",
            str(space),
            "-j",
            "2",
            "--script",
            str(script),
            "--gpus-per-node",
            "0",
            "--time",
            "02:15:00",
            "--partition",
            "p",
            "--out",
            str(out),
            "--",
            "--epochs",
            "3",
        ]
    )
    assert code == 0, capsys.readouterr().err
    srun = parse_script(out / "slurm" / "sweep.sbatch")[2]
    assert srun[2:5] == ["paratrain", "sweep", str(space.absolute())]
    assert srun[-3:] == ["--", "--epochs", "3"]
    assert srun[srun.index("--jobs") + 1] == "2" and srun[srun.index("--script") + 1] == str(script)
    assert "train" not in srun and "--workload" not in srun  # a script's sweep has no train flags
    assert not {"--config", "--train", "--script-args"} & set(srun)  # given back as the positional, flags and `--`
    jobs = slurm(tmp_path / "b", capsys, "sweep", str(space), "--workload", "synthetic-cnn", "--gpus-per-node", "0")
    srun = jobs["sweep"][2]
    assert srun[srun.index("--workload") + 1] == "synthetic-cnn" and "--" not in srun
    assert srun[2:5] == ["paratrain", "sweep", str(space.absolute())]  # the sweep's own, then the train flags
    assert not {"--config", "--train", "--script-args"} & set(srun)


FAKE_SBATCH = """#!/bin/bash
echo "$@" >> "{log}"
for a in "$@"; do
  if [ "$a" = --test-only ]; then cat >> "{log}.scripts"; {test_only}; fi
done
{submit}
"""


def fake_sbatch(tmp_path, monkeypatch, test_only="exit 0", submit='n=$(wc -l < "{log}"); echo "$((100 + n));cluster"'):
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH.format(log=log, test_only=test_only, submit=submit.format(log=log)))
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_submit_checks_every_script_then_submits_the_collection_after_the_points(tmp_path, capsys, monkeypatch):
    log = fake_sbatch(tmp_path, monkeypatch)
    out = tmp_path / "study"
    code = main(
        [
            "slurm",
            "scale",
            "--workers",
            "1,2",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "1",
            "--nodes",
            "2",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--submit",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    calls = log.read_text().splitlines()
    # sbatch --test-only on each of the 3 scripts first (nothing written yet), then one submission each
    assert calls[:3] == ["--test-only"] * 3
    points = [f"{out}/slurm/synthetic-cnn-w1-r0.sbatch", f"{out}/slurm/synthetic-cnn-w2-r0.sbatch"]
    assert calls[3:5] == [f"--parsable {p}" for p in points]
    # the job ids are sbatch's first field (before ";cluster"): 104 and 105; the collection waits for both
    assert calls[5] == f"--parsable --dependency=afterany:104:105 {out}/slurm/collect.sbatch"
    assert capsys.readouterr().out.splitlines() == [
        f"{points[0]}  submitted: job 104",
        f"{points[1]}  submitted: job 105",
        f"{out}/slurm/collect.sbatch  submitted: job 106",
    ]
    # what sbatch checked is what was written, script by script
    written = "".join(Path(p).read_text() for p in [*points, f"{out}/slurm/collect.sbatch"])
    assert Path(f"{log}.scripts").read_text() == written
    # the study the collection reports on, and the collection's command
    study = json.loads((out / "study.json").read_text())
    assert study["scheduler"] == "slurm" and study["workers"] == [1, 2]
    assert parse_script(out / "slurm" / "collect.sbatch")[2][-3:] == ["paratrain", "report", str(out)]


def test_the_python_api_returns_where_it_wrote_and_refuses_what_the_job_sets(tmp_path, monkeypatch):
    from paratrain.config import SlurmConfig
    from paratrain.errors import UsageError
    from paratrain.slurm import write_slurm

    slurm_cfg = SlurmConfig(partition="p", time="00:10:00", gpus_per_node=0, out=tmp_path / "job")
    result = write_slurm("train", {"workload": "synthetic-cnn"}, slurm_cfg)
    assert result == {
        "out": str(tmp_path / "job"),
        "scripts": {"train": str(tmp_path / "job" / "slurm" / "train.sbatch")},
        "job_ids": {},
    }
    # A study or a sweep given without train options gets the defaults' (the CLI always nests them).
    cfg = slurm_cfg.model_copy(update={"out": tmp_path / "scale"})
    scripts = write_slurm("scale", {"workload": ["synthetic-cnn"], "workers": [1, 2]}, cfg)["scripts"]
    assert sorted(scripts) == ["collect", "synthetic-cnn-w1-all-cores-r0", "synthetic-cnn-w1-r0", "synthetic-cnn-w2-r0"]
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"algorithm": "grid", "parameters": {"lr": {"type": "discrete", "values": [0.1]}}}))
    cfg = slurm_cfg.model_copy(update={"out": tmp_path / "sweep"})
    assert list(write_slurm("sweep", {"config": space}, cfg)["scripts"]) == ["sweep"]  # the default workload
    for own in ("nodes", "node_rank", "rdzv"):
        again = SlurmConfig(partition="p", time="00:10:00", gpus_per_node=0, out=tmp_path / own)
        with pytest.raises(UsageError, match=f"--{own.replace('_', '-')} is set by the job itself"):
            write_slurm("train", {"workload": "synthetic-cnn", own: 2}, again)


def test_a_scale_job_gives_each_point_the_study_s_train_flags_quietly(tmp_path, capsys):
    jobs = slurm(
        tmp_path,
        capsys,
        "scale",
        "--workers",
        "1,2",
        "--workload",
        "synthetic-cnn",
        "--gpus-per-node",
        "0",
        "--epochs",
        "3",
        "--lr",
        "0.05",
    )
    for name in ("synthetic-cnn-w1-r0", "synthetic-cnn-w2-r0", "synthetic-cnn-w1-all-cores-r0"):
        srun = jobs[name][2]
        assert srun[srun.index("--epochs") + 1] == "3" and srun[srun.index("--lr") + 1] == "0.05", name
        assert "--quiet" in srun, name  # a batch job has no terminal for a progress bar


def test_an_empty_list_flag_is_left_out_and_the_flags_after_it_kept(tmp_path, capsys):
    words = srun_words(tmp_path, capsys, "--augment", "", "--allow-oversubscribe", "--log-every", "7")
    assert "--augment" not in words and "--allow-oversubscribe" in words
    assert words[words.index("--log-every") + 1] == "7"


def test_sbatch_refusing_a_script_writes_nothing_and_says_sbatch_s_last_line(tmp_path, capsys, monkeypatch):
    fake_sbatch(
        tmp_path,
        monkeypatch,
        test_only='echo "sbatch: error: first" >&2; echo "" >&2; echo "sbatch: error: invalid partition" >&2; exit 1',
    )
    out = tmp_path / "job"
    code = main(
        [
            "slurm",
            "train",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--submit",
            "--out",
            str(out),
        ]
    )
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err == (
        "paratrain slurm: error: sbatch refused train.sbatch: sbatch: error: invalid partition; "
        "fix the SLURM options (nothing was written)\n"
    )


@pytest.mark.parametrize(
    "submit,said",
    [
        ('echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1', "sbatch: error: QOSMaxSubmitJobPerUserLimit"),
        ("exit 3", "exit status 3"),
    ],
)
def test_a_submission_refused_after_the_check_is_a_failed_run(tmp_path, capsys, monkeypatch, submit, said):
    fake_sbatch(tmp_path, monkeypatch, submit=submit)
    out = tmp_path / "job"
    code = main(
        [
            "slurm",
            "train",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--submit",
            "--out",
            str(out),
        ]
    )
    assert code == 1
    assert capsys.readouterr().err == f"paratrain slurm: sbatch refused train.sbatch: {said}\n"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--gpus-per-node", "0"], "--out DIR is required"),
        (
            ["train", "--gpus-per-node", "0", "--device", "cuda", "--out", "{out}"],
            "--device cuda contradicts --gpus-per-node 0; give the nodes' GPUs with --gpus-per-node G",
        ),
        (
            ["train", "--gpus-per-node", "2", "--device", "cpu", "--out", "{out}"],
            "--device cpu contradicts --gpus-per-node 2; drop --device or use --gpus-per-node 0",
        ),
        (
            ["train", "--gpus-per-node", "0", "--threads-per-worker", "2", "--cpus-per-worker", "3", "--out", "{out}"],
            "--threads-per-worker 2 contradicts --cpus-per-worker 3",
        ),
        (["train", "--gpus-per-node", "0", "--rdzv", "h:1", "--out", "{out}"], "--rdzv is set by the job itself"),
        (
            ["train", "--gpus-per-node", "0", "--node-rank", "1", "--out", "{out}"],
            "--node-rank is set by the job itself",
        ),
        (
            ["train", "--gpus-per-node", "2", "--workers", "6", "--nodes", "2", "--out", "{out}"],
            "--workers 6 needs 3 nodes of 2 GPUs and --nodes is 2; raise --nodes or use at most --workers 4",
        ),
        (
            ["train", "--gpus-per-node", "4", "--workers", "5", "--nodes", "2", "--out", "{out}"],
            "--workers 5 does not split evenly over the 2 nodes it needs; use a multiple of 2",
        ),
        (
            ["sweep", "{space}", "--gpus-per-node", "0", "--nodes", "2", "--out", "{out}"],
            "writes one job on one node (--nodes 1)",
        ),
        (
            ["sweep", "--gpus-per-node", "0", "--join", "{out}-first", "--out", "{out}"],
            "writes one job on one node (--nodes 1)",
        ),
    ],
)
def test_jobs_that_cannot_run_as_asked_are_refused_before_anything_is_written(tmp_path, capsys, space, argv, message):
    out = tmp_path / "job"
    argv = [a.format(out=out, space=space) for a in argv]
    code = main(["slurm", *argv, "--workload", "synthetic-cnn", "--time", "00:10:00", "--partition", "p"])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (out / "slurm").exists()


def test_an_out_that_holds_something_is_refused_and_an_empty_one_is_used(tmp_path, capsys):
    out = tmp_path / "job"
    out.mkdir()
    slurm(tmp_path, capsys, "train", "--workload", "synthetic-cnn", "--gpus-per-node", "0")  # empty: used
    code = main(
        [
            "slurm",
            "train",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--out",
            str(out),
        ]
    )
    assert code == 2 and f"--out {out} already exists and is not empty" in capsys.readouterr().err
    afile = tmp_path / "file"
    afile.write_text("x")
    code = main(
        [
            "slurm",
            "train",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--out",
            str(afile),
        ]
    )
    assert code == 2 and f"--out {afile} already exists and is not empty" in capsys.readouterr().err


def test_submit_without_sbatch_says_where_to_run_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch there
    out = tmp_path / "job"
    code = main(
        [
            "slurm",
            "train",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--submit",
            "--out",
            str(out),
        ]
    )
    assert code == 2 and "--submit: sbatch is not on PATH" in capsys.readouterr().err and not out.exists()


def test_a_study_of_a_script_is_refused(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    code = main(
        [
            "slurm",
            "scale",
            "--workers",
            "1,2",
            "--script",
            str(script),
            "--gpus-per-node",
            "0",
            "--time",
            "00:10:00",
            "--partition",
            "p",
            "--out",
            str(tmp_path / "job"),
        ]
    )
    assert code == 2 and "paratrain slurm scale runs built-in workloads" in capsys.readouterr().err
