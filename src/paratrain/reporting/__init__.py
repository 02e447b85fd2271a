"""One self-contained HTML page for a run, a scaling study or a comparison of runs.

Plots are PNGs embedded as data URIs, styles are inline: the page opens from disk, from an e-mail
attachment or a CI artifact, and never fetches anything.
"""

from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.formatting import human, significant
from paratrain.reporting.comparison import MEMORY_FIGURES, comparison_rows, comparison_table, held_out_split
from paratrain.reporting.verdict import (
    cannot_tell,
    comparison_verdict,
    cores_text,
    doctor_html,
    run_verdict,
    study_points,
    study_verdict,
    sweep_verdict,
    verdict_html,
    workers_what,
)
from paratrain.runs import SCALING_FILE, SWEEP_FILE, RunDir
from paratrain.runs.records import (
    Memory,
    ParetoFront,
    Plan,
    PlanRow,
    PlanSearch,
    ScalingRow,
    Study,
    Summary,
    SweepResult,
    Trial,
    load_record,
)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1220px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; height: auto; margin: 0.5em 0; }
.plots { display: flex; flex-wrap: wrap; gap: 0.5em; align-items: flex-start; }
.plots img { max-width: calc(50% - 0.25em); } .wide img { max-width: 100%; } .note { color: #555; font-size: 0.9em; }
#verdict { border-left: 4px solid #3a7; padding: 0.2em 1em; margin: 1em 0; background: #f6fbf8; }
.headline { font-size: 1.15em; font-weight: bold; margin: 0.4em 0; } .findings li { margin: 0.5em 0; }
code { background: #f3f3f3; padding: 0 0.2em; font-size: 0.9em; }
"""


def kind_of(path: Path) -> str:
    if (path / SCALING_FILE).is_file():
        return "study"
    if (path / SWEEP_FILE).is_file():
        return "sweep"
    if any((path / name).is_file() for name in BATCH_FILES.values()):
        return "batch"
    if RunDir(path).is_run():
        return "run"
    if (path / PLAN_FILE).is_file():
        return "plan"
    raise UsageError(
        f"{path} is not a paratrain run (config.json), scaling study (scaling.json) or sweep (sweep.json), "
        "nor a plan (plan.json)"
    )


def _scheduled_study(path: Path) -> bool:
    """A study written by `paratrain slurm scale`: its study.json says so."""
    spec = path / "study.json"
    return spec.is_file() and json.loads(spec.read_text()).get("scheduler") == "slurm"


def write_report(paths: Sequence[Path], out: Path | None = None) -> Path:
    """Write the report for `paths` (one study, one run, or several runs to compare); return its path."""
    if not paths:
        raise UsageError("give at least one run or study directory")
    for path in paths:
        if _scheduled_study(Path(path)):
            from paratrain.scale import collect_study

            collect_study(Path(path))  # its points ran as separate jobs: the table is built from what has finished
    kinds = [kind_of(Path(p)) for p in paths]
    if len(paths) == 1:
        out = out or Path(paths[0]) / "report.html"
        body = {"study": _study_body, "sweep": _sweep_body, "plan": _plan_body, "batch": _batch_body}.get(
            kinds[0], lambda p: _run_body(RunDir(p))
        )(Path(paths[0]))
        title = f"paratrain {kinds[0]}: {Path(paths[0]).name}"
    else:
        if set(kinds) != {"run"}:
            raise UsageError("compare run directories, not studies or sweeps: pass their runs' directories")
        out = out or Path("comparison-report.html")
        body = _compare_body([RunDir(Path(p)) for p in paths])
        title = f"paratrain comparison of {len(paths)} runs"
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(page)
    os.replace(tmp, out)
    return out


# -- pieces ------------------------------------------------------------------------------------

# paratrain find-batch / noise-scale / lr-find / recommend --out DIR (the batch package's RESULT_FILEs)
BATCH_FILES = {
    "find_batch": "find_batch.json",
    "noise_scale": "noise_scale.json",
    "lr_find": "lr_find.json",
    "recommend": "recommend.json",
}


def _batch_body(path: Path) -> str:
    """The batch-size measurements in one directory: the recommendation if any, the headline figures, the plots."""
    from paratrain.reporting.plots import batch_plots

    results = {
        key: json.loads((path / name).read_text()) for key, name in BATCH_FILES.items() if (path / name).is_file()
    }
    lines = []
    if "recommend" in results:
        r = results["recommend"]
        lines += [
            f"{key.replace('_', ' ')}: {r[key]['value']:.4g} ({r[key]['source']})"
            if isinstance(r[key]["value"], float)
            else f"{key.replace('_', ' ')}: {r[key]['value']} ({r[key]['source']})"
            for key in (
                "per_worker_batch",
                "global_batch",
                "lr",
                "warmup_epochs",
                "schedule",
                "batch_schedule",
                "optimizer",
            )
            if key in r  # batch_schedule: not in a recommend.json of an earlier release
        ]
        lines += [f"note: {note}" for note in r["notes"]]
    if "find_batch" in results:
        f = results["find_batch"]
        lines.append(
            f"find-batch: largest batch that fits {f['max_batch']} (limited by {f['limited_by']}), "
            f"{f['safe_batch']} with the {f['margin']:.0%} margin; knee {f['knee_batch']}"
        )
    if "noise_scale" in results and results["noise_scale"]["b_simple"] is not None:
        n = results["noise_scale"]
        lines.append(
            f"noise scale B_simple {n['b_simple']:,.1f} ± {n['b_simple_stderr']:,.1f} after {n['steps']} steps"
        )
    if "lr_find" in results:
        lines.append(
            f"lr-find: suggested LR {results['lr_find']['suggested_lr']:.3g} at global batch "
            f"{results['lr_find']['global_batch_size']}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        images = "".join(_img(p, name) for name, p in batch_plots(results, Path(tmp)).items())
    return (
        "<div id='verdict'>" + "".join(f"<p>{html.escape(line)}</p>" for line in lines) + "</div>"
        f"<div class='plots'>{images}</div>"
    )


PLAN_FILE = "plan.json"  # paratrain plan --out DIR (plan.PLAN_FILE)
PLAN_PLOTS = ("plan_scaling.png", "plan_memory.png", "plan_pareto.png")


def plan_table(plan: Plan) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The plan's columns and cells, as the page and the terminal both show them: predicted rates to
    three significant figures, and tokens/s beside samples/s for a model of token sequences."""
    tokens = plan.model.tokens_per_sample
    columns = (
        "devices",
        "strategy",
        "layout",
        "global batch",
        "step time",
        "samples/s",
        *(("tokens/s",) if tokens else ()),
        "speedup",
        "efficiency",
        "memory/device",
        "fits",
    )
    cells = [
        (
            str(r.devices),
            r.strategy,
            _plan_layout(r),
            str(r.global_batch),
            f"{significant(r.step_time_s * 1e3)} ms",
            significant(r.samples_per_s),
            *((significant(r.samples_per_s * tokens),) if tokens else ()),
            f"{r.speedup:.2f}",
            f"{r.efficiency:.2f}",
            human("rss_peak_bytes", r.memory_per_device_bytes),
            "yes" if r.fits else "no",
        )
        for r in plan.rows
    ]
    return columns, cells


def _plan_layout(row: PlanRow) -> str:
    """A row's layout as its table cell: stages and micro-batches, or replicas (HSDP's replicas of shards)."""
    split = f" x tp {row.tp}" if row.tp > 1 else ""
    mesh = row.layout or {}
    if row.stages > 1:
        return f"{row.data_parallel} x {row.stages} stages{split}, M={row.microbatches}"
    if mesh.get("dp_replicate", 1) > 1 and mesh.get("dp_shard", 1) > 1:
        return f"{mesh['dp_replicate']} x {mesh['dp_shard']} shards{split}"
    if mesh.get("dp_shard", 1) > 1:  # fsdp: the data-parallel ranks hold shards of one model, not replicas
        return f"{mesh['dp_shard']} shards{split}"
    return f"{row.data_parallel} {'replica' if row.data_parallel == 1 else 'replicas'}{split}"


def _plan_body(path: Path) -> str:
    """The plan's recommendation, its table and its three plots (written beside plan.json by plan_plots)."""
    plan = load_record(Plan, path / PLAN_FILE, "plan")
    rec, model, device = plan.recommendation, plan.model, plan.device
    plots = "".join(_img(path / name, name) for name in PLAN_PLOTS if (path / name).is_file())
    return (
        f"<div id='verdict'><p class='headline'>{html.escape(str(rec.strategy))} on {rec.devices} device(s)</p>"
        f"<p>{html.escape(rec.reason or '')}</p></div>"
        + _searched(plan.search)
        + f"<p class='note'>{html.escape(model.name)}: {model.params:,} parameters, "
        f"{model.flops_per_sample:.3g} FLOPs per sample; {html.escape(device.name)} {device.precision}, "
        f"efficiency {device.efficiency:.3f} ({html.escape(device.efficiency_source)})</p>"
        + _table(*plan_table(plan))
        + f"<div class='plots'>{plots}</div>"
    )


def _searched(found: PlanSearch | None) -> str:
    """plan --search's pick on the page, as the terminal prints it."""
    if found is None:
        return ""
    pick = found.best["description"] if found.best else "nothing fits"
    return f"<p><b>search on {found.devices} devices: {html.escape(pick)}</b>. {html.escape(found.why)}</p>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'>"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], table_id: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    ident = f" id='{table_id}'" if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else human("", value)


def _config_table(config: dict[str, Any]) -> str:
    """config.json as a run's page shows it: the options the run set and what the launcher resolved,
    then, folded, the options it left at their defaults (a run that never compressed gradients lists
    powersgd_rank there, not beside its own choices)."""
    from paratrain.config import LaunchConfig, TrainConfig

    model = LaunchConfig if "script" in config else TrainConfig  # a launched script's run, or paratrain's loop
    defaults = model.model_construct().model_dump(mode="json", warnings=False)
    options = {k: v for k, v in config.items() if k != "resolved"}
    left = {k: v for k, v in options.items() if k in defaults and v == defaults[k]}
    chosen = [(k, human(k, v)) for k, v in options.items() if k not in left]
    resolved = [(k, human(k, v)) for k, v in config.get("resolved", {}).items()]
    return (
        _table(("option", "value"), chosen + resolved, "config")
        + f"<details><summary>{len(left)} options at their defaults</summary>"
        + _table(("option", "default"), [(k, human(k, v)) for k, v in left.items()], "defaults")
        + "</details>"
    )


def _with_plots(render) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return render(Path(tmp))


# -- a scaling study's table, headline and notes: shared by the terminal and the HTML page ---------

STUDY_COLUMNS = (
    "workload",
    "workers",
    "threads",
    "global batch",
    "epoch time (s)",
    "samples/s",
    "speedup",
    "vs all cores",
    "efficiency",
    "{split} acc",
    "runs",
    "flags",
)
ALL_CORES_POINT = "all_cores_reference"  # scaling.json's `point` of the one-process-on-all-cores row (scale.ALL_CORES)


def _spread(value: float, span: Sequence[float], fmt: str, repeats: int) -> str:
    """`value (min-max)` over repeats (the range on a line of its own in a terminal, after a space in
    HTML); a single run has no spread to show."""
    return format(value, fmt) if repeats < 2 else f"{value:{fmt}}\n({span[0]:{fmt}}–{span[1]:{fmt}})"


# How each flag of a row reads in a table, and the name its rule goes by in the notes.
_FLAG_WORDS = {
    "contended": ("contended {contended_runs}/{repeats}", "contended n/m"),
    "repeats_disagree": ("spread x{repeat_spread:.2f}", "spread xR"),
    "includes_startup": ("incl. start-up", "incl. start-up"),
}


def _flag_text(row: ScalingRow) -> str:
    return ",\n".join(_FLAG_WORDS[f][0].format(**row.model_dump()) if f in _FLAG_WORDS else f for f in row.flags)


def _spread_of(row: ScalingRow, value: float, span: list[float] | None, fmt: str) -> str:
    return _spread(value, span or [value, value], fmt, row.repeats or 1)


def study_table(result: Study) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The columns and the formatted cells of a study's table (scaling.json rows)."""
    cells = []
    for r in result.rows:
        reference = r.point == ALL_CORES_POINT
        vs_all = r.speedup_vs_all_cores
        # A studied script reports what it measures: epoch time, global batch or accuracy may be missing.
        cells.append(
            (
                r.workload,
                f"{r.workers}{' (all cores)' if reference else ''}",
                cores_text(r),
                str(r.global_batch_size or "-"),
                "-" if r.epoch_time_s is None else _spread_of(r, r.epoch_time_s, r.epoch_time_s_range, ".2f"),
                _spread_of(r, r.samples_per_s, r.samples_per_s_range, ",.0f")
                + (f"\n{r.tokens_per_s:,.0f} tokens/s" if r.tokens_per_s else ""),
                f"{r.speedup:.2f}",
                "-" if vs_all is None else f"{vs_all:.2f}",
                f"{r.efficiency:.2f}",
                "-" if r.val_accuracy is None else f"{r.val_accuracy:.2%}",
                str(r.repeats),
                _flag_text(r),
            )
        )
    splits = {r.val_split or "test" for r in result.rows}
    split = splits.pop() if len(splits) == 1 else "val/test"
    return tuple(c.format(split=split) for c in STUDY_COLUMNS), cells


def study_headline(result: Study) -> list[str]:
    """Per workload, the comparison a user faces: the most workers against one process on all cores.
    When the verdict cannot tell (a contended row, comparisons that disagree), neither can the
    headline: it gives the verdict's reason, the clean comparison and the rerun, not a speedup."""
    lines = []
    for workload, base, top, reference in study_points(result):
        who = workers_what(top)
        against_all = (
            f" against one process on all {cores_text(reference)} cores (what 'paratrain train --workers 1' runs)"
            if reference
            else ""
        )
        flagged = [
            f"{r.workers}{' all cores' if r is reference else ''}: {_flag_text(r).replace(chr(10), ' ')}"
            for r in (top, reference)
            if r and r.flags
        ]
        undecided = cannot_tell(base, top, reference) if top is not base or reference else None
        if undecided:
            lines.append(
                f"{workload}: {who}{against_all}: {undecided}"
                + (f". Flagged ({'; '.join(flagged)})." if flagged else ".")
            )
            continue
        per_core = f"speedup {top.speedup:.2f} and efficiency {top.efficiency:.2f} against {workers_what(base)}"
        if reference:
            measured = (
                f"epoch {top.epoch_time_s:.2f} s against {reference.epoch_time_s:.2f} s"
                if (top.speedup_basis or "epoch_time_s") == "epoch_time_s"
                else f"{top.samples_per_s:,.0f} against {reference.samples_per_s:,.0f} samples/s"
            )
            line = f"{workload}: {who}{against_all}: speedup {top.speedup_vs_all_cores:.2f} ({measured}); {per_core}"
        else:
            line = f"{workload}: {who}: {per_core}"
        lines.append(line + (f". Flagged ({'; '.join(flagged)}): read with care." if flagged else "."))
    return lines


def study_notes(result: Study) -> list[str]:
    """What the brackets and the flags mean, with the thresholds used."""
    notes = [
        "epoch time and samples/s: median over repeats, (min–max) when there is more than one run; "
        "threads: cores per worker; vs all cores: speedup against one process on all cores (workers '1 (all cores)')"
    ]
    if any((r.repeats or 1) < 2 for r in result.rows):
        notes.append("rows with one run show no spread: --repeats 3 measures the noise")
    notes += [f"{_FLAG_WORDS.get(name, (name, name))[1]}: {rule}" for name, rule in result.flag_rules.items()]
    return notes


def _study_body(path: Path) -> str:
    from paratrain.reporting.plots import breakdown_plot, study_plots

    result = load_record(Study, path / SCALING_FILE, "scaling study")

    def render(tmp: Path) -> str:
        plots = study_plots(result, tmp)
        timed = [r for r in result.rows if r.breakdown]  # a studied script has no step breakdown
        labels = [f"{r.workload} w{r.workers}{' all cores' if r.point == ALL_CORES_POINT else ''}" for r in timed]
        bd = breakdown_plot([r.breakdown for r in timed], labels, tmp / "breakdown.png") if timed else None
        table = _table(*study_table(result), "scaling")
        headline = (
            "<div id='headline'>"
            + "".join(f"<p><b>{html.escape(line)}</b></p>" for line in study_headline(result))
            + "</div>"
        )
        notes = "<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in study_notes(result)) + "</ul>"
        images = "".join(_img(p, name) for name, p in plots.items())
        spec = json.loads((path / "study.json").read_text()) if (path / "study.json").exists() else {}
        return (
            verdict_html(study_verdict(result), doctor_html(path))
            + f"{headline}<p class='note'>{html.escape(result.mode)} scaling. "
            f"{html.escape(result.timing or '')}. "
            f"{html.escape(result.cpu_worker or '')}.</p>{table}{notes}<h2>Plots</h2><div "
            f"class='plots'>{images}</div>"
            + (f"<h2>Step-time breakdown</h2>{_img(bd, 'breakdown')}" if bd else "")
            + f"<h2>Study</h2>{_table(('option', 'value'), [(k, human(k, v)) for k, v in spec.items()])}"
        )

    return _with_plots(render)


# -- a sweep's notes: shared by the terminal and the HTML page -------------------------------------

_SAMPLERS = {
    "grid": "grid (every combination in turn)",
    "random": "random (seeded draws from each parameter's prior)",
    "tpe": "tpe (Optuna's TPESampler)",
    "gp": "gp (Optuna's GPSampler)",
    "nsga2": "nsga2 (Optuna's NSGAIISampler)",
}


def sweep_notes(result: SweepResult) -> list[str]:
    """The sampler, the split each metric is measured on, whether -j paid off, and why a sweep
    stopped before its budget."""
    sampler = result.sampler or result.space.get("sampler", "?")
    notes = [f"{result.algorithm} search, sampler: {_SAMPLERS.get(sampler, sampler)}"]
    if result.mode == "builtin":
        split = result.val_split
        if split:
            notes.append(
                f"val_* metrics: on a validation split of {split:.0%} of the training set (stratified), which the "
                "sweep chooses on; test_accuracy: on the test split, shown, never optimised"
            )
        elif split is not None:
            notes.append(
                "no validation split (--val-split 0): the val_* metrics would be the test split's and are not "
                "recorded; test_accuracy is on the test split"
            )
    par = result.parallelism
    if par and par.speedup:
        notes.append(
            f"parallel speedup: {par.speedup:.2f}x (sum of trial times {par.trial_time_s:.1f} s in "
            f"{par.wall_time_s:.1f} s of wall time)"
        )
    for limit, value in (result.stopped_by or {}).items():
        done = result.counts.get("COMPLETE", 0) + result.counts.get("PRUNED", 0)
        notes.append(
            f"stopped starting trials: --{limit.replace('_', '-')} {value:g} reached; {done} of {result.items} "
            "planned trial(s) finished; rerun the command to continue"
        )
    return notes


def _sweep_body(path: Path) -> str:
    from paratrain.reporting.plots import sweep_plots

    result = load_record(SweepResult, path / SWEEP_FILE, "sweep")
    metrics = result.metric
    shown = result.recorded_metrics or [*metrics, "time_s"]

    def fmt_params(params: dict[str, Any]) -> str:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())

    def cells(t: Trial) -> tuple[Any, ...]:
        return (t.number, fmt_params(t.params), *[human(m, t.metrics.get(m)) for m in shown])

    def render(tmp: Path) -> str:
        plots = sweep_plots(result, tmp)
        rows = [(*cells(t), t.state.lower(), t.reason or "") for t in result.trials]
        table = _table(("trial", "params", *shown, "state", "reason"), rows, "trials")
        best = result.best
        front = best.pareto_front if isinstance(best, ParetoFront) else [best] if best else []
        best_html = _table(("trial", "params", *shown), [cells(t) for t in front], "best")
        best_title = "Pareto front" if isinstance(best, ParetoFront) else "Best trial"
        counts = ", ".join(f"{n} {s.lower()}" for s, n in result.counts.items() if n)
        # Multi-panel figures (one per searched parameter; a heatmap per objective) get the page's
        # width; single plots share rows, two a row.
        panels = {name for name in plots if name.startswith("by-") or (name == "heatmap" and len(metrics) > 1)}
        wide = "".join(_img(p, name) for name, p in plots.items() if name in panels)
        images = "".join(_img(p, name) for name, p in plots.items() if name not in panels)
        return (
            verdict_html(sweep_verdict(result), doctor_html(path))
            + f"<p class='note'>{html.escape(str(result.algorithm))} search, {result.items} trial(s) planned: "
            f"{html.escape(counts)}. Objective: "
            f"{html.escape(', '.join(f'{m} ({o})' for m, o in zip(metrics, result.objective)))}.</p>"
            "<ul class='note' id='notes'>"
            + "".join(f"<li>{html.escape(n)}</li>" for n in sweep_notes(result))
            + "</ul>"
            f"<h2>{best_title}</h2>{best_html}<h2>Trials</h2>{table}<h2>Plots</h2><div class='wide'>{wide}</div>"
            f"<div class='plots'>{images}</div>"
            f"<h2>Search space</h2>{_table(('setting', 'value'), [(k, human(k, v)) for k, v in result.space.items()])}"
        )

    return _with_plots(render)


