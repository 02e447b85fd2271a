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

On CPU a study worker gets one core, so that speedup answers "what does a core's worth of worker
buy", not the question a user faces: is N workers faster than one process on all the cores, which
is what `paratrain train --workers 1` runs by default? So a CPU study also runs that process (the
all-cores reference, alternated with the other points) and reports `speedup_vs_all_cores` beside
`speedup`. Rows carry the noise too: the spread over repeats, runs measured while other work took
the run's cores (summary.json `machine_load`), and single-epoch throughput that includes start-up.
"""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

from paratrain.config import ScaleConfig, TrainConfig, validate
from paratrain.errors import UsageError
from paratrain.launch.load import CONTENDED_ABOVE
from paratrain.launch.placement import available_cores, resolve_device
from paratrain.runs import SCALING_FILE, RunDir, write_json

# Repeats whose samples/s differ by more than this ratio (fastest / slowest) are flagged: on a quiet
# machine repeats of these workloads agree within a few per cent.
SPREAD_LIMIT = 1.15
ALL_CORES = "all_cores_reference"


def point_config(study: ScaleConfig, workload: str, workers: int, repeat: int, all_cores: bool = False) -> dict[str, Any]:
    """The train configuration of one point of the study; `all_cores`: the one-process reference."""
    name = f"{workload}-w{workers}-{'all-cores-' if all_cores else ''}r{repeat}"
    train = {**study.train, "workload": workload, "workers": workers, "quiet": True,
             "run_dir": str(study.out / "runs" / name)}
    if train.get("tensorboard"):
        train["tensorboard"] = str(Path(train["tensorboard"]) / name)     # one TensorBoard run per point
    # On CPU a worker plays the role of a GPU: one core each unless told otherwise, so every
    # point of the study has the same compute per worker. The reference takes the default instead:
    # every core, as `paratrain train --workers 1` does.
    if all_cores:
        train["threads_per_worker"] = None
    else:
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
    on_cpu = not resolve_device(study.train.get("device", "auto"))
    points = []
    # Repeats are the outer loop so that the points alternate (1, 2, all-cores, 1, 2, all-cores, ...):
    # drift on a shared machine then hits every point alike instead of biasing whichever ran last.
    for repeat in range(study.repeats):
        for workload in study.workload:
            for workers, all_cores in [*((n, False) for n in study.workers), *([(1, True)] if on_cpu else [])]:
                cfg = point_config(study, workload, workers, repeat, all_cores)
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
                        "speedup = T(base) / T(N) x base, efficiency = speedup / N; "
                        "speedup_vs_all_cores = T(one process on all cores) / T(N)",
              "cpu_worker": "one worker = one rank with its own core(s), playing the role of a GPU",
              "flag_rules": {
                  "contended": f"in n of the m runs, other work took over {CONTENDED_ABOVE:.0%} of the run's cores "
                               "(summary.json machine_load.other_fraction)",
                  "repeats_disagree": f"the repeats' samples/s differ by more than x{SPREAD_LIMIT} (fastest / slowest = R)",
                  "includes_startup": "a run had a single epoch, so its time and samples/s include start-up",
              },
              "rows": scaling_rows([RunDir(Path(cfg["run_dir"])) for *_, cfg in points])}
    write_json(out / SCALING_FILE, result)
    return result


def steady_epoch_time(summary: dict[str, Any]) -> float:
    """Median epoch time without the first epoch, which pays for start-up (kept when it is the only one)."""
    times = summary["epoch_times_s"]
    return statistics.median(times[1:] or times)


def is_all_cores_reference(config: dict[str, Any]) -> bool:
    """One CPU process with the default threads (every core): what `paratrain train --workers 1` runs."""
    return (config.get("workers") == 1 and config.get("resolved", {}).get("device") == "cpu"
            and config.get("threads_per_worker", 1) is None)


def scaling_rows(runs: list[RunDir]) -> list[dict[str, Any]]:
    """The study table from run directories: one row per (workload, workers), medians over repeats,
    then, on CPU, the all-cores reference row of each workload."""
    groups: dict[tuple[str, int, bool], list[tuple[RunDir, dict, dict]]] = {}
    for run in runs:
        summary = run.read_summary()
        if summary.get("status") != "completed":
            continue
        config = run.read_config()
        groups.setdefault((workload_label(config, summary), summary["workers"], is_all_cores_reference(config)),
                          []).append((run, config, summary))

    rows = []
    for workload in dict.fromkeys(w for w, _, _ in groups):
        counts = sorted(n for w, n, ref in groups if w == workload and not ref)
        reference = groups.get((workload, 1, True))
        base = groups[(workload, counts[0], False)] if counts else groups[(workload, 1, True)]
        rows += [_row(groups[(workload, n, False)], base, reference) for n in counts]
        if reference:
            rows.append(_row(reference, base, reference))
    return rows


def workload_label(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The name a row goes by: the workload's, or, when --model or --dataset replaced half of it,
    what was actually trained (a user's model is not "cifar10-cnn")."""
    if not (config.get("model") or config.get("dataset")):
        return config["workload"]
    return f"{summary.get('model', config.get('model'))} on {summary.get('dataset', config.get('dataset'))}"


