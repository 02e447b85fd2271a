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
the run's cores (summary.json `machine_load`), and single-epoch throughput that includes start-up;
and a script's ranks that never synchronised (`unsynchronised`: N independent copies, so no ratio
of theirs is a speedup, which the verdict then says instead of one).

`--script` studies the user's own torchrun-style script instead: each point is a `paratrain launch`
of it (launch/script.py) and its throughput is what it reports (`paratrain.report(samples_per_s=...)`,
or `samples` and `epoch_time_s` per epoch). The script decides its own batch; it learns the mode
from the environment (PARATRAIN_SCALE_MODE=weak|strong) and its worker count from WORLD_SIZE.
When it reports no epoch times, speedup is the ratio of samples/s (the same thing for a fixed
amount of work per epoch).
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paratrain.config import SCRIPT_STUDY_FLAGS, LaunchConfig, ScaleConfig, TrainConfig, validate
from paratrain.engine.strategies import check_strategy
from paratrain.errors import Interrupted, RunFailed, UsageError
from paratrain.launch.load import CONTENDED_ABOVE
from paratrain.launch.placement import available_cores, resolve_device
from paratrain.runs import SCALING_FILE, RunDir, steady_epoch_time, write_json
from paratrain.runs.lock import run_dir_entries, run_dir_lock
from paratrain.runs.records import Study, Summary, checked

# Repeats whose samples/s differ by more than this ratio (fastest / slowest) are flagged: on a quiet
# machine repeats of these workloads agree within a few per cent.
SPREAD_LIMIT = 1.15
ALL_CORES = "all_cores_reference"
SCALE_MODE_ENV = "PARATRAIN_SCALE_MODE"  # tells a studied script weak or strong
LAYOUT_FIELDS = ("dp", "stages", "microbatches", "pipeline_schedule")
# Tensor parallelism's flags, and FSDP's replicas (HSDP): on a strategy axis they go to tp and fsdp only.
MESH_FIELDS = ("tp", "tp_plan", "sequence_parallel", "loss_parallel", "dp_replicate")


def point_config(
    study: ScaleConfig, workload: str, workers: int, repeat: int, all_cores: bool = False, strategy: str | None = None
) -> dict[str, Any]:
    """The train configuration of one point of the study; `all_cores`: the one-process reference;
    `strategy`: a point of the strategy axis (None: the train default)."""
    name = f"{workload}-{strategy + '-' if strategy else ''}w{workers}-{'all-cores-' if all_cores else ''}r{repeat}"
    train = {
        **study.train,
        "workload": workload,
        "workers": workers,
        "quiet": study.quiet,
        "run_dir": str(study.out / "runs" / name),
    }
    if study.strategy:
        # The layout flags of a strategy axis belong to the strategies that use them: --dp and
        # --stages to hybrid (which defaults to 2 replicas), --microbatches and the schedule to the
        # pipelines, --tp (with its plan and sequence parallelism) and --dp-replicate to fsdp and hsdp (FSDP
        # over tensor-parallel groups, HSDP); the 1-worker point is plain single-process training.
        keep = {
            "hybrid": LAYOUT_FIELDS,
            "pipeline": LAYOUT_FIELDS[2:],
            # beside hsdp in one axis, fsdp is FSDP over every rank: --dp-replicate is hsdp's
            "fsdp": MESH_FIELDS if "hsdp" not in study.strategy else MESH_FIELDS[:-1],
            "hsdp": MESH_FIELDS,
            "tp": MESH_FIELDS[1:4],
        }.get(strategy or "", ())
        train = {k: v for k, v in train.items() if k not in (*LAYOUT_FIELDS, *MESH_FIELDS) or k in keep}
        if strategy:
            train["strategy"] = strategy
        if strategy == "hybrid" and "dp" not in train and "stages" not in train:
            train["dp"] = 2
        if strategy == "tp":
            train["tp"] = workers  # every rank of the point splits each layer: one replica
    if train.get("tensorboard"):
        train["tensorboard"] = str(Path(train["tensorboard"]) / name)  # one TensorBoard run per point
    # On CPU a worker plays the role of a GPU: one core each unless told otherwise, so every
    # point of the study has the same compute per worker. The reference takes the default instead:
    # every core, as `paratrain train --workers 1` does.
    if all_cores:
        train["threads_per_worker"] = None
    else:
        train.setdefault("threads_per_worker", 1)
    base = TrainConfig.model_fields
    batch = train.get("batch_size", base["batch_size"].default)
    # Ranks of one pipeline share a batch: a strategy with fewer replicas than workers takes a
    # larger batch per replica, so every strategy's point processes the same global batch.
    replicas = validate(TrainConfig, train).data_parallel_size
    if study.mode == "strong":
        global_batch = min(study.workers) * batch
        if global_batch % replicas:
            raise UsageError(
                f"strong scaling splits the global batch {global_batch} over {replicas} data-parallel replicas: "
                "choose --batch-size and --workers so it divides evenly"
            )
        train["batch_size"] = global_batch // replicas
        train["base_batch_size"] = global_batch  # the global batch never changes, so neither does the LR
    elif replicas != workers:
        train["batch_size"] = batch * workers // replicas
        train.setdefault("base_batch_size", batch)  # the LR scales with the global batch, as for ddp
    return train


