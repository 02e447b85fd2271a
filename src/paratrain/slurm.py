"""`paratrain slurm`: sbatch scripts for a training run, every point of a scaling study, or a sweep.

Each job asks for whole nodes' worth of what its ranks need and starts ONE task per node
(`--ntasks-per-node=1`): that task is `paratrain train`, whose torch elastic agent starts the
node's ranks, pins them to the task's cores and supervises them, the pattern PyTorch documents
for torchrun under SLURM. So a job's resources follow from its ranks per node R:

    --gres=gpu[:TYPE]:R             one GPU per rank (GPU nodes)
    --cpus-per-task=R x C           C = --cpus-per-worker cores per rank
    srun --cpus-per-task=R x C      Slurm 22.05 stopped passing the job's value on to srun (harmless elsewhere)

A study's points are one job each, writing the same run directories `paratrain scale` would
(OUT/runs/<point>), beside OUT/study.json; a last job, after all of them, runs `paratrain report
OUT`, which builds OUT/scaling.json from the finished runs (scale.collect_study). Everything is
validated before anything is written; `--submit` fails before writing when sbatch is missing.

A command above scale and sweep in the layers (pyproject.toml's import-linter contract), not a
launcher: it writes the jobs of their configs; the jobs' `paratrain train` does the launching.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.config import ScaleConfig, SlurmConfig, SweepConfig, TrainConfig, flag, validate
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import write_json
from paratrain.runs.lock import run_dir_entries

# The rendezvous port on the job's first node: torchrun's 29500, offset by the job id so that two
# jobs sharing a first node do not meet at one port (as launch/nodes.py does for srun's ranks).
RDZV_PORT = "$((29500 + SLURM_JOB_ID % 2000))"
SCRIPTS = "slurm"  # OUT/slurm/: the scripts, and logs/ for the jobs' output
COLLECT = "collect"  # the study's last job


@dataclass(frozen=True)
class Job:
    name: str
    nodes: int
    ranks_per_node: int  # GPUs per node on GPU nodes; 0 for the collection job
    cpus_per_task: int
    command: list[str]  # the paratrain command line, without the multi-node flags


def write_slurm(target: str, command: dict[str, Any], slurm: SlurmConfig) -> dict[str, Any]:
    """Write (and with --submit, submit) the jobs of `paratrain <target>` with `command`'s options;
    `command` holds the target's config fields (ScaleConfig, SweepConfig or TrainConfig)."""
    if slurm.out is None:
        raise UsageError("--out DIR is required: the results and the scripts (DIR/slurm/) go there")
    out = slurm.out.absolute()
    if out.exists() and (not out.is_dir() or run_dir_entries(out)):
        raise UsageError(f"--out {out} already exists and is not empty; choose another --out")
    sbatch = shutil.which("sbatch")
    if slurm.submit and sbatch is None:
        raise UsageError(
            "--submit: sbatch is not on PATH (run this on the cluster's login node, or drop --submit "
            "and submit the written scripts with sbatch there)"
        )
    device = "cuda" if slurm.gpus_per_node else "cpu"
    jobs, study = _jobs(target, dict(command), slurm, out, device)
    scripts = {job.name: script_text(job, slurm, out) for job in jobs}
    if slurm.submit:
        for name, text in scripts.items():  # sbatch's own check (partition, limits, account) first
            _sbatch([sbatch, "--test-only"], text, f"{name}.sbatch")
    (out / SCRIPTS / "logs").mkdir(parents=True)
    if study is not None:
        write_json(out / "study.json", study)
    paths = {}
    for name, text in scripts.items():
        paths[name] = out / SCRIPTS / f"{name}.sbatch"
        paths[name].write_text(text)
    submitted: dict[str, str] = {}
    if slurm.submit:
        for name, path in paths.items():
            after = [submitted[n] for n in paths if n != COLLECT] if name == COLLECT else []
            extra = [f"--dependency=afterany:{':'.join(after)}"] if after else []
            submitted[name] = _sbatch([sbatch, "--parsable", *extra, str(path)], None, path.name).split(";")[0]
    return {"out": str(out), "scripts": {n: str(p) for n, p in paths.items()}, "job_ids": submitted}