# What a run measured on its validation split: with none (`val_split` "test"), summary.json's val_*
# figures are the test split's, which the test_* rows show.
_VALIDATION_KEYS = ("val_loss", "val_bits_per_byte", "val_accuracy")


def _summary_rows(summary: Summary | None) -> list[tuple[str, Any]]:
    if summary is None:
        return [("status", "running or interrupted")]
    splits_not_held = _VALIDATION_KEYS if summary.val_split == "test" else ()
    keys = (
        "status",
        "workers",
        "strategy",
        "global_batch_size",
        "lr",
        "epochs",
        "epoch_time_s",
        "samples_per_s",
        "tokens_per_s",
        "flops_per_sample",
        "mfu",
        "bubble_fraction",
        "bubble_fraction_theory",
        "train_loss",
        "val_loss",
        "val_bits_per_byte",
        "val_accuracy",
        "test_loss",
        "test_bits_per_byte",
        "test_accuracy",
        "wall_time_s",
    )
    return [
        (k, human(k, getattr(summary, k))) for k in keys if getattr(summary, k) is not None and k not in splits_not_held
    ]


def _run_body(run: RunDir) -> str:
    from paratrain.doctor import idle_fractions
    from paratrain.doctor.evidence import read_run
    from paratrain.reporting.plots import batch_plot, breakdown_plot, curves_plots, monitor_plot

    evidence = read_run(run.path)
    summary = evidence.summary

    def render(tmp: Path) -> str:
        parts = [
            verdict_html(run_verdict(summary, evidence.config), doctor_html(run.path)),
            "<h2>Summary</h2>" + _table(("metric", "value"), _summary_rows(summary), "summary"),
        ]
        timeline = monitor_plot(evidence, tmp / "monitor.png")
        if timeline:
            idle = idle_fractions(evidence)
            parts.append(
                f"<h2>Devices over time</h2><div class='wide'>{_img(timeline, 'monitor timelines')}</div>"
                f"<p class='note' id='idle'>idle share of the monitor's samples (a rank below 10 % of a core, "
                f"a GPU below 10 % utilisation): {html.escape(', '.join(f'{d} {f:.0%}' for d, f in idle.items()))}</p>"
            )
        if evidence.epochs:
            curves = curves_plots([run], [run.path.name], tmp, "run-")
            parts.append(
                "<h2>Curves</h2><div class='wide'>" + "".join(_img(p, n) for n, p in curves.items()) + "</div>"
            )
        if summary and summary.batch_schedule:
            start = summary.batch_schedule["start_global_batch"]
            plot = batch_plot(evidence.events, start, tmp / "batch.png")
            parts.append(f"<h2>Global batch</h2>{_img(plot, 'batch schedule')}")
        if summary and summary.memory:
            parts.append(_memory_table(summary.memory))
        if summary and summary.breakdown:
            plot = breakdown_plot([summary.breakdown.model_dump()], [run.path.name], tmp / "bd.png")
            parts.append(f"<h2>Step-time breakdown</h2>{_img(plot, 'breakdown')}")
        parts.append(f"<h2>Configuration</h2>{_config_table(run.read_config())}")
        return "".join(parts)

    return _with_plots(render)