def script_point_config(study: ScaleConfig, workers: int, repeat: int, all_cores: bool) -> dict[str, Any]:
    """The launch configuration of one point of a study of the user's script."""
    assert study.script is not None
    name = f"{study.script.stem}-w{workers}-{'all-cores-' if all_cores else ''}r{repeat}"
    launch = {k: v for k, v in study.train.items() if k in SCRIPT_STUDY_FLAGS}
    # One core per worker, and every core for the reference, as for built-in workloads.
    launch["threads_per_worker"] = None if all_cores else launch.get("threads_per_worker", 1)
    return {
        **launch,
        "script": str(study.script),
        "script_args": study.script_args,
        "workers": workers,
        "run_dir": str(study.out / "runs" / name),
        "env": {SCALE_MODE_ENV: study.mode},
        "probe": study.probe,
    }


def plan(study: ScaleConfig) -> list[tuple[str, int, int, dict[str, Any]]]:
    """Every point, validated up front: a bad flag fails before the first run starts."""
    cores = len(available_cores())
    threads = study.train.get("threads_per_worker", 1)
    if max(study.workers) * threads > cores and not study.train.get("allow_oversubscribe"):
        raise UsageError(
            f"--workers {max(study.workers)} x {threads} thread(s) each needs {max(study.workers) * threads} cores "
            f"but this machine gives {cores}; drop the larger worker counts"
        )
    if study.script is not None and study.script.is_dir():
        raise UsageError(f"--script {study.script} is a directory; pass the path of your training script, a file in it")
    if study.script is not None and not study.script.is_file():
        raise UsageError(f"--script {study.script} does not exist; pass the path of your training script")
    on_cpu = not resolve_device(study.train.get("device", "auto"))
    return study_points(study, on_cpu)


def study_points(study: ScaleConfig, on_cpu: bool) -> list[tuple[str, int, int, dict[str, Any]]]:
    """Every point of the study, each validated; `on_cpu` adds the one-process-on-all-cores reference.
    Nothing here looks at this machine: `paratrain slurm` plans the points of a cluster's nodes."""
    from paratrain.workloads import check_model

    for strategy in study.strategy:
        check_strategy(strategy)
    points = []
    # Repeats are the outer loop so that the points alternate (1, 2, all-cores, 1, 2, all-cores, ...):
    # drift on a shared machine then hits every point alike instead of biasing whichever ran last.
    # With a strategy axis, one worker is the same run for every strategy (one process has nothing
    # to split): it is run once and is every strategy's base.
    strategies = [None] if not study.strategy else study.strategy
    for repeat in range(study.repeats):
        for workload in [study.script.name] if study.script else study.workload:
            for workers, all_cores in [*((n, False) for n in study.workers), *([(1, True)] if on_cpu else [])]:
                for strategy in [None] if workers == 1 else strategies:
                    if study.script:
                        cfg = script_point_config(study, workers, repeat, all_cores)
                        validate(LaunchConfig, cfg)
                    else:
                        cfg = point_config(study, workload, workers, repeat, all_cores, strategy)
                        check_model(validate(TrainConfig, cfg))  # the workload and model exist
                    points.append((workload, workers, repeat, cfg))
    return points


def study_spec(study: ScaleConfig) -> dict[str, Any]:
    """What makes a study this study: --out may only be resumed by the same spec."""
    spec = {
        "mode": study.mode,
        "workers": study.workers,
        "repeats": study.repeats,
        "workload": study.workload,
        **({"strategy": study.strategy} if study.strategy else {}),
        "train": {k: v for k, v in sorted(study.train.items()) if k not in ("quiet",)},
    }
    if study.script is not None:
        spec.update(workload=[study.script.name], script=str(study.script), script_args=study.script_args)
    return spec


