"""`paratrain doctor RUN --verify`: apply the top finding's remedy and measure whether its gain comes true.

The remedy is run as the user would run it (the finding's own command line), and so is the run as it was:
this VM's speed drifts by up to 2x between hours, so a gain is only measured against a baseline rerun in
the same sitting, alternating baseline and remedy, never against the old run. Each round's speed-up is
the remedy's samples/s over its baseline's (summary.json's steady figure: a built-in run's epochs after the
first, a launched script's probe or report); the verdict is the median over the rounds.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from paratrain.doctor import MACHINE_CAUSES, diagnose_run, rank
from paratrain.doctor.evidence import read_run, rerun_command
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import SCALING_FILE, SWEEP_FILE, RunDir

VERIFY_FILE = "verify.json"
AGREEMENT = 0.30  # a prediction within 30 % of the measured gain "came true" (issue #26's bar)


def verify(path: Path, repeats: int = 1) -> dict[str, Any]:
    """Rerun the run `path` as it was and with its top remedy, `repeats` rounds; write and return verify.json."""
    path = Path(path).resolve()
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: give at least 1 round")
    if (path / SCALING_FILE).is_file() or (path / SWEEP_FILE).is_file():
        raise UsageError(
            f"{path} is a scaling study or sweep; --verify reruns one run: pass a run directory "
            "(a study's point or a sweep's trial)"
        )
    if not RunDir(path).is_run():
        raise UsageError(f"{path} is not a paratrain run directory (no config.json); pass a run's --run-dir")
    ev = read_run(path)
    if ev.is_script and ev.config.get("probe") is False:
        raise UsageError(
            f"{path} was launched with --no-probe: the doctor had only the monitor's samples, not the "
            "step breakdown its predictions rest on; launch it again without --no-probe, then verify"
        )
    timed = [f for f in rank(diagnose_run(ev)) if f.saving is not None]
    if not timed:
        raise UsageError(f"{path}: no finding predicts a gain, so there is nothing to verify")
    top = timed[0]
    if top.check in MACHINE_CAUSES:
        raise UsageError(
            f"{path}: the top finding ({top.check}) is in the machine, not the run: no flag of the run "
            f"changes it, so --verify has nothing to rerun; {top.remedy}"
        )
    if top.rerun is None:
        change = top.remedy.split(": ", 1)[-1] if top.remedy.startswith("code change") else top.remedy
        raise UsageError(
            f"{path}: the top finding ({top.check}) has a code change as its remedy ({change}); --verify runs only "
            "remedies that are paratrain flags or environment settings: make the change, launch again, and compare"
        )
    out = path.with_name(path.name + "-verify")
    if out.exists():
        raise UsageError(f"{out} already exists (an earlier --verify); remove or move it, then verify again")

    commands = {
        arm: lambda i, arm=arm: rerun_command(
            ev, run_dir=str(out / f"{arm}-{i}"), **(top.rerun if arm == "remedy" else {})
        )
        for arm in ("baseline", "remedy")
    }
    figures: dict[str, list[float]] = {"baseline": [], "remedy": []}
    from rich.console import Console
    from rich.progress import Progress

    out.mkdir(parents=True)
    # progress on stderr: stdout carries only the verdict (or the JSON object for tools)
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("verify", total=2 * repeats)
        for i in range(1, repeats + 1):
            for arm in ("baseline", "remedy"):
                progress.update(task, description=f"{arm} {i}/{repeats}")
                figures[arm].append(_run(commands[arm](i), out / f"{arm}-{i}"))
                progress.advance(task)
    ratios = [r / b for b, r in zip(figures["baseline"], figures["remedy"])]
    result = {
        "run": str(path),
        "dir": str(out),
        "check": top.check,
        "finding": top.finding,
        "remedy": top.remedy,
        "changes": top.rerun,
        "predicted_speedup": top.predicted_speedup,
        "measured_speedup": statistics.median(ratios),
        "rounds": repeats,
        "samples_per_s": figures,
        "speedup_per_round": ratios,
        "commands": {arm: commands[arm](1) for arm in commands},
    }
    (out / VERIFY_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _run(command: str, run_dir: Path) -> float:
    """Run a paratrain command line (as printed to the user) and return the run's steady samples/s."""
    args = shlex.split(command)
    done = subprocess.run([sys.executable, "-m", "paratrain", *args[1:]], check=False, capture_output=True, text=True)
    run = RunDir(run_dir)
    summary = run.summary_record() if run.summary.is_file() else None
    rate = summary and (summary.samples_per_s or (summary.probe or {}).get("samples_per_s"))
    if done.returncode != 0 or not rate:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"--verify: `{command}` failed (exit {done.returncode}): {tail}")
    return float(rate)


def format_verify(result: dict[str, Any]) -> str:
    """The verdict first, then the figures and the commands."""
    predicted, measured = result["predicted_speedup"], result["measured_speedup"]
    if abs(predicted - measured) <= AGREEMENT * measured:
        verdict = "came true"
    else:
        verdict = "fell short" if measured < predicted else "was exceeded"
    base, fixed = (statistics.median(result["samples_per_s"][arm]) for arm in ("baseline", "remedy"))
    lines = [
        (
            f"verify: the prediction {verdict}: predicted {predicted:.2f}x, measured {measured:.2f}x "
            f"(median of {result['rounds']} round(s), {base:,.0f} -> {fixed:,.0f} samples/s) for {result['check']}"
        ),
        f"  remedy:   {result['commands']['remedy']}",
        f"  baseline: {result['commands']['baseline']}",
        f"  figures:  {Path(result['dir']) / VERIFY_FILE}",
    ]
    return "\n".join(lines)