def _memory_table(memory: Memory) -> str:
    figures = {k: getattr(memory, k) for k in MEMORY_FIGURES}
    ranks = max(map(len, figures.values()))
    if not ranks:
        return ""
    rows = [
        (f"rank {r}", *(human(k, figures[k][r]) if figures[k] else "-" for k in MEMORY_FIGURES)) for r in range(ranks)
    ]
    return (
        "<h2>Memory per rank</h2>"
        + _table(
            ("rank", "parameters", "gradients", "optimizer state", "activations (peak)", "peak RSS"), rows, "memory"
        )
        + "<p class='note'>parameters, gradients and optimizer state: the tensors each rank holds (its shards under "
        "zero1 and fsdp, its stage under pipeline); activations: the peak of tensors saved for backward in one "
        "step; peak RSS: the whole process.</p>"
    )


def _breakdown(run: RunDir) -> dict[str, float | None]:
    breakdown = run.summary_record().breakdown
    return breakdown.model_dump() if breakdown else {}


def _compare_body(runs: list[RunDir]) -> str:
    from paratrain.reporting.plots import breakdown_plot, curves_plots

    rows = comparison_rows(runs)
    labels = [r.path.name for r in runs]

    def render(tmp: Path) -> str:
        curves = curves_plots(runs, labels, tmp, "cmp-")
        bd = breakdown_plot([_breakdown(r) for r in runs], labels, tmp / "bd.png")
        table = _table(*comparison_table(rows, held_out_split(runs)), "comparison")
        table += (
            "<p class='note'>memory: the largest rank's; model state = parameters + gradients + optimizer state "
            "(what zero1 and fsdp shard).</p>"
        )
        doctors = "".join(f"<h3>{html.escape(r.path.name)}</h3>{doctor_html(r.path)}" for r in runs)
        return (
            verdict_html(comparison_verdict(rows))
            + f"{table}<h2>Doctor</h2>{doctors}<h2>Curves</h2><div class='wide'>"
            + "".join(_img(p, n) for n, p in curves.items())
            + f"</div><h2>Step-time breakdown</h2>{_img(bd, 'breakdown')}"
        )

    return _with_plots(render)