def run_study(
    study: ScaleConfig,
    on_start: Callable[[], None] | None = None,
    on_point: Callable[[str, int, int, dict], None] | None = None,
) -> dict[str, Any]:
    """Run every point not yet finished, then write OUT/scaling.json and return it.

    `on_start` is called once the whole study has been validated, `on_point` after each run.
    """
    from paratrain.launch.builtin import train
    from paratrain.launch.script import launch_script

    points = plan(study)
    out = study.out
    spec_file = out / "study.json"
    spec = study_spec(study)
    if out.exists() and run_dir_entries(out):
        if not spec_file.exists():
            raise UsageError(f"--out {out} exists and holds something else than a scaling study; choose another --out")
        if json.loads(spec_file.read_text()) != json.loads(json.dumps(spec, default=str)):
            raise UsageError(
                f"--out {out} holds a different study; choose another --out (or repeat that study's flags)"
            )
        if not study.resume:
            raise UsageError(
                f"--out {out} already holds this study; pass --resume to finish it or choose another --out"
            )
    # One study process at a time in --out: a second one would restart the first one's running point.
    with run_dir_lock(out, fresh=False, option="--out"):
        write_json(spec_file, spec)
        if on_start:
            on_start()

        for workload, workers, repeat, cfg in points:
            run = RunDir(Path(cfg["run_dir"]))
            if run.summary.exists() and _finished(run.summary_record()):
                continue
            if run.path.exists():
                shutil.rmtree(run.path)  # an interrupted point starts over: its timing is incomplete
            try:
                summary = launch_script(cfg) if study.script else train(cfg)
            except KeyboardInterrupt:
                # Ctrl-C: a point is timed whole, so an interrupted one starts over rather than resumes.
                raise Interrupted(
                    f"interrupted during {run.path.name}; the points that finished are kept: the same command "
                    "with --resume runs the rest"
                ) from None
            if study.script and summary["status"] != "completed":
                raise RunFailed(f"{run.path.name}: {summary['error']}")
            if study.script and summary.get("samples_per_s") is None:
                raise UsageError(
                    f"--script {study.script.name} reported no throughput (see {run.path / 'reports'}); call "
                    "paratrain.report(samples_per_s=...) in it, or paratrain.report(samples=N, epoch_time_s=T) "
                    "once per epoch (N: samples of one epoch over all ranks)"
                )
            if on_point:
                on_point(workload, workers, repeat, summary)

        result = study_result(study, [RunDir(Path(cfg["run_dir"])) for *_, cfg in points])
        write_json(out / SCALING_FILE, result)
        return result


def study_result(study: ScaleConfig, runs: list[RunDir]) -> dict[str, Any]:
    """What scaling.json holds: the study's table computed from its run directories."""
    return checked(
        Study,
        {
            "mode": study.mode,
            "workload": study.workload,
            "repeats": study.repeats,
            "timing": (
                "samples/s is what the script reported (else what the probe measured); "
                "speedup = samples/s(N) / samples/s(base) x base, "
                "efficiency = speedup / N; speedup_vs_all_cores = samples/s(N) / samples/s(one process on all cores)"
                if study.script
                else "epoch time is the median over the epochs after the first of each run; "
                "speedup = T(base) / T(N) x base, efficiency = speedup / N; "
                "speedup_vs_all_cores = T(one process on all cores) / T(N)"
            ),
            "cpu_worker": "one worker = one rank with its own core(s), playing the role of a GPU",
            "flag_rules": {
                "contended": f"in n of the m runs, other work took over {CONTENDED_ABOVE:.0%} of the run's cores "
                "(summary.json machine_load.other_fraction)",
                "repeats_disagree": f"the repeats' samples/s differ by more than x{SPREAD_LIMIT} "
                "(fastest / slowest = R)",
                "includes_startup": "a run had a single epoch, so its time and samples/s include start-up",
                **(
                    {
                        "unsynchronised": "the probe saw the ranks of a run never synchronise (no DDP or FSDP, no "
                        "collective after the first step): N independent copies, whose samples/s add up without "
                        "training one model faster, so the ratio is no speedup (summary.json probe.synchronised)"
                    }
                    if study.script
                    else {}
                ),
            },
            **({"strategy": study.strategy} if study.strategy else {}),
            "rows": scaling_rows(runs, study.strategy),
        },
    )


