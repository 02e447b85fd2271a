"""`paratrain doctor`: why a run, a scaling study or a sweep is slow, and what to change.

The doctor reads run directories only (config.json, summary.json, metrics.jsonl, system.jsonl;
scaling.json and sweep.json for studies): it is an analysis layer the engine never imports.
Each finding carries the evidence (numbers from the run), the cause, the remedy (a paratrain
command built from the run's own configuration, or a code change) and the gain a stated model
predicts; they are ranked by the predicted share of time saved (checks.py holds the thresholds
and models, docs/doctor.md explains them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from paratrain.doctor.causes import CAUSES
from paratrain.doctor.checks import RUN_CHECKS, contended, first_epoch_overhead, idle_devices, rank0_alone
from paratrain.doctor.evidence import RunEvidence, idle_fractions, read_run, system_samples
from paratrain.doctor.failure import BEFORE_ANY_STEP, failure
from paratrain.doctor.finding import Finding
from paratrain.doctor.growth import GROWTH
from paratrain.doctor.ledger import unexplained
from paratrain.doctor.rank_checks import RANK_CHECKS
from paratrain.doctor.script_checks import SCRIPT_CHECKS, probe_status
from paratrain.doctor.script_collectives import LIBRARY_COLLECTIVES
from paratrain.doctor.study_checks import batch_knee, best_at_edge, lr_not_scaled
from paratrain.doctor.wasted_compute import WASTED_COMPUTE
from paratrain.errors import UsageError
from paratrain.formatting import pct
from paratrain.launch import probe_summary
from paratrain.launch.probe_summary import PROBE_DIR
from paratrain.runs import SCALING_FILE, SWEEP_FILE, RunDir
from paratrain.runs.records import Study, Summary, SweepResult, Trial, load_record

__all__ = ["Finding", "diagnose", "diagnose_run", "format_text", "idle_fractions"]


def diagnose(path: Path) -> dict[str, Any]:
    """{"kind", "path", "verdict", "findings": [...]} for a run, scaling study or sweep directory."""
    path = Path(path)
    if (path / SCALING_FILE).is_file():
        kind, findings = "study", _study_findings(path)
    elif (path / SWEEP_FILE).is_file():
        kind, findings = "sweep", _sweep_findings(path)
    elif RunDir(path).is_run():
        ev = read_run(path)
        kind, findings = "run", tempered(diagnose_run(ev), ev.contention_change)
    else:
        raise UsageError(
            f"{path} is not a paratrain run (config.json), scaling study (scaling.json) or sweep "
            "(sweep.json); pass the --run-dir of a run or the --out of a study"
        )
    ranked, dropped = one_voice(rank(findings))
    return {
        "kind": kind,
        "path": str(path),
        "verdict": verdict(ranked),
        "findings": [f.as_dict() for f in ranked],
        "dropped": dropped,
    }


def diagnose_run(ev: RunEvidence) -> list[Finding]:
    """A run's findings; a run that failed says so first, then what the steps it finished show (the failure alone
    when none did)."""
    measured = ev.has_steps and not (ev.is_script and ev.probe.get("status") == "no steps")
    failed = [f for f in (failure(ev, measured),) if f is not None]
    if ev.is_script and ev.probe.get("status") == "no steps":
        if failed:
            return failed
        seen = ", ".join(
            f"rank {r['rank']}: {r.get('threads', '?')} threads, {r.get('loader_workers', 0)} DataLoader workers"
            for r in ev.probe.get("ranks", [])
        )
        raise UsageError(
            f"{ev.path}: the probe saw no optimizer step ({seen}); the doctor times steps at torch.optim's "
            "optimizer.step(): train with a torch.optim optimizer, or run long enough for a step to finish"
        )
    if not ev.has_steps:
        if failed:
            return failed
        raise UsageError(
            f"{ev.path}: the run has no steps to diagnose (no epoch in metrics.jsonl, no breakdown in "
            "summary.json, no monitor samples of its ranks); rerun it until at least one epoch finishes"
        )
    # A probed script: its per-rank phases replace the monitor-based straggler guess; rank 0 working
    # alone after the last step (a final evaluation) is in no step, so the monitor still looks for it.
    checks = (
        (
            contended,
            *SCRIPT_CHECKS,
            *RANK_CHECKS,
            *CAUSES,
            *WASTED_COMPUTE,
            *GROWTH,
            *LIBRARY_COLLECTIVES,
            rank0_alone,
            first_epoch_overhead,
            idle_devices,
            probe_status,
        )
        if ev.probe_ranks
        else (*RUN_CHECKS, probe_status)
    )
    findings: dict[str, Finding] = {}
    for check in checks:
        if (f := check(ev)) is not None:
            findings.setdefault(f.check, f)  # the probe's figure before the monitor's, for one cause
    if "unsynchronised" in findings:
        findings = {name: f for name, f in findings.items() if name not in TOGETHER}
    # What no finding accounts for is a finding too, with where the time went (doctor/ledger.py).
    return [*failed, *findings.values(), *unexplained(ev, list(findings.values()))]


# Findings about ranks that train one model together: how they share the data, and waiting for each other. Ranks
# that never synchronised wait for nobody, and each rightly reads the whole dataset for its own copy.
TOGETHER = ("duplicate_data", "straggler", "slow_rank", "uneven_shards", "rank0_alone")
# Said before anything else: a run that failed (the rest comes from the steps it finished), then ranks that never
# synchronised (N independent copies: no timing of them says what parallel training costs).
FIRST = ("run_failed", "unsynchronised")
# Problems that distort every other timing, fixed first whatever their own saving: oversubscribed ranks
# (torch's threads, or DataLoader workers, beyond their cores) slow every phase and make ranks wait for
# each other.
ROOT_CAUSES = ("oversubscription", "loader_workers")
# Then faults whose remedy is exact (the same training, no LR or batch change) and whose cost is counted
# inside the all-reduce that other checks read: an all-reduce on every micro-step, find_unused_parameters
# (its used-parameter map is all-reduced every step, after the last bucket), DDP's buckets far below their
# default size, every collective checked first (TORCH_DISTRIBUTED_DEBUG=DETAIL). Until they are fixed, the
# exposed-communication and small-batch findings count their time too.
EXACT_FIRST = ("no_sync_missing", "find_unused_parameters", "ddp_buckets", "debug_environment")
# A remedy that changes the global batch (a larger per-rank batch, accumulation: the LR to rescale, generalisation
# to check) comes after the time findings whose remedies leave the training as it is, when one of those saves this
# share of the step or more: those are fixed first. A bound (time no check explains, "up to ... if that time were
# free") predicts no remedy's gain and moves nothing: at a few samples a step it is mostly the per-call Python
# that the larger batch would share out. Until then the batch finding counts their time too: a step's
# time outside the model's work that a larger batch would share out (a process group created every step,
# metrics synchronised every step, a histogram written every step) is what made it outrank them, with its
# remedy for every cause (the second held-out set, benchmarks/doctor_heldout2/).
BATCH_AFTER_EXACT = 0.10
# Causes in the machine rather than the run (one core or device running the same work slower): no change
# to the script or its flags removes them, and the next run may not meet them, so they come after the
# run's own findings, whatever their saving.
MACHINE_CAUSES = ("slow_rank",)
# Findings read from time a rank spent waiting for others (an all-reduce, a straggler, a lone rank): other
# work on the machine that deschedules one rank makes the others wait just the same, so on a contended
# machine such a finding stands only where its share of the step is more than the contention could explain.
# Findings of a rank's own work (its collections, its dtype, its data preparation, its recompute, its data
# read twice) keep their rank: other work slows every phase alike, and leaves their shares as they are.
WAITING = (
    "exposed_communication",
    "straggler",
    "slow_rank",
    "rank0_alone",
    "host_sync_stalls",
    "library_collectives",
    "model_collectives",
    "ddp_buckets",
    "unexplained_comm",
)


# Findings comparing measurements taken at different moments (the model's layers timed alone at the calibration
# step against the steady steps, doctor/expected.py; the first steps against the last, doctor/growth.py): other work
# that slowed one moment more than the other makes a gap just the same, so on a contended machine they are
# tempered as the waiting findings are.
COMPARED_APART = ("model_work_excess", "growing_steps", "slower_from_step")
# ... unless the contention stayed put: other work's share of every rank's own cores moved by less than this between
# the first and the last third of the run (RunEvidence.contention_change), so it slowed both moments alike
STEADY_CONTENTION = 0.10


def tempered(findings: Sequence[Finding], contention_change: float | None) -> list[Finding]:
    """On a contended machine (the `contended` finding is present) the contention is a caveat, not a mask:
    a finding stands above it when contention cannot explain it (it is no waiting nor a comparison of two moments
    of a run whose contention changed, or its share is larger than the share of the cores other work took, and it
    is no slow rank that the other work on its own cores explains: Finding.contention_explains); the
    others rank after the caveat and are marked medium at most. A waiting finding's gain gets a range: at the low
    end, the contention made as much of the wait as it could (the saving less the other work's share, of the step
    without it)."""
    caveat = next((f for f in findings if f.check == "contended"), None)
    if caveat is None:
        return list(findings)
    other = caveat.share or 0.0
    out = []
    for f in findings:
        if f is caveat or f.saving is None:
            out.append(f)
            continue
        moved = contention_change is None or contention_change >= STEADY_CONTENTION  # unknown: as if it moved
        compared_apart = f.check in COMPARED_APART and moved
        if f.check not in WAITING and not compared_apart:
            out.append(replace(f, above_contention=True))
            continue
        stands = not f.contention_explains and max(f.saving, f.share or 0.0) > other
        low = 1 / (1 - max(0.0, f.saving - other) / (1 - other))
        gain = f"{f.predicted_gain} (at least {low:.2f}x if other work's {pct(other)} of the cores made the rest)"
        severity = f.severity if stands or f.severity != "high" else "medium"
        out.append(replace(f, predicted_gain=gain, severity=severity, above_contention=stands))
    return out


def rank(findings: Sequence[Finding]) -> list[Finding]:
    """A failure and ranks that never synchronised first, then root causes, then exact remedies whose cost hides in
    the all-reduce, then the run's time findings by predicted saving, largest first (on a contended machine: those
    the contention cannot explain, then the caveat, then the rest), then the machine's; then advice (accuracy,
    measurement). Among time findings, those whose remedy changes the global batch come after any whose remedy
    leaves the training as it is and saves BATCH_AFTER_EXACT of the step or more."""
    order = (*FIRST, *ROOT_CAUSES, *EXACT_FIRST)
    exact = any(
        f.global_batch_factor is None and not f.bound and (f.saving or 0.0) >= BATCH_AFTER_EXACT
        for f in findings
        if f.check not in ("contended", *MACHINE_CAUSES)
    )

    def key(f: Finding) -> tuple[int, int, bool, bool, bool, float]:
        first = order.index(f.check) if f.check in order else len(order)
        tier = 1 if f.check == "contended" else 0 if f.above_contention else 2
        advice = f.saving is None  # after the machine's time findings too
        batch_later = exact and f.global_batch_factor is not None
        return first, tier, advice, f.check in MACHINE_CAUSES, batch_later, -f.saving if f.saving is not None else 1.0

    return sorted(findings, key=key)


def one_voice(findings: Sequence[Finding]) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The ranked findings less the remedies that contradict a higher-ranked one, and those dropped with why.

    Remedies that change the global batch (`Finding.global_batch_factor`) in opposite directions cannot both be
    taken: the first in rank order (the larger predicted gain; a predicted gain before advice with none) sets the
    direction, and a later one pulling the other way is dropped. The kept remedy says so, and what the dropped
    finding warned of, so that one voice speaks and nothing it knew is lost."""
    kept: list[Finding] = []
    dropped: list[dict[str, Any]] = []
    lead: Finding | None = None  # the highest-ranked remedy that changes the global batch
    grows = False  # ...and whether it grows it
    for f in findings:
        factor = f.global_batch_factor
        if factor is None or factor == 1:
            kept.append(f)
            continue
        if lead is None:
            lead, grows = f, factor > 1
        if (factor > 1) == grows:
            kept.append(f)
            continue
        why = _outranks(lead, f)
        verb = "grow" if factor > 1 else "shrink"
        change = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in (f.rerun or {}).items()) or "its code change"
        lead.remedy += (
            f" [one voice: {f.check}'s remedy ({change}) would {verb} the global batch instead, and is dropped: "
            f"{why}; it said: {f.finding}]"
        )
        dropped.append(
            {"check": f.check, "finding": f.finding, "remedy": f.remedy, "dropped_for": lead.check, "why": why}
        )
    return kept, dropped


