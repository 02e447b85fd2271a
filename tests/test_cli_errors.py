"""Bad input: one line on stderr, exit status 2, no traceback, nothing written or overwritten."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import synthetic

import paratrain
from paratrain.cli import main

CORES = len(os.sched_getaffinity(0))


def _run_cli(capsys, argv) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    return code, err


def _corrupt_archive(tmp_path: Path) -> Path:
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        payload = os.urandom(200_000)
        info = tarfile.TarInfo("train/cat/0.png")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    bad = tmp_path / "corrupt.tar.gz"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return bad


def _not_cifar(tmp_path: Path) -> Path:
    d = tmp_path / "notcifar"
    d.mkdir()
    (d / "readme.txt").write_text("hello")
    return d


def _empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


BAD = {
    "unknown workload": (lambda t: ["--workload", "imagenet-vit"], "unknown workload"),
    "unknown strategy": (lambda t: ["--strategy", "horovod"], "unknown strategy"),
    "batch size zero": (lambda t: ["--batch-size", "0"], "--batch-size"),
    "batch size negative": (lambda t: ["--batch-size", "-4"], "--batch-size"),
    "workers zero": (lambda t: ["--workers", "0"], "--workers"),
    "more workers than cores": (lambda t: ["--workers", str(CORES + 1)], "cores"),
    "threads oversubscribe": (lambda t: ["--workers", str(CORES), "--threads-per-worker", "2"], "cores"),
    "data dir missing": (lambda t: ["--data-dir", str(t / "nowhere")], "nowhere"),
    "data dir empty": (lambda t: ["--data-dir", str(_empty(t))], "empty"),
    "data dir not cifar": (lambda t: ["--data-dir", str(_not_cifar(t))], "notcifar"),
    "corrupt archive": (lambda t: ["--data-dir", str(_corrupt_archive(t))], "corrupt"),
    "model factory does not import": (lambda t: ["--model", "no_such_pkg.models:make"], "no_such_pkg"),
    "not a number": (lambda t: ["--lr", "fast"], "--lr"),
    "unknown flag": (lambda t: ["--learning-rate", "0.1"], "--learning-rate"),
    "single with two workers": (lambda t: ["--strategy", "single", "--workers", "2"], "single"),
    "unknown augmentation": (lambda t: ["--augment", "flip,mixup"], "mixup"),
    "missing backend": (lambda t: ["--backend", "nccl"], "nccl"),
    "unknown allreduce": (lambda t: ["--allreduce", "ring"], "--allreduce"),
    "bucket size zero": (lambda t: ["--bucket-cap-mb", "0"], "--bucket-cap-mb"),
    "device cuda without a GPU": (lambda t: ["--device", "cuda"], "--device cpu"),
    "unknown device": (lambda t: ["--device", "tpu"], "--device"),
    "abbreviated flag": (lambda t: ["--epoch", "1"], "did you mean --epochs?"),
    "misspelt flag": (lambda t: ["--lr-scalling", "none"], "did you mean --lr-scaling?"),
    "global batch larger than the training set": (
        lambda t: [
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "100",
            "--batch-size",
            "64",
            "--workers",
            "2",
            "--threads-per-worker",
            "1",
        ],
        "use --batch-size 50 or less",
    ),
    "limit-train below the classes": (lambda t: ["--limit-train", "5"], "below the 10 classes"),
    "checkpointing none beside checkpointing": (
        lambda t: ["--activation-checkpointing", "none", "--checkpoint-activations"],
        "--activation-checkpointing none contradicts --checkpoint-activations",
    ),
    "full checkpointing of chosen blocks": (
        lambda t: ["--activation-checkpointing", "full", "--checkpoint-activations-every", "2"],
        "give --activation-checkpointing selective",
    ),
    "an unknown checkpointing mode": (lambda t: ["--activation-checkpointing", "some"], "'selective'"),
    "early stop without a validation split": (
        lambda t: ["--workload", "synthetic-cnn", "--early-stop", "2"],
        "--val-split",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case):
    make_args, expected = BAD[case]
    run_dir = tmp_path / "run"
    code, err = _run_cli(capsys, ["train", "--run-dir", str(run_dir), "--quiet", *make_args(tmp_path)])
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_shared_memory_averaging_is_refused_where_it_cannot_work(tmp_path, capsys, monkeypatch):
    from paratrain.engine import shm_allreduce

    monkeypatch.setattr(shm_allreduce.platform, "machine", lambda: "aarch64")
    run_dir = tmp_path / "run"
    code, err = _run_cli(
        capsys,
        [
            "train",
            "--run-dir",
            str(run_dir),
            "--workload",
            "synthetic-cnn",
            "--workers",
            "2",
            "--threads-per-worker",
            "1",
            "--allreduce",
            "shm",
        ],
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "x86-64" in err and "--allreduce backend" in err
    assert not run_dir.exists()


def test_existing_run_dir_is_refused_and_left_alone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    code, err = _run_cli(capsys, ["train", "--run-dir", str(run_dir), "--workload", "synthetic-cnn"])
    # no run, no checkpoint: nothing --resume could continue
    assert code == 2 and "choose a new --run-dir" in err and "--resume" not in err
    assert len(err.strip().splitlines()) == 1
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    paratrain.train(synthetic(tmp, workers=1, epochs=1, checkpoint_every=1))
    return tmp / "run"


def _snapshot(path: Path) -> dict:
    return {p.name: p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_a_finished_run_dir_suggests_a_new_run_dir_and_resume_only_with_a_checkpoint(finished_run, tmp_path, capsys):
    rerun = ["train", "--workload", "synthetic-cnn", "--synthetic-samples", "512", "--threads-per-worker", "1"]
    before = _snapshot(finished_run)
    code, err = _run_cli(capsys, [*rerun, "--run-dir", str(finished_run)])  # its checkpoint is of a finished run
    assert code == 2 and err.strip().endswith("holds a finished run; choose a new --run-dir for this one")
    assert "--resume" not in err and _snapshot(finished_run) == before
    finished_only = tmp_path / "finished"
    shutil.copytree(finished_run, finished_only)
    (finished_only / "checkpoint.pt").unlink()
    code, err = _run_cli(capsys, [*rerun, "--run-dir", str(finished_only), "--resume"])
    assert code == 2 and "holds a finished run, with nothing to resume; choose a new --run-dir" in err
    # a run that did not finish and left a checkpoint: --resume continues it
    stopped = tmp_path / "stopped"
    shutil.copytree(finished_run, stopped)
    (stopped / "summary.json").write_text(json.dumps({"status": "failed", "error": "interrupted"}))
    code, err = _run_cli(capsys, [*rerun, "--run-dir", str(stopped)])
    assert code == 2 and "did not finish; pass --resume to continue it from its checkpoint" in err


def test_resume_with_a_different_configuration_is_refused(finished_run, capsys):
    before = _snapshot(finished_run)
    code, err = _run_cli(
        capsys,
        [
            "train",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "512",
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--lr",
            "0.01",
            "--threads-per-worker",
            "1",
            "--run-dir",
            str(finished_run),
            "--resume",
        ],
    )
    assert code == 2 and "different configuration" in err and "--batch-size" in err
    assert len(err.strip().splitlines()) == 1
    assert _snapshot(finished_run) == before


def test_truncated_checkpoint_is_refused(finished_run, tmp_path, capsys):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in _snapshot(finished_run).items():
        (copy / name).write_bytes(data)
    ckpt = copy / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 3])
    code, err = _run_cli(
        capsys,
        [
            "train",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "512",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--lr",
            "0.01",
            "--threads-per-worker",
            "1",
            "--run-dir",
            str(copy),
            "--resume",
        ],
    )
    assert code == 2 and "truncated or corrupt" in err and len(err.strip().splitlines()) == 1


def test_resume_without_a_run_is_refused(tmp_path, capsys):
    code, err = _run_cli(
        capsys, ["train", "--workload", "synthetic-cnn", "--run-dir", str(tmp_path / "nothing"), "--resume"]
    )
    assert code == 2 and "no run to resume" in err
    assert not (tmp_path / "nothing").exists()


# Each format's own parse error: json.JSONDecodeError and tomllib.TOMLDecodeError (ValueErrors),
# yaml.YAMLError (not one), UnicodeDecodeError (a ValueError, raised while reading).
BAD_CONFIG_FILES = {
    "json syntax": ("c.json", b'{"epochs": 2,}', "does not parse: Expecting property name"),
    "toml syntax": ("c.toml", b"epochs = \n", "does not parse: Invalid value (at line 1, column 10)"),
    "yaml syntax": ("c.yaml", b"epochs: [1, 2\n", "does not parse"),
    "yml syntax": ("c.yml", b"epochs: 2\n  lr: 0.1\n", "does not parse"),
    "not utf-8": ("c.yaml", b"epochs: 2\nlr: \xff\xfe\n", "does not parse: 'utf-8' codec can't decode"),
    "json list": ("c.json", b"[1, 2]", "must hold a mapping"),
    "yaml list": ("c.yaml", b"- epochs\n- 2\n", "must hold a mapping"),
    "yaml scalar": ("c.yaml", b"epochs\n", "must hold a mapping"),
    "empty yaml": ("c.yaml", b"", "must hold a mapping"),
    "missing": (None, None, "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG_FILES))
def test_bad_config_file_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case):
    name, content, expected = BAD_CONFIG_FILES[case]
    path = tmp_path / (name or "absent.yaml")
    if content is not None:
        path.write_bytes(content)
    run_dir = tmp_path / "run"
    code, err = _run_cli(capsys, ["train", "--config", str(path), "--run-dir", str(run_dir), "--quiet"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"config file {path} {expected}" in err, err
    assert not run_dir.exists()


def test_the_installed_command_prints_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "train", "--batch-size", "0", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_the_installed_command_reports_an_unmakeable_run_dir_and_all_missing_flags_in_one_line(tmp_path):
    (tmp_path / "file").write_text("a file, not a directory")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paratrain",
            "train",
            "--workload",
            "synthetic-cnn",
            "--run-dir",
            str(tmp_path / "file" / "run"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "file/run: Not a directory" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "paratrain", "recommend"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "missing required options --workers, --out" in proc.stderr, proc.stderr


def test_help_teaches_the_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--workers",
        "--batch-size",
        "--lr-scaling",
        "--warmup-epochs",
        "--grad-accum",
        "--precision",
        "--checkpoint-every",
        "--resume",
        "--allow-oversubscribe",
        "--augment",
        "--val-split",
    ):
        assert flag in out
