"""`paratrain slurm`: the generated sbatch scripts, read line by line; a CPU study's jobs run by hand
and collected by `paratrain report`; and, where Debian's slurm-wlm can run here, a real submission."""

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import free_port

from paratrain.cli import build_parser, main
from paratrain.config import TrainConfig, validate

SETUP = "module purge; module load python/3.11 cuda/12.4"
REAL_SLURM_RAN = False  # set by the real-SLURM test when it passed


def _run(capsys, argv) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parse_script(path: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """(#SBATCH options, shell lines between the options and srun, the srun line's words)."""
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, "not valid bash"
    lines = path.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    options, body = {}, []
    for line in lines[1:]:
        if line.startswith("#SBATCH "):
            assert not body, f"an #SBATCH line after the first command is ignored by sbatch: {line}"
            key, _, value = line.removeprefix("#SBATCH ").partition("=")
            assert key not in options, f"{key} given twice"
            options[key] = value
        else:
            body.append(line)
    assert body[0] == "set -euo pipefail"
    srun = [line for line in body if "srun " in line]
    assert len(srun) == 1 and body[-1] == srun[0], body
    return options, body[1:-1], shlex.split(srun[0])


def train_config_of(words: list[str]) -> TrainConfig:
    """The TrainConfig a job's `paratrain train` line means, parsed by paratrain's own parser."""
    start = words.index("paratrain")
    assert words[start + 1] == "train", words
    args = build_parser().parse_args(words[start + 1 :])
    values = {k: v for k, v in vars(args).items() if k not in ("command", "config_file", "json")}
    return validate(TrainConfig, values)


@pytest.fixture(scope="module")
def bsc_study(tmp_path_factory):
    """The BSC hands-on study: ResNet-50 v2 on 1, 2 and 4 GPUs of one node."""
    out = tmp_path_factory.mktemp("bsc") / "study"
    code = main(
        [
            "slurm",
            "scale",
            "--workers",
            "1,2,4",
            "--workload",
            "cifar10-resnet50v2",
            "--epochs",
            "5",
            "--batch-size",
            "256",
            "--image-size",
            "128",
            "--gpus-per-node",
            "4",
            "--cpus-per-worker",
            "40",
            "--time",
            "00:30:00",
            "--partition",
            "gpu",
            "--setup",
            SETUP,
            "--sbatch-option=--qos=training",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_each_point_asks_for_its_gpus_and_their_cores(bsc_study, gpus):
    options, setup, srun = parse_script(bsc_study / "slurm" / f"cifar10-resnet50v2-w{gpus}-r0.sbatch")
    assert options == {
        "--job-name": f"paratrain-cifar10-resnet50v2-w{gpus}-r0",
        "--partition": "gpu",
        "--time": "00:30:00",
        "--nodes": "1",
        "--ntasks-per-node": "1",
        "--cpus-per-task": str(40 * gpus),
        "--gres": f"gpu:{gpus}",
        "--output": f"{bsc_study}/slurm/logs/%x-%j.out",
        "--qos": "training",
    }
    assert setup == [SETUP]
    # srun gets the cores itself: Slurm 22.05 stopped passing --cpus-per-task on from sbatch.
    assert srun[:3] == ["srun", f"--cpus-per-task={40 * gpus}", "paratrain"]
    cfg = train_config_of(srun)
    assert (cfg.workers, cfg.device, cfg.threads_per_worker, cfg.workload) == (gpus, "cuda", 40, "cifar10-resnet50v2")
    assert (cfg.epochs, cfg.batch_size, cfg.image_size, cfg.quiet) == (5, 256, 128, True)
    assert cfg.run_dir == bsc_study / "runs" / f"cifar10-resnet50v2-w{gpus}-r0"  # where `paratrain scale` puts it


def test_the_study_is_collected_by_a_report_job(bsc_study):
    scripts = sorted(p.name for p in (bsc_study / "slurm").glob("*.sbatch"))
    assert scripts == [
        "cifar10-resnet50v2-w1-r0.sbatch",
        "cifar10-resnet50v2-w2-r0.sbatch",
        "cifar10-resnet50v2-w4-r0.sbatch",
        "collect.sbatch",
    ]  # no all-cores reference on GPUs
    options, _, srun = parse_script(bsc_study / "slurm" / "collect.sbatch")
    assert "--gres" not in options and options["--cpus-per-task"] == "1"
    assert srun == ["srun", "--cpus-per-task=1", "paratrain", "report", str(bsc_study)]
    spec = json.loads((bsc_study / "study.json").read_text())
    assert spec["scheduler"] == "slurm" and spec["workers"] == [1, 2, 4]
    assert spec["train"]["device"] == "cuda" and spec["train"]["threads_per_worker"] == 40


def test_more_workers_than_a_node_has_span_nodes(tmp_path, capsys):
    code, _, err = _run(
        capsys,
        [
            "slurm",
            "train",
            "--workers",
            "8",
            "--workload",
            "synthetic-cnn",
            "--gpus-per-node",
            "4",
            "--nodes",
            "2",
            "--gres",
            "gpu:a100:4",
            "--time",
            "1-00:00:00",
            "--partition",
            "big",
            "--account",
            "proj",
            "--out",
            str(tmp_path / "job"),
        ],
    )
    assert code == 0, err
    options, setup, srun = parse_script(tmp_path / "job" / "slurm" / "train.sbatch")
    assert (options["--nodes"], options["--ntasks-per-node"], options["--gres"], options["--cpus-per-task"]) == (
        "2",
        "1",
        "gpu:a100:4",
        "4",
    )
    assert options["--account"] == "proj" and options["--time"] == "1-00:00:00"
    # Node 0 hosts the rendezvous, at a port of the job's own.
    assert setup == [
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'export PARATRAIN_RDZV="$head:$((29500 + SLURM_JOB_ID % 2000))"',
    ]
    assert srun[:4] == ["srun", "--cpus-per-task=4", "bash", "-c"]
    # What each node's bash runs, with the values SLURM gives node 1:
    inner = shlex.split(srun[4].replace('"$SLURM_NODEID"', "1").replace('"$PARATRAIN_RDZV"', "node17:29500"))
    cfg = train_config_of(inner)
    assert (cfg.workers, cfg.nodes, cfg.node_rank, cfg.rdzv, cfg.device) == (8, 2, 1, "node17:29500", "cuda")
    assert cfg.run_dir == tmp_path / "job" / "run"


# -- a real SLURM on this machine -------------------------------------------------------------

SLURM_CONF = """\
ClusterName=paratrain-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """munged, slurmctld and slurmd of Debian's slurm-wlm on loopback, with a configuration of their
    own (SLURM_CONF) in a temporary directory; stopped afterwards. Skips, saying why, where they
    are not installed (scripts/test-deps.sh installs them as root) or do not come up."""
    import os
    import shutil
    import socket
    import time

    programs = {
        b: shutil.which(b) or shutil.which(b, path="/usr/sbin:/sbin")
        for b in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")
    }
    missing = [b for b, path in programs.items() if path is None]
    if missing:
        pytest.skip(f"SLURM TEST SKIPPED: {', '.join(missing)} not installed (make test installs slurm-wlm as root)")
    if os.geteuid() != 0:
        pytest.skip("SLURM TEST SKIPPED: slurmd runs jobs as their user and must start as root")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, dir=d, ctld_port=free_port(), d_port=free_port(), cpus=os.cpu_count()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = []
    try:
        subprocess.run(
            [
                programs["munged"],
                "--force",
                f"--key-file={key}",
                f"--socket={d}/munge.socket",
                f"--pid-file={d}/munged.pid",
                f"--log-file={d}/munged.log",
                f"--seed-file={d}/munged.seed",
            ],
            check=True,
            capture_output=True,
        )
        for daemon in ("slurmctld", "slurmd"):
            started.append(
                subprocess.Popen(
                    [programs[daemon], "-D", "-f", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 30
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout:
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                logs = " | ".join(
                    f"{n}: {(d / f'{n}.log').read_text().strip().splitlines()[-1:]}"
                    for n in ("slurmctld", "slurmd")
                    if (d / f"{n}.log").exists()
                )
                pytest.skip(f"SLURM TEST SKIPPED: slurmctld/slurmd did not bring the node up within 30 s ({logs})")
            time.sleep(0.3)
        yield env
    finally:
        # Jobs first, while slurmctld and slurmd can still end them: stopped before their jobs,
        # the daemons once left a batch step's slurmstepd and its `srun ... paratrain report`
        # running 10 minutes after pytest ended (issue #25). Then the daemons, then whatever of
        # this cluster survived them (slurmstepd detaches from slurmd), each waited for.
        if started and all(p.poll() is None for p in started):
            jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
            if jobs:
                subprocess.run(["scancel", *jobs], env=env, capture_output=True)
            deadline = time.monotonic() + 30
            while (
                subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip()
                and time.monotonic() < deadline
            ):
                time.sleep(0.3)
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if (d / "munged.pid").exists():
            try:
                os.kill(int((d / "munged.pid").read_text()), 15)
            except ProcessLookupError:
                pass
        _stop_processes_naming(d)


def _stop_processes_naming(directory: Path, timeout: float = 10.0) -> None:
    """Kill, and wait for, every process whose command line or environment names `directory`: the
    cluster's slurmstepd (its environment holds SLURM_CONF), the jobs' processes, munged."""
    import psutil
    from conftest import leftover_processes

    remaining = leftover_processes(directory, descendants=False)
    for process in remaining:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(remaining, timeout=timeout)


def test_a_study_submitted_to_a_real_slurm_is_collected(slurm_cluster, tmp_path, capsys, monkeypatch):
    import os
    import sys
    import time

    for name, value in slurm_cluster.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "study"
    code, printed, err = _run(
        capsys,
        [
            "slurm",
            "scale",
            "--workers",
            "1",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "128",
            "--epochs",
            "1",
            "--gpus-per-node",
            "0",
            "--time",
            "00:05:00",
            "--partition",
            "debug",
            "--setup",
            f"export PATH={Path(sys.executable).parent}:$PATH",
            "--out",
            str(out),
            "--submit",
        ],
    )
    assert code == 0, err
    # One worker, the one-process-on-all-cores reference, then the collection (each job here is a
    # fresh interpreter importing torch: two points keep the test short).
    assert printed.count("submitted: job") == 3, printed
    deadline = time.monotonic() + 120
    while not (out / "report.html").exists():
        queue = subprocess.run(["squeue", "-h"], env=os.environ, capture_output=True, text=True).stdout
        assert queue.strip() or (out / "report.html").exists(), f"the queue emptied without a report: {printed}"
        assert time.monotonic() < deadline, f"the jobs did not finish: {queue}"
        time.sleep(0.5)
    # report.html is written before the collection job's step ends: wait for the queue to empty,
    # so the job's slurmstepd and srun end here and not after the daemons are stopped.
    while subprocess.run(["squeue", "-h"], env=os.environ, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline + 60, "the collection job did not end after writing the report"
        time.sleep(0.3)
    rows = json.loads((out / "scaling.json").read_text())["rows"]
    assert [(r["workers"], r["point"]) for r in rows] == [(1, "scaling"), (1, "all_cores_reference")]
    assert rows[1]["threads_per_worker"] == os.cpu_count()  # the reference job got every core SLURM has
    logs = sorted(p.name.rsplit("-", 1)[0] for p in (out / "slurm" / "logs").iterdir())
    assert logs == ["paratrain-collect", "paratrain-synthetic-cnn-w1-all-cores-r0", "paratrain-synthetic-cnn-w1-r0"]
    global REAL_SLURM_RAN
    REAL_SLURM_RAN = True


def test_a_cpu_study_run_job_by_job_is_collected_into_one_study(tmp_path, capsys, monkeypatch):
    """The jobs' commands, run here one after the other as SLURM would, fill one study directory that
    `paratrain report` (the collection job) turns into scaling.json and a report. Where the real
    SLURM test above ran, it covered this end to end, and this one is skipped to save suite time."""
    if REAL_SLURM_RAN:
        pytest.skip("covered by test_a_study_submitted_to_a_real_slurm_is_collected, which ran")
    out = tmp_path / "study"
    code, _, err = _run(
        capsys,
        [
            "slurm",
            "scale",
            "--workers",
            "1,2",
            "--workload",
            "synthetic-cnn",
            "--synthetic-samples",
            "128",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--gpus-per-node",
            "0",
            "--time",
            "00:05:00",
            "--partition",
            "debug",
            "--out",
            str(out),
        ],
    )
    assert code == 0, err
    names = sorted(p.stem for p in (out / "slurm").glob("*.sbatch"))
    assert names == ["collect", "synthetic-cnn-w1-all-cores-r0", "synthetic-cnn-w1-r0", "synthetic-cnn-w2-r0"]
    cpus = {}
    for name in names[1:]:
        options, _, srun = parse_script(out / "slurm" / f"{name}.sbatch")
        assert "--gres" not in options
        cpus[name] = options["--cpus-per-task"]
        code, _, err = _run(capsys, srun[3:])  # what the job's srun runs: srun --cpus-per-task=C paratrain ...
        assert code == 0, err
    # One core per worker; the one-process reference gets the cores of the largest point.
    assert cpus == {"synthetic-cnn-w1-all-cores-r0": "2", "synthetic-cnn-w1-r0": "1", "synthetic-cnn-w2-r0": "2"}
    _, _, collect = parse_script(out / "slurm" / "collect.sbatch")
    code, _printed, err = _run(capsys, collect[3:])
    assert code == 0, err
    rows = json.loads((out / "scaling.json").read_text())["rows"]
    assert [(r["workers"], r["point"]) for r in rows] == [(1, "scaling"), (2, "scaling"), (1, "all_cores_reference")]
    assert rows[1]["speedup"] > 0 and (out / "report.html").is_file()