def collect_study(out: Path) -> dict[str, Any]:
    """Write OUT/scaling.json from the points that have finished so far, running nothing.

    A study whose points ran as separate jobs (`paratrain slurm scale`) is collected this way:
    `paratrain report OUT` calls it, so the report shows every point finished by then.
    """
    spec = json.loads((out / "study.json").read_text())
    study = validate(ScaleConfig, {k: v for k, v in spec.items() if k in ScaleConfig.model_fields} | {"out": out})
    on_cpu = spec["train"].get("device") == "cpu"
    runs = [RunDir(Path(cfg["run_dir"])) for *_, cfg in study_points(study, on_cpu)]
    finished = [run for run in runs if run.summary.exists() and _finished(run.summary_record())]
    if not finished:
        raise UsageError(
            f"no point of the study in {out} has finished yet (see its jobs' logs in {out / 'slurm' / 'logs'}); "
            "run paratrain report again once one has"
        )
    result = study_result(study, finished)
    write_json(out / SCALING_FILE, result)
    return result


def unsynchronised(summary: Summary) -> bool:
    """A launched script's ranks that never synchronised, as its probe saw them (launch/probe_summary.py)."""
    return (summary.probe or {}).get("synchronised") is False


def _finished(summary: Summary) -> bool:
    return summary.status == "completed" and summary.samples_per_s is not None


def is_all_cores_reference(config: dict[str, Any]) -> bool:
    """One CPU process with the default threads (every core): what `paratrain train --workers 1` runs."""
    return (
        config.get("workers") == 1
        and config.get("resolved", {}).get("device") == "cpu"
        and config.get("threads_per_worker", 1) is None
    )


def _axis_strategy(summary: Summary, strategies: list[str]) -> str:
    """The entry of the strategy axis a run belongs to: its strategy, or hsdp for fsdp whose shards are replicated
    when hsdp is on the axis (the preset runs as fsdp --dp-replicate R, and its summary says fsdp)."""
    replicated = summary.strategy == "fsdp" and (summary.layout or {}).get("dp_replicate", 1) > 1
    return "hsdp" if replicated and "hsdp" in strategies else summary.strategy


def scaling_rows(runs: list[RunDir], strategies: list[str] = ()) -> list[dict[str, Any]]:
    """The study table from run directories: one row per (workload, workers), medians over repeats,
    then, on CPU, the all-cores reference row of each workload.

    With a strategy axis, each strategy is a line of its own ("gpt-small · fsdp", `strategy` in
    its rows) and each line starts from the workload's 1-worker run and ends with its reference,
    so tables and plots compare the strategies against the same base."""
    groups: dict[tuple[str, str, int, bool], list[tuple[RunDir, dict, Summary]]] = {}
    for run in runs:
        summary = run.summary_record()
        if not _finished(summary):
            continue
        config = run.read_config()
        strategy = _axis_strategy(summary, strategies) if strategies and summary.workers > 1 else ""
        groups.setdefault(
            (workload_label(config, summary), strategy, summary.workers, is_all_cores_reference(config)), []
        ).append((run, config, summary))

    rows = []
    for workload in dict.fromkeys(w for w, *_ in groups):
        mine = {(s, n, ref): members for (w, s, n, ref), members in groups.items() if w == workload}
        reference = mine.get(("", 1, True))
        smallest = min((n for s, n, ref in mine if not ref), default=None)
        base = mine[("", smallest, False)] if smallest is not None and ("", smallest, False) in mine else reference
        # An epoch of a built-in workload is the same dataset at every point; a script's epoch may
        # grow with the workers (each rank doing its own steps), so a script is compared by samples/s.
        by_rate = bool(base[0][1].get("script"))
        for strategy in [s for s in strategies if any(k[0] == s for k in mine)] or [""]:
            label = f"{workload} · {strategy}" if strategy else None
            counts = sorted(n for s, n, ref in mine if not ref and (s == strategy or (s == "" and n == smallest)))
            rows += [
                _row(
                    mine[(strategy if (strategy, n, False) in mine else "", n, False)], base, reference, by_rate, label
                )
                for n in counts
            ]
            if reference:
                rows.append(_row(reference, base, reference, by_rate, label))
    return rows


def workload_label(config: dict[str, Any], summary: Summary) -> str:
    """The name a row goes by: the workload's, or, when --model or --dataset replaced half of it,
    what was actually trained (a user's model is not "cifar10-cnn")."""
    if config.get("script"):
        return Path(config["script"]).name
    if not (config.get("model") or config.get("dataset")):
        return config["workload"]
    return f"{summary.model or config.get('model')} on {summary.dataset or config.get('dataset')}"


