"""Scaling studies: the same job on 1, 2, 4, ... workers, and what adding workers bought.

A study is a grid of points (workload x worker count x repeat), each an ordinary run directory
under OUT/runs/. The table is computed from those run directories alone (`scaling_rows`), so a
study can be resumed, re-analysed or extended without re-running anything.

- Weak scaling (the default, as in data-parallel practice): the per-worker batch stays fixed, the
  global batch grows with N and the LR follows --lr-scaling (linear by default).
- Strong scaling: the global batch (N_min x --batch-size) stays fixed and is split across workers;
  the LR stays at --lr.
Speedup is T(base)/T(N) x base, where T is the median epoch time (the first epoch of every run
excluded) and base the smallest worker count (normally 1); efficiency is speedup / N.
"""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

from paratrain.config import ScaleConfig, TrainConfig, validate
from paratrain.errors import UsageError
from paratrain.launch.placement import available_cores
from paratrain.runs import SCALING_FILE, RunDir, write_json



def point_config(study: ScaleConfig, workload: str, workers: int, repeat: int) -> dict[str, Any]:
    """The train configuration of one point of the study."""
    name = f"{workload}-w{workers}-r{repeat}"
    train = {**study.train, "workload": workload, "workers": workers, "quiet": True,
             "run_dir": str(study.out / "runs" / name)}
    if train.get("tensorboard"):
        train["tensorboard"] = str(Path(train["tensorboard"]) / name)     # one TensorBoard run per point
    # On CPU a worker plays the role of a GPU: one core each unless told otherwise, so every
    # point of the study has the same compute per worker.
    train.setdefault("threads_per_worker", 1)
    base = TrainConfig.model_fields
    batch = train.get("batch_size", base["batch_size"].default)
    if study.mode == "strong":
        global_batch = min(study.workers) * batch
        if global_batch % workers:
            raise UsageError(f"strong scaling splits the global batch {global_batch} over {workers} workers: "
                             "choose --batch-size and --workers so it divides evenly")
        train["batch_size"] = global_batch // workers
        train["base_batch_size"] = global_batch        # the global batch never changes, so neither does the LR
    return train


def plan(study: ScaleConfig) -> list[tuple[str, int, int, dict[str, Any]]]:
    """Every point, validated up front: a bad flag fails before the first run starts."""
    cores = len(available_cores())
    threads = study.train.get("threads_per_worker", 1)
    if max(study.workers) * threads > cores and not study.train.get("allow_oversubscribe"):
        raise UsageError(f"--workers {max(study.workers)} x {threads} thread(s) each needs {max(study.workers) * threads} cores "
                         f"but this machine gives {cores}; drop the larger worker counts")
    points = []
    # Repeats are the outer loop so that the points alternate (1, 2, 1, 2, ...): drift on a shared
    # machine then hits every worker count alike instead of biasing whichever ran last.
    for repeat in range(study.repeats):
        for workload in study.workload:
            for workers in study.workers:
                cfg = point_config(study, workload, workers, repeat)
                validate(TrainConfig, cfg)
                points.append((workload, workers, repeat, cfg))
    return points


def _spec(study: ScaleConfig) -> dict[str, Any]:
    """What makes a study this study: --out may only be resumed by the same spec."""
    return {"mode": study.mode, "workers": study.workers, "repeats": study.repeats, "workload": study.workload,
            "train": {k: v for k, v in sorted(study.train.items()) if k not in ("quiet",)}}


def run_study(study: ScaleConfig, on_start: Optional[Callable[[], None]] = None,
              on_point: Optional[Callable[[str, int, int, dict], None]] = None) -> dict[str, Any]:
    """Run every point not yet finished, then write OUT/scaling.json and return it.

    `on_start` is called once the whole study has been validated, `on_point` after each run.
    """
    from paratrain.launch import train

    points = plan(study)
    out = study.out
    spec_file = out / "study.json"
    spec = _spec(study)
    if out.exists() and any(out.iterdir()):
        if not spec_file.exists():
            raise UsageError(f"--out {out} exists and holds something else than a scaling study; choose another --out")
        if json.loads(spec_file.read_text()) != json.loads(json.dumps(spec, default=str)):
            raise UsageError(f"--out {out} holds a different study; choose another --out (or repeat that study's flags)")
        if not study.resume:
            raise UsageError(f"--out {out} already holds this study; pass --resume to finish it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_json(spec_file, spec)
    if on_start:
        on_start()

    for workload, workers, repeat, cfg in points:
        run = RunDir(Path(cfg["run_dir"]))
        if run.summary.exists() and run.read_summary().get("status") == "completed":
            continue
        if run.path.exists():
            shutil.rmtree(run.path)      # an interrupted point starts over: its timing is incomplete
        summary = train(cfg)
        if on_point:
            on_point(workload, workers, repeat, summary)

    result = {"mode": study.mode, "workload": study.workload, "repeats": study.repeats,
              "timing": "epoch time is the median over the epochs after the first of each run; "
                        "speedup = T(base) / T(N) x base, efficiency = speedup / N",
              "cpu_worker": "one worker = one rank with its own core(s), playing the role of a GPU",
              "rows": scaling_rows([RunDir(Path(cfg["run_dir"])) for *_, cfg in points])}
    write_json(out / SCALING_FILE, result)
    return result


def steady_epoch_time(summary: dict[str, Any]) -> float:
    """Median epoch time without the first epoch, which pays for start-up (kept when it is the only one)."""
    times = summary["epoch_times_s"]
    return statistics.median(times[1:] or times)


def scaling_rows(runs: list[RunDir]) -> list[dict[str, Any]]:
    """The study table from run directories: one row per (workload, workers), medians over repeats."""
    groups: dict[tuple[str, int], list[tuple[RunDir, dict]]] = {}
    for run in runs:
        summary = run.read_summary()
        if summary.get("status") != "completed":
            continue
        workload = run.read_config()["workload"]
        groups.setdefault((workload, summary["workers"]), []).append((run, summary))

    rows = []
    for workload in dict.fromkeys(w for w, _ in groups):
        counts = sorted(n for w, n in groups if w == workload)
        base_n = counts[0]
        base_time = statistics.median(steady_epoch_time(s) for _, s in groups[(workload, base_n)])
        for n in counts:
            members = groups[(workload, n)]
            times = [steady_epoch_time(s) for _, s in members]
            rates = [s["samples_per_s"] for _, s in members]
            epoch_time = statistics.median(times)
            speedup = base_time / epoch_time * base_n
            rows.append({
                "workload": workload, "workers": n, "global_batch_size": members[0][1]["global_batch_size"],
                "batch_size": members[0][1]["batch_size"], "lr": members[0][1]["lr"],
                "epoch_time_s": epoch_time, "epoch_time_s_range": [min(times), max(times)],
                "samples_per_s": statistics.median(rates), "samples_per_s_range": [min(rates), max(rates)],
                "speedup": speedup, "efficiency": speedup / n,
                "val_accuracy": statistics.median(s["val_accuracy"] for _, s in members),
                "repeats": len(members), "run_dir": str(members[0][0].path),
                "run_dirs": [str(r.path) for r, _ in members],
                "breakdown": {k: statistics.median(s["breakdown"][k] for _, s in members) for k in members[0][1]["breakdown"]},
            })
    return rows
