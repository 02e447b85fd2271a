"""One function per command: it runs the job, then writes its artefacts in order (plots, report).

The CLI parses flags into a command's config (config/), calls its function here and prints what
it returns; a Python caller calls the same function with the same config and gets the same result
and the same files:

    from paratrain.commands import scale
    from paratrain.config import ScaleConfig

    if __name__ == "__main__":  # the ranks are spawned and import the caller's module
        result = scale(ScaleConfig(workers=[1, 2], out=Path("study"), train={"epochs": 3}))
        result["report"]        # study/report.html, as `paratrain scale` leaves it

Nothing is printed here: progress reaches the caller through the callbacks it passes. Heavy modules
(torch, the engine) are imported inside each function, so `paratrain --help` stays fast and the
CLI's fork server starts before torch is imported (forkserver.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paratrain import forkserver
from paratrain.config import (
    CacheConfig,
    CommbenchConfig,
    CompareConfig,
    DoctorConfig,
    DownloadConfig,
    FindBatchConfig,
    LaunchConfig,
    LRFindConfig,
    NoiseScaleConfig,
    PlanConfig,
    RecommendConfig,
    ReportConfig,
    ScaleConfig,
    SlurmConfig,
    SweepConfig,
    TrainConfig,
    WorkloadsConfig,
)


@contextmanager
def _fork_server(wanted: bool) -> Iterator[None]:
    """Ranks forked from a server that imported torch while the command checked its input (the CLI's
    choice: a Python caller that trains many times over hours keeps spawning its ranks)."""
    with forkserver.serving(wanted):
        yield


def train(values: dict[str, Any] | TrainConfig, *, fork_server: bool = False) -> dict[str, Any]:
    """`paratrain train`: one run into its run directory; returns summary.json's contents."""
    workers = values.workers if isinstance(values, TrainConfig) else values.get("workers", 1)
    with _fork_server(fork_server and workers != 1):
        from paratrain.launch.builtin import train as run

        return run(values)


def scale(
    cfg: ScaleConfig,
    on_start: Callable[[], None] | None = None,
    on_point: Callable[[str, int, int, dict], None] | None = None,
    *,
    fork_server: bool = False,
) -> dict[str, Any]:
    """`paratrain scale`: every point's runs, scaling.json, the plots and report.html in `cfg.out`;
    returns the study (scaling.json's contents) with `report`, the page's path."""
    with _fork_server(fork_server and max(cfg.workers) > 1 and cfg.script is None):
        from paratrain.scale import run_study

        result = run_study(cfg, on_start=on_start, on_point=on_point)
    from paratrain.reporting import write_report
    from paratrain.reporting.plots import study_plots
    from paratrain.runs.records import Study

    study_plots(Study.model_validate(result), cfg.out)
    return {**result, "report": str(write_report([cfg.out]))}