def _outranks(lead: Finding, other: Finding) -> str:
    """Why `lead`'s remedy is kept over `other`'s, which moves the global batch the other way."""
    gain = lead.predicted_gain.split(":")[0]
    if lead.saving is not None and other.saving is not None:
        return f"{lead.check} predicts {gain} against {other.predicted_gain.split(':')[0]} for {other.check}"
    if lead.saving is not None:
        return f"{lead.check} predicts {gain}, {other.check} is advice with no predicted gain"
    return f"{lead.check} ranks first"


def verdict(findings: Sequence[Finding]) -> str:
    if not findings:
        return "nothing to fix: every phase of the step is accounted for"
    if findings[0].check == "run_failed":
        if BEFORE_ANY_STEP in findings[0].finding:
            return f"{findings[0].finding}; nothing else to diagnose"
        return f"{findings[0].finding}; in the steps it finished: {verdict(findings[1:])}"
    if findings[0].check == "unsynchronised":
        others = [f for f in findings[1:] if f.saving is not None]
        return f"fix first: {findings[0].finding}; their samples/s is no speedup" + (
            f"; {len(others)} problem(s) in each copy's steps below" if others else ""
        )
    timed = [f for f in findings if f.saving is not None]
    top = findings[0]
    caveat = next((f for f in findings if f.check == "contended"), None)
    read = f"; read with care: {caveat.finding}" if caveat is not None and top is not caveat else ""
    if top.check == "contended":
        others = [f for f in timed if f is not top]
        return f"read with care: {top.finding} (the timings below were measured in that state)" + (
            f"; {len(others)} more problem(s) costing time below" if others else ""
        )
    if top.check in ROOT_CAUSES:
        others = [f for f in timed if f is not top]
        return (
            f"fix first: {top.finding} (predicted: {top.predicted_gain.split(':')[0]})"
            + (f"; {len(others)} more problem(s) costing time below" if others else "")
            + read
        )
    if top.check in EXACT_FIRST and len(timed) > 1:
        return (
            f"{len(timed)} problem(s) costing time; fix first: {top.finding} (predicted: "
            f"{top.predicted_gain.split(':')[0]}): an exact remedy, and its cost is counted in the all-reduce "
            "the findings below read" + read
        )
    if timed:
        return (
            f"{len(timed)} problem(s) costing time; the biggest: {timed[0].finding} "
            f"(predicted: {timed[0].predicted_gain.split(':')[0]})" + read
        )
    return f"no time to gain; {len(findings)} piece(s) of advice on accuracy or measurement below" + read


