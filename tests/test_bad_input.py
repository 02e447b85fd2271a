"""Bad input across every command: exit status 2, one line on stderr, no traceback, and nothing
created or changed. (train's own flags and config files: test_cli_errors.py.)

Each case runs in a fresh directory holding a few files it may point at; the whole directory
(names, bytes and modification times) must be the same afterwards, and the command runs from it,
so a default output directory (runs/...) would show up too.
"""

import json
import os
from pathlib import Path

import pytest

from paratrain.cli import main

CORES = len(os.sched_getaffinity(0))
SLURM = ["--gpus-per-node", "4", "--time", "00:10:00", "--partition", "gpu"]


def _fixtures(d: Path) -> None:
    """What the cases point at: a search space, a script, a directory that is not a run, a file."""
    (d / "space.json").write_text(
        json.dumps(
            {
                "algorithm": "grid",
                "parameters": {"lr": {"type": "discrete", "values": [0.01]}},
                "spec": {"metric": "val_accuracy", "objective": "maximize"},
            }
        )
    )
    (d / "broken.json").write_text('{"algorithm": "grid",')
    (d / "train.py").write_text("print('hello')\n")
    (d / "notes").mkdir()
    (d / "notes" / "todo.txt").write_text("mine")
    (d / "file.txt").write_text("a file, not a directory")