def _threads(config: dict[str, Any]) -> int:
    return config.get("resolved", {}).get("threads_per_worker") or config.get("threads_per_worker") or 1


def _row(members: list[tuple[RunDir, dict, dict]], base: list[tuple[RunDir, dict, dict]],
         reference: Optional[list[tuple[RunDir, dict, dict]]]) -> dict[str, Any]:
    run, config, first = members[0]
    summaries = [s for _, _, s in members]
    n, threads = first["workers"], _threads(config)
    times = [steady_epoch_time(s) for s in summaries]
    rates = [s["samples_per_s"] for s in summaries]
    epoch_time = statistics.median(times)
    # Speedup in units of the base point's workers: T(base)/T x base; efficiency per base-worker's
    # worth of cores, which for the study's own points (same threads each) is speedup / N.
    base_n, base_threads = base[0][2]["workers"], _threads(base[0][1])
    base_time = statistics.median(steady_epoch_time(s) for _, _, s in base)
    speedup = base_time / epoch_time * base_n
    ref_time = statistics.median(steady_epoch_time(s) for _, _, s in reference) if reference else None
    contended = sum(bool(s.get("machine_load", {}).get("contended")) for s in summaries)
    spread = max(rates) / min(rates)
    flags = [name for name, raised in (("contended", contended > 0), ("repeats_disagree", spread > SPREAD_LIMIT),
                                       ("includes_startup", any(len(s["epoch_times_s"]) < 2 for s in summaries)))
             if raised]
    return {
        "workload": workload_label(config, first), "workers": n, "threads_per_worker": threads,
        "point": ALL_CORES if is_all_cores_reference(config) else "scaling",
        "global_batch_size": first["global_batch_size"], "batch_size": first["batch_size"], "lr": first["lr"],
        "epoch_time_s": epoch_time, "epoch_time_s_range": [min(times), max(times)],
        "samples_per_s": statistics.median(rates), "samples_per_s_range": [min(rates), max(rates)],
        # sequence workloads: the same throughput in tokens; every run: model FLOPs utilisation
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in summaries) if "tokens_per_s" in first else None,
        "mfu": statistics.median(s["mfu"] for s in summaries) if all(s.get("mfu") is not None for s in summaries) else None,
        "speedup": speedup, "speedup_range": [base_time / max(times) * base_n, base_time / min(times) * base_n],
        "efficiency": speedup / (n * threads / base_threads),
        "speedup_vs_all_cores": ref_time / epoch_time if ref_time else None,
        "speedup_vs_all_cores_range": [ref_time / max(times), ref_time / min(times)] if ref_time else None,
        "val_accuracy": statistics.median(s["val_accuracy"] for s in summaries),
        "val_split": first.get("val_split", "test"),      # what val_accuracy was measured on
        "repeats": len(members), "repeat_spread": spread, "contended_runs": contended, "flags": flags,
        "run_dir": str(run.path), "run_dirs": [str(r.path) for r, _, _ in members],
        "breakdown": {k: statistics.median(s["breakdown"][k] for s in summaries) for k in first["breakdown"]},
    }
