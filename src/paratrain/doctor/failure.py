"""A run that failed (or diverged, or was interrupted): said first, with its cause, before what its finished steps
show. The cause is what the launcher recorded in summary.json: `error` (the rank that failed first, how it ended
and the last line of its log, for a launched script; the ranks' error for a built-in run), `exit_code` and
`failed_rank`."""

from __future__ import annotations

from paratrain.doctor.evidence import RunEvidence, rerun_command
from paratrain.doctor.finding import Finding

# How the finding of a run that failed before any step finished says so (the verdict then has nothing to add).
BEFORE_ANY_STEP = "before any step finished"


def failure(ev: RunEvidence, measured: bool) -> Finding | None:
    """The failure as the first finding; `measured`: whether any step finished (the doctor diagnoses those)."""
    summary = ev.summary
    if summary is None or summary.status == "completed":
        return None
    done = (
        f"{len(ev.epochs)} epoch(s) finished"
        if not ev.is_script
        else f"the probe timed {max((r.get('steps', 0) for r in ev.probe.get('ranks', [])), default=0)} step(s)"
    )
    code = f", exit status {summary.exit_code}" if summary.exit_code is not None else ""
    rank = f", rank {summary.failed_rank} first" if summary.failed_rank is not None else ""
    log = ev.path / "logs" / f"rank{summary.failed_rank}.log" if summary.failed_rank is not None else None
    fix = (
        "a smaller --lr, or a warm-up (--warmup-epochs 1)"
        if summary.status == "diverged"
        else f"fix what {log or 'the log its error names'} shows"
    )
    return Finding(
        "run_failed",
        f"the run {summary.status}{'' if measured else ' ' + BEFORE_ANY_STEP}: {summary.error or 'no cause recorded'}",
        f"summary.json: status {summary.status}{code}{rank}; {done} before it ended",
        "the error the launcher recorded when the ranks ended (summary.json `error`); the traceback is in the log it "
        "names"
        if summary.error
        else f"no error was recorded; the ranks' logs are in {ev.path / 'logs'}",
        f"{fix}, then run it again: {rerun_command(ev)}",
        "none in speed: a run that fails trains nothing to the end; what the doctor says below comes from the steps "
        "it finished",
        None,
        "high",
        where=str(log) if log else None,
    )
