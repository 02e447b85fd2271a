"""What the CLI prints: each command's result as a person reads it, tables first, then the verdict.

The same numbers as the command's JSON files and HTML page, rounded as a person would write them.
Tables are rich's; output that is not a terminal (a log, a pipe) gets whole rows, not 80 columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from paratrain.formatting import ms
from paratrain.reporting import plan_table, study_headline, study_notes, study_table, sweep_notes
from paratrain.reporting.comparison import comparison_table
from paratrain.reporting.verdict import batch_schedule_line, script_throughput
from paratrain.runs.records import Breakdown, ParetoFront, Plan, Study, Summary, SweepResult


def wide_console() -> Console:
    """rich wraps tables to 80 columns when stdout is not a terminal; logs and pipes want whole rows."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def show_train(summary: dict[str, Any]) -> None:
    s = Summary.model_validate(summary)
    table = Table(title=f"paratrain: {s.strategy} on {s.workers} worker(s)", show_header=False)
    b, accum = s.breakdown or Breakdown(), s.grad_accum or 1
    rows = [
        # Replicas, not workers: the stages of one pipeline share a batch.
        (
            "global batch",
            f"{s.global_batch_size} ({s.global_batch_size // (s.batch_size * accum)} x "
            f"{s.batch_size}{' x ' + str(accum) if accum > 1 else ''})",
        ),
        *[("batch schedule", grown) for grown in [batch_schedule_line(s.batch_schedule)] if grown],
        ("learning rate", f"{s.lr:.4g} ({s.lr_scaling} from {s.base_lr:.4g})"),
        (
            "epoch time",
            f"{s.epoch_time_s:.2f} s (median of {s.timed_epochs} epoch(s)"
            f"{', first excluded' if s.timed_epochs < s.epochs else ''})",
        ),
        (
            "throughput",
            f"{s.samples_per_s:,.0f} samples/s" + (f", {s.tokens_per_s:,.0f} tokens/s" if s.tokens_per_s else ""),
        ),
        (
            "step time",
            f"data {ms(b.data_s)}, compute {ms(b.compute_s)}, comm {ms(b.comm_s)}, optimizer {ms(b.optimizer_s)}, "
            f"other {ms(b.other_s)}",
        ),
        *[
            (
                "sent per step",
                " / ".join(f"{n / 2**10:,.0f} KiB" for n in sent) + f" per rank, through {s.allreduce}",
            )
            for sent in [s.comm_bytes_per_step]
            if sent and s.workers > 1
        ],
        *[
            (
                "pipeline",
                f"{p['stages']} stages x {p['dp']} replica(s), {p['schedule']}, {p['microbatches']} micro-batches; "
                f"bubble {'n/a' if s.bubble_fraction is None else format(s.bubble_fraction, '.1%')}"
                f" measured, {s.bubble_fraction_theory:.1%} in theory",
            )
            for p in [s.pipeline]
            if p
        ],
        ("train loss", f"{s.train_loss:.4f}"),
        (
            f"{s.val_split} accuracy",
            f"{s.val_accuracy:.2%} (loss {s.val_loss:.4f}"
            + (f", {s.val_bits_per_byte:.3f} bits/byte)" if s.val_bits_per_byte is not None else ")"),
        ),
        *(
            [
                (
                    "MFU",
                    f"{s.mfu:.1%} ({s.flops_per_sample:.3g} FLOPs/sample; peak "
                    f"{s.mfu_peak.flops_per_s / 1e9:,.0f} GFLOP/s, {s.mfu_peak.source.split(':')[0]})",
                )
            ]
            if s.mfu is not None and s.mfu_peak
            else []
        ),
        ("peak memory", ", ".join(f"{m / 2**20:.0f} MiB" for m in s.peak_memory_bytes or [] if m) + " per rank"),
        ("wall time", f"{s.wall_time_s:.1f} s"),
        *[
            (
                "other load",
                f"{load.other_fraction:.0%} of the run's cores went to other work"
                f"{' (contended: timings unreliable)' if load.contended else ''}",
            )
            for load in [s.machine_load]
            if load and load.other_fraction is not None
        ],
        ("run dir", s.run_dir),
    ]
    for key, value in rows:
        table.add_row(key, value)
    wide_console().print(table)