def _jobs(target: str, values: dict[str, Any], slurm: SlurmConfig, out: Path, device: str) -> tuple[list[Job], Any]:
    if target == "train":
        train = _train_values(values, slurm, device)
        train.setdefault("run_dir", str(out / "run"))
        return [_train_job("train", train, slurm)], None
    if target == "scale":
        if values.get("script") is not None:
            raise UsageError(
                "paratrain slurm scale runs built-in workloads; for your own script write the job with "
                "srun paratrain launch (docs/launch.md)"
            )
        values["out"] = out
        values["quiet"] = True  # a batch job has no terminal to draw a progress bar on
        values["train"] = _train_values(values.get("train", {}), slurm, device)
        study = validate(ScaleConfig, values)
        from paratrain.scale import study_points, study_spec

        jobs = [_train_job(Path(cfg["run_dir"]).name, cfg, slurm) for *_, cfg in study_points(study, device == "cpu")]
        # The one-process reference of a CPU study gets the cores of the largest point.
        widest = max(job.cpus_per_task for job in jobs)
        jobs = [
            Job(j.name, j.nodes, j.ranks_per_node, widest, j.command) if "-all-cores-" in j.name else j for j in jobs
        ]
        collect = Job(COLLECT, 1, 0, 1, ["paratrain", "report", str(out)])
        return [*jobs, collect], {**study_spec(study), "scheduler": "slurm"}
    values["out"] = out
    values["train"] = _train_values(values.get("train", {}), slurm, device) if values.get("script") is None else {}
    sweep = validate(SweepConfig, values)
    if slurm.nodes > 1 or sweep.join is not None:
        raise UsageError(
            "paratrain slurm sweep writes one job on one node (--nodes 1); to add nodes, submit more jobs "
            "that run paratrain sweep --join DIR on them"
        )
    ranks = sweep.jobs * sweep.workers_per_trial
    if slurm.gpus_per_node and ranks > slurm.gpus_per_node:
        raise UsageError(
            f"-j {sweep.jobs} x --workers-per-trial {sweep.workers_per_trial} = {ranks} GPUs and a node has "
            f"--gpus-per-node {slurm.gpus_per_node}; lower -j"
        )
    # GPUs only on GPU nodes: a CPU sweep asking for --gres=gpu:N is refused, or pends forever (#25)
    return [
        Job(
            "sweep",
            1,
            ranks if slurm.gpus_per_node else 0,
            ranks * _cpus_per_worker(sweep.train, slurm),
            sweep_command(sweep),
        )
    ], None


def _train_values(values: dict[str, Any], slurm: SlurmConfig, device: str) -> dict[str, Any]:
    """The train options as every job runs them: on the nodes' device, C threads per rank."""
    given = values.get("device", "auto")
    if given != "auto" and given != device:
        raise UsageError(
            f"--device {given} contradicts --gpus-per-node {slurm.gpus_per_node}; "
            + (
                "drop --device or use --gpus-per-node 0 for CPU nodes"
                if given == "cpu"
                else "give the nodes' GPUs with --gpus-per-node G"
            )
        )
    threads = values.get("threads_per_worker")
    if threads is not None and slurm.cpus_per_worker is not None and threads != slurm.cpus_per_worker:
        raise UsageError(
            f"--threads-per-worker {threads} contradicts --cpus-per-worker {slurm.cpus_per_worker}; "
            "give one of them (each rank gets that many cores and threads)"
        )
    for own in ("nodes", "node_rank", "rdzv"):
        if own in values:
            raise UsageError(f"{flag(own)} is set by the job itself (from --nodes and the job's first node); drop it")
    return {**values, "device": device, "threads_per_worker": _cpus_per_worker(values, slurm)}


def _cpus_per_worker(train: dict[str, Any], slurm: SlurmConfig) -> int:
    return slurm.cpus_per_worker or train.get("threads_per_worker") or 1