def _study_findings(path: Path) -> list[Finding]:
    """The study's own checks, then the run checks of its largest point, each said of that point."""
    study = load_record(Study, path / SCALING_FILE, "scaling study")
    rows = study.points()
    if not rows:
        raise UsageError(f"{path}: the scaling study has no finished point to diagnose; finish it with --resume")
    configs = {r.run_dir: _config(Path(r.run_dir)) for r in rows if r.run_dir}
    findings = [f for f in (lr_not_scaled(study, configs),) if f]
    top = rows[-1]
    ev = read_run(Path(top.run_dir)) if top.run_dir and RunDir(Path(top.run_dir)).is_run() else None
    if ev is not None and ev.has_steps:
        for f in diagnose_run(ev):
            f.finding = f"at {top.workers} workers: {f.finding}"
            findings.append(f)
    return findings


def _sweep_findings(path: Path) -> list[Finding]:
    """The batch knee across trials, the best value at the space's edge, then the run checks of the best trial
    (built-in trials are runs; a probed script trial is read as a one-rank launched run)."""
    sweep = load_record(SweepResult, path / SWEEP_FILE, "sweep")
    best = sweep.best if isinstance(sweep.best, Trial) else None
    findings = [f for f in (batch_knee(sweep.trials, best),) if f]
    findings += best_at_edge(sweep.space, sweep.trials, best, sweep.metric[0] if sweep.metric else "value")
    ev = _best_trial(sweep, best) if best is not None else None
    if ev is not None and ev.has_steps:
        for f in diagnose_run(ev):
            f.finding = f"best trial {best.number}: {f.finding}"
            findings.append(f)
    return findings