def show_study(study: dict[str, Any]) -> None:
    """`paratrain scale`'s result (scaling.json's contents) as the terminal table, notes and headline."""
    result = Study.model_validate(study)
    columns, rows = study_table(result)
    table = Table(title=f"{result.mode} scaling (epoch time: median, first epoch excluded)")
    for col in columns:
        table.add_column(col, justify="left" if col in ("workload", "flags") else "right")
    for row in rows:
        table.add_row(*row)
    console = wide_console()
    console.print(table)
    for line in study_notes(result):
        console.print(f"  {line}", soft_wrap=True, markup=False)
    for line in study_headline(result):
        console.print(line, soft_wrap=True, markup=False, style="bold")


def show_sweep(sweep: dict[str, Any]) -> None:
    """`paratrain sweep`'s result (sweep.json's contents): the trials, the best one and the notes."""
    from paratrain.sweep.progress import show_params

    result = SweepResult.model_validate(sweep)
    metrics = result.metric
    table = Table(title=f"sweep {result.name!r}: {', '.join(f'{m} ({o})' for m, o in zip(metrics, result.objective))}")
    shown_metrics = result.recorded_metrics
    for col in ("trial", "params", *shown_metrics, "state"):
        table.add_column(col, justify="left" if col in ("params", "state") else "right")
    for r in result.trials:
        shown = [f"{r.metrics[m]:.4g}" if m in r.metrics else "-" for m in shown_metrics]
        state = r.state.lower() + (f": {r.reason}" if r.reason and r.state != "COMPLETE" else "")
        table.add_row(str(r.number), show_params(r.params), *shown, state[:80])
    console = wide_console()
    console.print(table)
    best = result.best
    if isinstance(best, ParetoFront):
        console.print(f"Pareto front: trials {', '.join(str(r.number) for r in best.pareto_front)}")
    elif best is not None:
        console.print(f"best: trial {best.number} ({show_params(best.params)}) {metrics[0]} = {best.value:.4g}")
    for line in sweep_notes(result):
        console.print(line, soft_wrap=True, markup=False)


def show_plan(plan: dict[str, Any]) -> None:
    """`paratrain plan`'s result (plan.json's contents): the table, the recommendation, the search."""
    result = Plan.model_validate(plan)
    model, device = result.model, result.device
    table = Table(
        title=f"plan: {model.name} ({model.params:,} parameters, {model.flops_per_sample:.3g} FLOPs/sample) "
        f"on {device.name} {device.precision}, {result.optimizer}"
    )
    columns, cells = plan_table(result)
    for col in columns:
        table.add_column(col, justify="left" if col in ("strategy", "layout") else "right")
    for row in cells:
        table.add_row(*row)
    console = wide_console()
    console.print(table)
    rec = result.recommendation
    console.print(
        f"recommendation: {rec.strategy or 'none'} on {rec.devices} device(s): {rec.reason}",
        soft_wrap=True,
        markup=False,
        style="bold",
    )
    console.print(
        f"efficiency {device.efficiency:.3f} of the peak: {device.efficiency_source}",
        soft_wrap=True,
        markup=False,
    )
    found = result.search
    if found is not None:
        pick = found.best["description"] if found.best else "nothing fits"
        console.print(f"search on {found.devices} devices: {pick}", soft_wrap=True, markup=False, style="bold")
        console.print(f"  why: {found.why}", soft_wrap=True, markup=False)
        for degree, reason in found.skipped_tp.items():
            console.print(f"  tp {degree} not searched: {reason}", soft_wrap=True, markup=False)
    if result.stops_paying is not None:
        console.print(result.stops_paying.sentence, soft_wrap=True, markup=False)
    bend = result.pareto.bend_devices if result.pareto else None
    if bend:
        console.print(
            f"cost against time bends at {bend} devices: beyond it each halving of the wall time costs more "
            "device-hours",
            soft_wrap=True,
            markup=False,
        )
    console.print(f"backend: {result.backend['use']} ({result.backend['why']})", soft_wrap=True, markup=False)