def _train_job(name: str, train: dict[str, Any], slurm: SlurmConfig) -> Job:
    cfg: TrainConfig = validate(TrainConfig, train)
    workers, per_node = cfg.workers, slurm.gpus_per_node or cfg.workers
    nodes = -(-workers // per_node)
    if nodes > slurm.nodes:
        raise UsageError(
            f"--workers {workers} needs {nodes} nodes of {per_node} GPUs and --nodes is {slurm.nodes}; "
            f"raise --nodes or use at most --workers {slurm.nodes * per_node}"
        )
    if workers % nodes:
        raise UsageError(
            f"--workers {workers} does not split evenly over the {nodes} nodes it needs; use a multiple of {nodes}"
        )
    ranks = workers // nodes
    threads = cfg.threads_per_worker or 1
    return Job(
        name, nodes, ranks if slurm.gpus_per_node else 0, ranks * threads, ["paratrain", "train", *train_flags(cfg)]
    )


def train_flags(cfg: TrainConfig) -> list[str]:
    """The flags that give `cfg` back: the fields set explicitly, paths made absolute."""
    return config_flags(cfg, cfg.model_fields_set)


def config_flags(cfg: Any, names: Any) -> list[str]:
    argv: list[str] = []
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        if name not in names or value is None:
            continue
        default = type(cfg).model_fields[name].default
        if isinstance(value, bool):
            if default is True:
                argv += [flag(name), str(value).lower()]
            elif value:
                argv.append(flag(name))
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            value = ",".join(map(str, value))
        elif isinstance(value, Path):
            value = value.absolute()
        argv += [flag(name), str(value)]
    return argv


def sweep_command(sweep: SweepConfig) -> list[str]:
    assert sweep.config is not None
    own = sweep.model_fields_set - {"config", "train", "script_args"}
    argv = ["paratrain", "sweep", str(sweep.config.absolute()), *config_flags(sweep, own)]
    if sweep.train:
        argv += train_flags(validate(TrainConfig, sweep.train))
    return argv + (["--", *sweep.script_args] if sweep.script_args else [])


def script_text(job: Job, slurm: SlurmConfig, out: Path) -> str:
    """The sbatch script of one job."""
    options = [
        f"--job-name=paratrain-{job.name}",
        f"--partition={slurm.partition}",
        f"--time={slurm.time}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus_per_task}",
    ]
    if job.ranks_per_node:
        options.append(f"--gres={slurm.gpu_resource}:{job.ranks_per_node}")
    options.append(f"--output={out / SCRIPTS / 'logs'}/%x-%j.out")
    if slurm.account:
        options.append(f"--account={slurm.account}")
    options += slurm.sbatch_option
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in options), "set -euo pipefail", *slurm.setup]
    srun = ["srun", f"--cpus-per-task={job.cpus_per_task}"]
    if job.nodes == 1:
        lines.append(shlex.join([*srun, *job.command]))
    else:
        # Node 0 hosts the rendezvous; every node's task learns its index from SLURM_NODEID.
        lines.append('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        inner = (
            f'exec {shlex.join(job.command)} --nodes {job.nodes} --node-rank "$SLURM_NODEID" --rdzv "$PARATRAIN_RDZV"'
        )
        lines.append(f'export PARATRAIN_RDZV="$head:{RDZV_PORT}"')
        lines.append(f"{shlex.join(srun)} bash -c {shlex.quote(inner)}")
    return "\n".join(lines) + "\n"


def _sbatch(argv: list[str], script: Any, what: str) -> str:
    """sbatch's output (a submission's `jobid[;cluster]`), or its refusal in one line."""
    proc = subprocess.run(argv, input=script, capture_output=True, text=True)
    if proc.returncode != 0:
        said = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        message = f"sbatch refused {what}: {said[-1] if said else f'exit status {proc.returncode}'}"
        if "--test-only" in argv:
            raise UsageError(message + "; fix the SLURM options (nothing was written)")
        raise RunFailed(message)
    return proc.stdout.strip()