def _threads(config: dict[str, Any]) -> int:
    return config.get("resolved", {}).get("threads_per_worker") or config.get("threads_per_worker") or 1


def _row(
    members: list[tuple[RunDir, dict, Summary]],
    base: list[tuple[RunDir, dict, Summary]],
    reference: list[tuple[RunDir, dict, Summary]] | None,
    by_rate: bool,
    label: str | None = None,
) -> dict[str, Any]:
    run, config, first = members[0]
    summaries = [s for _, _, s in members]
    n, threads = first.workers, _threads(config)

    def seconds(summary: Summary) -> float:
        """The time of a fixed amount of work: an epoch, or (by_rate) one sample."""
        return 1.0 / summary.samples_per_s if by_rate else steady_epoch_time(summary.epoch_times_s)

    times = [seconds(s) for s in summaries]
    rates = [s.samples_per_s for s in summaries]
    work_time = statistics.median(times)
    # a script that reports samples/s only has no epoch times
    timed = all(s.epoch_times_s for s in summaries)
    epochs = [steady_epoch_time(s.epoch_times_s) for s in summaries] if timed else None
    # Speedup in units of the base point's workers: T(base)/T x base; efficiency per base-worker's
    # worth of cores, which for the study's own points (same threads each) is speedup / N.
    base_n, base_threads = base[0][2].workers, _threads(base[0][1])
    base_time = statistics.median(seconds(s) for _, _, s in base)
    speedup = base_time / work_time * base_n
    ref_time = statistics.median(seconds(s) for _, _, s in reference) if reference else None
    contended = sum(s.contended for s in summaries)
    spread = max(rates) / min(rates)
    flags = [
        name
        for name, raised in (
            ("contended", contended > 0),
            ("repeats_disagree", spread > SPREAD_LIMIT),
            ("includes_startup", epochs is not None and any(len(s.epoch_times_s) < 2 for s in summaries)),
            ("unsynchronised", any(unsynchronised(s) for s in summaries)),
        )
        if raised
    ]
    return {
        "workload": label or workload_label(config, first),
        "strategy": first.strategy,
        "workers": n,
        "threads_per_worker": threads,
        "point": ALL_CORES if is_all_cores_reference(config) else "scaling",
        "global_batch_size": first.global_batch_size,
        "batch_size": first.batch_size,
        "lr": first.lr,
        "epoch_time_s": statistics.median(epochs) if epochs else None,
        "epoch_time_s_range": [min(epochs), max(epochs)] if epochs else None,
        "samples_per_s": statistics.median(rates),
        "samples_per_s_range": [min(rates), max(rates)],
        # sequence workloads: the same throughput in tokens; every run: model FLOPs utilisation
        "tokens_per_s": statistics.median(s.tokens_per_s for s in summaries)
        if first.tokens_per_s is not None
        else None,
        "mfu": statistics.median(s.mfu for s in summaries) if all(s.mfu is not None for s in summaries) else None,
        "speedup_basis": "samples_per_s" if by_rate else "epoch_time_s",
        "speedup": speedup,
        "speedup_range": [base_time / max(times) * base_n, base_time / min(times) * base_n],
        "efficiency": speedup / (n * threads / base_threads),
        "speedup_vs_all_cores": ref_time / work_time if ref_time else None,
        "speedup_vs_all_cores_range": [ref_time / max(times), ref_time / min(times)] if ref_time else None,
        "val_accuracy": statistics.median(s.val_accuracy for s in summaries)
        if all(s.val_accuracy is not None for s in summaries)
        else None,
        "val_split": first.val_split or "test",  # what val_accuracy was measured on
        "repeats": len(members),
        "repeat_spread": spread,
        "contended_runs": contended,
        "flags": flags,
        "run_dir": str(run.path),
        "run_dirs": [str(r.path) for r, _, _ in members],
        "breakdown": _median_breakdown(summaries),
    }


def _median_breakdown(summaries: list[Summary]) -> dict[str, float] | None:
    """Each phase's median over the repeats that timed it (an older summary may lack a phase)."""
    timed = [s.breakdown.model_dump(exclude_none=True) for s in summaries if s.breakdown is not None]
    if not timed:
        return None
    return {k: statistics.median(t[k] for t in timed if k in t) for k in dict.fromkeys(k for t in timed for k in t)}