def study_progress(console: Console, study: Any) -> tuple[Any, Any]:
    """scale's callbacks: a banner when the study starts, a line per finished run."""

    def banner() -> None:
        console.print(
            f"[bold]{study.mode} scaling[/] of {study.script.name if study.script else ', '.join(study.workload)} on "
            f"{study.workers} worker(s), {study.repeats} run(s) each; on CPU a worker is a rank with its own core(s), "
            "and one process on all cores is measured as the reference; the first epoch of every run is excluded "
            "from timing"
        )

    def point(workload: str, workers: int, repeat: int, summary: dict) -> None:
        s = Summary.model_validate(summary)
        # A script reports what it measures: its epoch time and accuracy may be missing.
        shown = [
            f"{s.samples_per_s:,.0f} samples/s",
            *([f"epoch {s.epoch_time_s:.2f} s"] if s.epoch_time_s is not None else []),
            *([f"accuracy {s.val_accuracy:.2%}"] if s.val_accuracy is not None else []),
            *(["contended"] if s.contended else []),
        ]
        console.print(f"  {Path(s.run_dir or '').name}: {', '.join(shown)}")

    return banner, point


def show_launch(summary: dict[str, Any]) -> None:
    s = Summary.model_validate(summary)
    reported = ", ".join(f"{k}={v:.4g}" for k, v in (s.reported or {}).items())
    throughput = (
        f"; {script_throughput(s)}" if s.samples_per_s is not None and "samples_per_s" not in (s.reported or {}) else ""
    )
    print(
        f"{s.status}: {s.workers} rank(s), {s.wall_time_s:.1f} s, exit status "
        f"{s.exit_code}{'; reported ' + reported if reported else ''}{throughput}; run dir {s.run_dir}"
    )


def show_compare(result: dict[str, Any]) -> None:
    columns, cells = comparison_table(result["rows"], result["held_out_split"])
    table = Table(title="comparison (ratios and differences against the first run)")
    for col in columns:
        table.add_column(col, justify="left" if col in ("run", "strategy") else "right", no_wrap=col == "run")
    for row in cells:
        table.add_row(*row)
    wide_console().print(table)
    for line in result["verdict"]:
        print(line)
    print(f"overlays: {result['report']}")


def show_doctor(result: dict[str, Any], verified: bool) -> None:
    if verified:
        from paratrain.doctor.verify import format_verify

        print(format_verify(result))
    else:
        from paratrain.doctor import format_text

        print(format_text(result))


def show_slurm(result: dict[str, Any]) -> None:
    for name, path in result["scripts"].items():
        job = result["job_ids"].get(name)
        print(f"{path}" + (f"  submitted: job {job}" if job else ""))
    if not result["job_ids"]:
        scripts = [p for n, p in result["scripts"].items() if n != "collect"]
        collect = result["scripts"].get("collect")
        print(
            f'submit: for s in {" ".join(scripts)}; do sbatch "$s"; done'
            + (f"; then, once they have finished, sbatch {collect}" if collect else "")
        )