# name: (argv, a fragment the message must hold)
BAD = {
    # the command line itself
    "unknown command": (["trian"], "invalid choice: 'trian'"),
    "misspelt scale flag": (["scale", "--workers", "1", "--out", "s", "--repeat", "2"], "did you mean --repeats?"),
    # train (beyond test_cli_errors.py)
    "epochs zero": (["train", "--epochs", "0"], "--epochs"),
    "val split of one and a half": (["train", "--val-split", "1.5"], "--val-split"),
    "warmup longer than training": (["train", "--warmup-epochs", "5", "--epochs", "2"], "--warmup-epochs"),
    "memory limit not a size": (["train", "--memory-limit", "lots"], "not a size"),
    "unknown precision": (["train", "--precision", "fp8"], "--precision"),
    "stages without a pipeline": (["train", "--stages", "2"], "--stages"),
    "run dir is a file": (["train", "--workload", "synthetic-cnn", "--run-dir", "file.txt"], "not empty"),
    "run dir holds something else": (["train", "--workload", "synthetic-cnn", "--run-dir", "notes"], "not empty"),
    # scale
    "scale worker count zero": (["scale", "--workers", "0,1", "--out", "s"], "positive"),
    "scale worker counts repeat": (["scale", "--workers", "1,1", "--out", "s"], "must not repeat"),
    "scale worker count not a number": (["scale", "--workers", "one,two", "--out", "s"], "--workers"),
    "scale unknown mode": (["scale", "--workers", "1", "--out", "s", "--mode", "medium"], "--mode"),
    "scale strategy single": (["scale", "--workers", "1,2", "--out", "s", "--strategy", "single"], "--strategy single"),
    "scale more workers than cores": (["scale", "--workers", f"1,{CORES * 2}", "--out", "s"], "cores"),
    "scale script missing": (["scale", "--workers", "1", "--out", "s", "--script", "nothere.py"], "does not exist"),
    "scale repeats zero": (["scale", "--workers", "1", "--out", "s", "--repeats", "0"], "--repeats"),
    "scale out holds something else": (["scale", "--workers", "1", "--out", "notes"], "something else"),
    "scale unknown workload": (
        ["scale", "--workers", "1", "--out", "s", "--workload", "imagenet-vit"],
        "unknown workload",
    ),
    # sweep
    "sweep space missing": (["sweep", "nothere.json", "--out", "w"], "nothere.json"),
    "sweep without a space": (["sweep", "--out", "w"], "search-space file"),
    "sweep without out": (["sweep", "space.json"], "--out"),
    "sweep no jobs": (["sweep", "space.json", "--out", "w", "-j", "0"], "--jobs"),
    "sweep broken space": (["sweep", "broken.json", "--out", "w"], "broken.json"),
    "sweep train flag with a script": (
        ["sweep", "space.json", "--out", "w", "--script", "train.py", "--lr", "0.1"],
        "--lr",
    ),
    # launch
    "launch no ranks": (["launch", "-n", "0", "train.py"], "--workers"),
    "launch script missing": (["launch", "nothere.py"], "does not exist"),
    "launch monitor rate zero": (["launch", "--monitor-hz", "0", "train.py"], "--monitor-hz"),
    "launch run dir holds something else": (["launch", "--run-dir", "notes", "train.py"], "not empty"),
    "launch script is a directory": (["launch", "notes"], "notes is a directory"),
    "launch a schedule for a script that never builds one": (
        ["launch", "--batch-schedule", "adaptive", "train.py"],
        "train.py never calls paratrain.batch_schedule(...), so paratrain cannot set its batch",
    ),
    "launch a batch limit without a schedule": (
        ["launch", "--max-global-batch", "256", "train.py"],
        "--max-global-batch applies to --batch-schedule warmup or adaptive",
    ),
    # paths under a regular file: NotADirectoryError for everyone, root included
    "train run dir under a file": (
        ["train", "--workload", "synthetic-cnn", "--run-dir", "file.txt/run"],
        "not a directory",
    ),
    "scale out under a file": (
        ["scale", "--workers", "1", "--out", "file.txt/s", "--workload", "synthetic-cnn"],
        "not a directory",
    ),
    "sweep out under a file": (["sweep", "space.json", "--out", "file.txt/w"], "not a directory"),
    "launch run dir under a file": (["launch", "--run-dir", "file.txt/run", "train.py"], "not a directory"),
    "config file is a directory": (["train", "--config", "notes"], "notes is a directory"),
    # a plain OSError, not one of its subclasses: the file system's own limit on a name
    "train run dir name too long": (
        ["train", "--workload", "synthetic-cnn", "--run-dir", "r" * 300],
        "File name too long; a name in the path is longer",
    ),
    "scale out name too long": (
        ["scale", "--workers", "1", "--out", "o" * 300, "--workload", "synthetic-cnn"],
        "File name too long",
    ),
    "recommend without flags": (["recommend"], "missing required options --workers, --out"),
    "plan with a shard unit the model lacks": (
        ["plan", "--model", "user_factories:frozen_tower", "--device", "cpu", "--gpus", "2", "--shard-unit", "Nope"],
        "--shard-unit Nope: the model has no module of that class; choose one of Flatten, Linear, Sequential",
    ),
    # named against the run's own --workers, not the one worker find-batch measures
    "recommend on split layers": (
        ["recommend", "--workload", "gpt-tiny", "--strategy", "fsdp", "--tp", "2", "--workers", "2", "--out", "rec"],
        "recommend reads the gradient noise of the run's own layout: --grad-noise with fsdp needs each rank's whole "
        "gradient, which --tp 2 splits",
    ),
    "image smaller than the model takes": (
        ["train", "--model", "resnet50v2", "--image-size", "4"],
        "resnet50v2 needs images of at least 8 px a side",
    ),
    "image model on vectors": (
        ["train", "--dataset", "user_factories:vector_pairs", "--num-classes", "2"],
        "takes C,H,W images and the dataset's samples have shape (16,)",
    ),
    "collate for pairs": (
        ["train", "--dataset", "user_factories:vector_pairs", "--collate", "user_factories:mlp"],
        "--collate batches dict samples",
    ),
    "dict samples without labels": (
        ["train", "--model", "user_factories:mlp", "--dataset", "user_factories:unlabelled_dicts"],
        "dict samples hold neither labels (labels, label, label_ids) nor input_ids",
    ),
    # reading commands
    "report of a directory that is no run": (["report", "notes"], "not a paratrain run"),
    "compare one run": (["compare", "notes"], "at least two"),
    "compare directories that are no runs": (["compare", "notes", "notes"], "not a paratrain run"),
    "doctor of nothing": (["doctor", "nowhere"], "nowhere"),
    # slurm
    "slurm gres against gpus per node": (
        ["slurm", "train", *SLURM, "--gres", "gpu:v100:2", "--out", "j"],
        "make them agree",
    ),
    "slurm gres that is no gpu": (["slurm", "train", *SLURM, "--gres", "shard:4", "--out", "j"], "not a GPU resource"),
    "slurm bad time": (
        ["slurm", "train", "--gpus-per-node", "4", "--time", "90 minutes", "--partition", "gpu", "--out", "j"],
        "HH:MM:SS",
    ),
    "slurm partition missing": (
        ["slurm", "train", "--gpus-per-node", "4", "--time", "00:10:00", "--out", "j"],
        "--partition",
    ),
    "slurm cpu device on gpu nodes": (
        ["slurm", "train", *SLURM, "--device", "cpu", "--out", "j"],
        "--device cpu contradicts",
    ),
    "slurm threads against cpus per worker": (
        ["slurm", "train", *SLURM, "--threads-per-worker", "8", "--cpus-per-worker", "10", "--out", "j"],
        "contradicts --cpus-per-worker",
    ),
    "slurm more workers than the nodes have": (
        ["slurm", "scale", "--workers", "1,8", *SLURM, "--out", "s"],
        "raise --nodes",
    ),
    "slurm workers split unevenly": (
        ["slurm", "train", "--workers", "7", *SLURM, "--nodes", "2", "--out", "j"],
        "does not split evenly",
    ),
    "slurm sweep on two nodes": (["slurm", "sweep", "space.json", *SLURM, "--nodes", "2", "--out", "w"], "one node"),
    "slurm out holds something else": (["slurm", "train", *SLURM, "--out", "notes"], "not empty"),
    "slurm unknown target": (["slurm", "run", *SLURM], "invalid choice: 'run'"),
    "slurm misspelt flag": (
        ["slurm", "train", *SLURM, "--gpu-per-node", "2", "--out", "j"],
        "did you mean --gpus-per-node?",
    ),
    "slurm submit without sbatch": (["slurm", "train", *SLURM, "--out", "j", "--submit"], "sbatch is not on PATH"),
    "slurm study of a script": (
        ["slurm", "scale", "--workers", "1", "--script", "train.py", *SLURM, "--out", "s"],
        "srun paratrain launch",
    ),
}


def _state(d: Path) -> dict:
    return {
        str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
    }


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input(tmp_path, capsys, monkeypatch, case):
    argv, expected = BAD[case]
    _fixtures(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no sbatch; no command needs another program
    before = _state(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert expected in err, err
    assert _state(tmp_path) == before, "the command created or changed files"


def test_the_table_covers_every_command():
    commands = {argv[0] for argv, _ in BAD.values()}
    assert {"train", "scale", "sweep", "launch", "report", "compare", "doctor", "slurm"} <= commands
    assert len(BAD) >= 30