def sweep(
    cfg: SweepConfig,
    listen: Callable[[str, Any], None] | None = None,
    ready: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """`paratrain sweep`: the trials, sweep.json, the plots and report.html in the sweep directory;
    returns sweep.json's contents with `report`, the page's path."""
    from paratrain.reporting import write_report
    from paratrain.reporting.plots import sweep_plots
    from paratrain.runs.records import SweepResult
    from paratrain.sweep.driver import run_sweep

    result = run_sweep(cfg, listen or (lambda kind, info: None), ready or (lambda *args: None))
    out = Path(result["out"])
    sweep_plots(SweepResult.model_validate(result), out)
    return {**result, "report": str(write_report([out]))}


def launch(cfg: LaunchConfig) -> dict[str, Any]:
    """`paratrain launch`: the user's script on N ranks into a run directory; returns its summary
    (with the script's exit code)."""
    from paratrain.launch.script import launch_script

    return launch_script(cfg)


def plan(cfg: PlanConfig) -> dict[str, Any]:
    """`paratrain plan`: the predicted table; with `cfg.out`, plan.json, the plots and report.html
    there too (`report` in the result)."""
    from paratrain.plan import PLAN_FILE, run_plan

    result = run_plan(cfg)
    if cfg.out is None:
        return result
    from paratrain.reporting import write_report
    from paratrain.reporting.plots import plan_plots
    from paratrain.runs import write_json
    from paratrain.runs.records import Plan

    cfg.out.mkdir(parents=True, exist_ok=True)
    write_json(cfg.out / PLAN_FILE, result)
    plan_plots(Plan.model_validate(result), cfg.out)
    return {**result, "report": str(write_report([cfg.out]))}


def report(cfg: ReportConfig) -> Path:
    """`paratrain report`: the HTML page of runs or studies; returns its path."""
    from paratrain.reporting import write_report

    return write_report(cfg.paths, cfg.out)


def compare(cfg: CompareConfig) -> dict[str, Any]:
    """`paratrain compare`: one row per run against the first, the verdict, and the page with the overlaid curves."""
    from paratrain.reporting import write_report
    from paratrain.reporting.comparison import comparison_rows, held_out_split
    from paratrain.reporting.verdict import comparison_verdict
    from paratrain.runs import open_run_dir

    runs = [open_run_dir(p) for p in cfg.paths]
    rows = comparison_rows(runs)
    return {
        "rows": rows,
        "held_out_split": held_out_split(runs),
        "verdict": comparison_verdict(rows),
        "report": str(write_report(cfg.paths, cfg.out)),
    }


def doctor(cfg: DoctorConfig) -> dict[str, Any]:
    """`paratrain doctor`: the ranked findings; with `verify`, the top remedy rerun and measured."""
    if cfg.verify:
        from paratrain.doctor.verify import verify

        return verify(cfg.path, cfg.repeats)
    from paratrain.doctor import diagnose

    return diagnose(cfg.path)


def slurm(target: str, command: dict[str, Any], cfg: SlurmConfig) -> dict[str, Any]:
    """`paratrain slurm TARGET`: the sbatch scripts of `paratrain TARGET` with `command`'s flags
    (submitted with `cfg.submit`); returns the scripts and any job ids."""
    from paratrain.slurm import write_slurm

    return write_slurm(target, command, cfg)


def find_batch(cfg: FindBatchConfig, on_probe: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """`paratrain find-batch`: the probes, the largest batch that fits and the knee (find_batch.json)."""
    from paratrain.batch.find_batch import find_batch as run

    return run(cfg.train, cfg.out, cfg.margin, cfg.max_batch, cfg.probe_steps, cfg.knee_within, on_probe)


def noise_scale(cfg: NoiseScaleConfig) -> dict[str, Any]:
    """`paratrain noise-scale`: B_simple measured during a short run (noise_scale.json)."""
    from paratrain.batch.noise_scale import measure_noise_scale

    return measure_noise_scale(cfg.train, cfg.out, cfg.steps, cfg.ema_steps)


def lr_find(cfg: LRFindConfig) -> dict[str, Any]:
    """`paratrain lr-find`: the LR range test and the LR it suggests (lr_find.json)."""
    from paratrain.batch.lr_find import find_lr

    return find_lr(cfg.train, cfg.out, cfg.steps, cfg.lr_min, cfg.lr_max, cfg.target_batch)


def recommend(cfg: RecommendConfig, on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`paratrain recommend`: batch, LR, warmup, schedule and optimizer for N workers (recommend.json)."""
    from paratrain.batch.recommend import recommend as run

    return run(cfg.train, cfg.workers, cfg.out, cfg.noise_steps, cfg.lr_steps, cfg.max_batch, on_stage=on_stage)


def commbench(cfg: CommbenchConfig) -> dict[str, Any]:
    """`paratrain commbench`: each collective's latency and bandwidth fit, saved as JSON (`path`)."""
    from paratrain.commbench import run_commbench

    return run_commbench(cfg)


def cache(cfg: CacheConfig) -> dict[str, Any]:
    """`paratrain cache`: the decoded-dataset cache's entries, or those `cfg.clear` removed."""
    from paratrain.workloads.cache import cache_entries, clear_cache
    from paratrain.workloads.datasets import default_cache_dir

    where = cfg.cache_dir or default_cache_dir()
    if cfg.clear is not None:
        return {"where": where, "removed": clear_cache(cfg.cache_dir, cfg.clear)}
    return {"where": where, "entries": cache_entries(cfg.cache_dir)}


def download_cifar10(cfg: DownloadConfig) -> Path:
    """`paratrain download-cifar10`: the canonical archive in `cfg.data_dir`; returns its path."""
    from paratrain.workloads.datasets import download_cifar10 as download

    return download(cfg.data_dir)


def workloads(cfg: WorkloadsConfig) -> dict[str, Any]:
    """`paratrain workloads`: the named workloads with their descriptions, the models and datasets."""
    from paratrain.workloads import WORKLOADS
    from paratrain.workloads.gpt import PRESETS
    from paratrain.workloads.models import MODELS

    return {
        "workloads": {name: workload.description for name, workload in WORKLOADS.items()},
        "models": [*MODELS, *PRESETS],
        "datasets": ["cifar10", "synthetic", "text"],
    }