def show_commbench(result: dict[str, Any]) -> None:
    for c in result["collectives"]:
        regimes = []
        for r in c["regimes"]:
            beta = f"{r['beta_bytes_per_s'] / 1e9:.2f} GB/s" if r["beta_bytes_per_s"] else "unbounded"
            if len(c["regimes"]) == 1:
                upto = ""
            else:
                upto = "larger: " if r["up_to_bytes"] is None else f"to {r['up_to_bytes'] // 1024:,}K: "
            regimes.append(f"{upto}alpha {r['alpha_s'] * 1e6:.1f} us, beta {beta}")
        print(f"{c['op']:15} {c['path']:5} worst fit error {c['max_error']:4.0%}  {'; '.join(regimes)}")
    print(f"saved: {result['path']}")


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def show_cache(result: dict[str, Any]) -> None:
    where = result["where"]
    if "removed" in result:
        gone = result["removed"]
        print(
            f"removed {len(gone)} entr{'y' if len(gone) == 1 else 'ies'}, {_mib(sum(e.size_bytes for e in gone))} "
            f"from {where}"
        )
        return
    entries = result["entries"]
    table = Table(title=f"dataset cache {where}: {len(entries)} entries, {_mib(sum(e.size_bytes for e in entries))}")
    for col in ("entry", "size", "modified"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for e in entries:
        table.add_row(e.path.name, _mib(e.size_bytes), e.modified)
    wide_console().print(table)


def show_workloads(result: dict[str, Any]) -> None:
    for name, description in result["workloads"].items():
        print(f"{name:24} {description}")
    print(
        f"\nmodels (--model): {', '.join(result['models'])}; datasets (--dataset): {', '.join(result['datasets'])}; "
        "or your own pkg.module:factory for either"
    )


def find_batch_status(status: Any) -> Any:
    """find-batch's callback: a spinner, not lines: every probe is in the table at the end, and bad
    input stays one line."""

    def on_probe(kind: str, probe: dict[str, Any]) -> None:
        if kind == "start":
            status.update(f"find-batch: probing batch {probe['batch']}")
        else:
            status.update(
                f"find-batch: batch {probe['batch']} "
                + (f"fits, {probe['samples_per_s']:,.0f} samples/s" if probe["fits"] else "ran out of memory")
            )

    return on_probe


def show_find_batch(result: dict[str, Any], saved: Path) -> None:
    table = Table(title=f"find-batch ({result['device']}, memory limit {result['memory_limit'] or 'the GPU'})")
    for col in ("batch", "fits", "samples/s", "peak memory", "activations"):
        table.add_column(col, justify="right")
    for p in result["probes"]:
        table.add_row(
            str(p["batch"]),
            "yes" if p["fits"] else "no",
            f"{p['samples_per_s']:,.0f}" if p["fits"] else "-",
            f"{p['peak_memory_bytes'] / 2**20:,.0f} MiB" if p["fits"] else "-",
            f"{p['activations_peak_bytes'] / 2**20:,.1f} MiB" if p["fits"] else "-",
        )
    wide_console().print(table)
    print(
        f"largest batch that fits: {result['max_batch']} (limited by {result['limited_by']}); with the "
        f"{result['margin']:.0%} margin use at most {result['safe_batch']}; knee (within "
        f"{result['knee_within']:.0%} of the best {result['best_samples_per_s']:,.0f} samples/s): "
        f"{result['knee_batch']}"
    )
    print(f"saved: {saved}")


def show_noise_scale(r: dict[str, Any], saved: Path) -> None:
    def shown(value: float | None, error: float | None) -> str:
        return (
            "not measurable (the |G|² or tr(Σ) estimate is not positive: more --steps, or a larger --batch-size)"
            if value is None
            else f"{value:,.1f} ± {error:,.1f}"
        )

    print(
        f"gradient noise scale B_simple over {r['steps']} steps ({r['source']}; batches {r['small_batch']} and "
        f"{r['big_batch']}, {r['ranks']} rank(s)): at the end {shown(r['b_simple'], r['b_simple_stderr'])} "
        f"(moving averages over {r['ema_steps']} steps); whole run {shown(r['b_simple_run'], r['b_simple_run_stderr'])}"
    )
    if r["curve"]:
        print("predicted cost to reach the same loss, relative to its minimum (McCandlish et al. 2018):")
        print("   batch   steps / S_min   examples / E_min")
        for row in r["curve"]:
            print(f"{row['batch']:>8}   {row['steps_vs_min']:13.2f}   {row['examples_vs_min']:16.2f}")
        print(f"critical batch ≈ {r['critical_batch']:,.0f}: above it, more batch buys few fewer steps")
    print(f"saved: {saved}")


def show_lr_find(r: dict[str, Any], saved: Path) -> None:
    stop = f"diverged at LR {r['diverged_at_lr']:.3g}" if r["diverged_at_lr"] else "did not diverge"
    print(
        f"LR range test {r['lr_min']:g} -> {r['lr_max']:g} over {r['steps']} steps at global batch "
        f"{r['global_batch_size']}: {stop}"
    )
    print(f"suggested LR {r['suggested_lr']:.3g} ({r['rule']}); steepest descent: {r['steepest_lr']:.3g}")
    s = r["scaled"]
    print(f"for global batch {s['global_batch_size']}: LR {s['lr']:.3g} ({s['scaling']} scaling)")
    print(f"saved: {saved}")


def show_recommend(r: dict[str, Any], apply: bool, saved: Path) -> None:
    for key in ("per_worker_batch", "global_batch", "lr", "warmup_epochs", "schedule", "batch_schedule", "optimizer"):
        value = r[key]["value"]
        shown = f"{value:.4g}" if isinstance(value, float) else f"{value}"
        print(f"{key.replace('_', ' '):17} {shown}  ({r[key]['source']})")
    for note in r["notes"]:
        print(f"note: {note}")
    if apply:
        print(r["command"])
    print(f"saved: {saved}")


def show_json(result: Any) -> None:
    print(json.dumps(result, indent=2, default=str))