def _best_trial(sweep: SweepResult, best: Trial) -> RunEvidence | None:
    if not best.run_dir:
        return None
    trial = Path(best.run_dir)
    if RunDir(trial / "run").is_run():  # a built-in trial's run directory
        return read_run(trial / "run")
    if (trial / PROBE_DIR).is_dir():  # a script trial's probe records, summarised as launch does
        summary = Summary.model_validate({"status": "completed", "workers": 1, **probe_summary.summarise(trial)})
        config = {"script": sweep.script or "the script", "workers": 1, "resolved": {}}
        return RunEvidence(path=trial, config=config, summary=summary, events=[], system=system_samples(trial))
    return None


def _config(path: Path) -> dict[str, Any]:
    run = RunDir(path)
    return run.read_config() if run.is_run() else {}


def format_text(diagnosis: dict[str, Any]) -> str:
    """The findings as a person reads them in a terminal."""
    lines = [f"doctor: {diagnosis['path']} ({diagnosis['kind']}): {diagnosis['verdict']}"]
    for i, f in enumerate(diagnosis["findings"], 1):
        lines += [
            f"\n{i}. [{f['severity']}] {f['finding']}",
            f"   evidence:  {f['evidence']}",
            f"   cause:     {f['cause']}",
            f"   remedy:    {f['remedy']}",
            f"   predicted: {f['predicted_gain']}",
        ]
    for d in diagnosis.get("dropped", []):
        lines.append(f"\ndropped, contradicting {d['dropped_for']}'s remedy: {d['finding']} ({d['why']})")
    return "\n".join(lines)
