"""Ranks forked from the CLI's fork server: they start with torch already imported, and they see the
launcher's environment as it is when they start, not as it was when the server started. And what
`paratrain launch` and `paratrain doctor` import before they do anything, and what a mistyped workload waits for."""

import json
import os
import subprocess
import sys

from conftest import synthetic
from torch import nn

import paratrain
from paratrain import forkserver


def recording_net(num_classes: int = 10) -> nn.Module:
    """Built in every rank: notes the rank, a variable set after the server started, and whether
    torch._dynamo (which only the server preloads) was already there."""
    if "RANK" in os.environ:  # not the launcher's own check of the model
        with open(os.environ["PARATRAIN_TEST_RECORD"], "a") as f:
            f.write(f"{os.environ['RANK']} {os.environ['PARATRAIN_TEST_STAMP']} {'torch._dynamo' in sys.modules}\n")
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, num_classes))


def test_forked_ranks_see_the_launchers_environment(tmp_path, monkeypatch):
    record = tmp_path / "record"
    assert forkserver.start_method() == "forkserver"  # the suite's server, started before this test (conftest)
    monkeypatch.setenv("PARATRAIN_TEST_RECORD", str(record))  # after the server started
    monkeypatch.setenv("PARATRAIN_TEST_STAMP", "now")
    paratrain.train(
        synthetic(
            tmp_path,
            workers=2,
            epochs=1,
            synthetic_samples=128,
            synthetic_shape=(3, 8, 8),
            model="test_fast_launch:recording_net",
        )
    )
    assert sorted(set(record.read_text().splitlines())) == [
        "0 now True",
        "1 now True",
    ]  # rank 0 builds it again for the FLOP count


def test_a_python_caller_spawns_its_ranks_outside_a_serving_block(monkeypatch):
    monkeypatch.setattr(forkserver, "_serving", False)  # outside the suite's block: a notebook's train()
    assert forkserver.start_method() == "spawn"
    with forkserver.serving(True):  # the CLI's train and scale
        assert forkserver.start_method() == "forkserver"
        with forkserver.serving(False):  # a nested command that does not want one leaves it serving
            assert forkserver.start_method() == "forkserver"
        assert forkserver.start_method() == "forkserver"
    assert forkserver.start_method() == "spawn"


def test_a_scripts_launcher_and_the_doctor_import_no_engine():
    """`paratrain launch` starts a script's ranks after its own imports, and the doctor only reads files:
    neither needs the training loop, FSDP2 or DTensor (about 2 s beyond torch), nor the doctor torch (6 s)."""
    probe = (
        "import json, sys, paratrain.doctor; doctor = sorted(sys.modules);"
        "import paratrain.launch.script; print(json.dumps([doctor, sorted(sys.modules)]))"
    )
    doctor, launcher = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True).stdout)
    assert "torch" not in doctor
    assert "torch.distributed.elastic.agent.server.api" in launcher  # what it does need: the elastic agent
    assert not {"paratrain.engine.loop", "torch.distributed.fsdp", "torch.distributed.tensor"} & set(launcher)


def test_a_mistyped_workload_is_refused_before_torch_is_imported():
    """The workloads' names live in the config layer, so `--workload` with a name that is not one is refused in a
    fraction of a second, not after the seconds torch takes to import."""
    probe = (
        "import sys; from paratrain.cli import main; code = main(['train', '--workload', 'imagenet-vit']);"
        "print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["2", "False"], done
    assert done.stderr.count("\n") == 1 and "unknown workload; choose from cifar10-cnn," in done.stderr
    assert "(got 'imagenet-vit')" in done.stderr
