"""The doctor's fault catalogue (issue #26): each planted fault against its fix, and what the doctor said.

For each script of benchmarks/doctor_faults/ (or `--faults a,b`), `--repeats` rounds, each a faulty run
then the fixed one (`--fix`), both under `paratrain launch -n 2`. The measured gain of a round is the fixed
run's THROUGHPUT over the faulty run's (rank 0's last line of `THROUGHPUT <samples/s>`); the doctor reads
every faulty run (`paratrain doctor RUN --json`) and its top finding gives the check and the predicted
gain (`predicted_speedup`). The table quotes medians over the rounds; "within 30 %" compares the two
medians (|predicted - measured| <= 0.3 x measured). The raw figures go to OUT/catalogue.json.

A remedy with a size (a k times larger batch, k micro-steps under `no_sync()`) predicts the gain of that size.
The scripts in FOLLOW_FACTOR take it (`--fix --factor K`, the top finding's `global_batch_factor`), so their
fixed run applies the size the doctor named, and the gain measured is the remedy's: each faulty run is
diagnosed before its fixed run. Every other script applies its own fix.

`--dir` runs another folder of such scripts (benchmarks/doctor_heldout/, the faults written without reading
the doctor, with its expected.json: the table then says whether the top finding names the expected cause's
keywords). `--busy` keeps one core busy (a Python loop pinned to core 1, `taskset`) through every run: "the
machine half busy". `--pythonpath DIR` runs launch and the doctor from another checkout's src/ (the code as it
was before a change). Each faulty run's diagnosis is kept beside it (RUN/doctor.json).

`--rediagnose` runs nothing: it diagnoses OUT's faulty runs again, with the code on `--pythonpath` (the same
runs read by the code before a change: `--rediagnose --out runs/heldout --pythonpath ../before/src`).

`--overhead` measures the probe instead: healthy.py with and without `launch --no-probe`, alternating,
and the ratio of the median throughputs.

    .venv/bin/python benchmarks/doctor_catalogue.py --out runs/catalogue [--faults data_wait,straggler] [--repeats 3]
    .venv/bin/python benchmarks/doctor_catalogue.py --dir benchmarks/doctor_heldout --out runs/heldout [--busy]
    .venv/bin/python benchmarks/doctor_catalogue.py --overhead --out runs/overhead --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
FAULTS_DIR = Path(__file__).resolve().parent / "doctor_faults"
PARATRAIN = Path(sys.executable).parent / "paratrain"
FAULTS = [
    "healthy",
    "data_wait",
    "oversubscribed",
    "straggler",
    "rank0_eval",
    "small_batch",
    "exposed_comm",
    "no_sync",
    "find_unused",
    "uneven_shards",
    "eval_heavy",
    "checkpoint_heavy",
    "host_sync",
    "loader_workers",
    # issue #56's mistakes outside the first catalogue, the cases the doctor's causes were tuned on
    "duplicate_data",
    "tiny_buckets",
    "forward_collectives",
    "float64",
    "gc_every_step",
    "needless_checkpointing",
    "decode_full_cores",
    "big_allreduce",
]
# Scripts whose fix takes the remedy's size (`--factor`): their own default (16x the batch, 8 micro-steps) was
# the doctor's choice on the machine they were written on, and on a slower one it named 8x and 4.
FOLLOW_FACTOR = ("small_batch", "exposed_comm")
ENV = dict(os.environ)  # --pythonpath sets PYTHONPATH here, for launch and the doctor alike


def command(
    fault: str, launch_args: list[str], fix: bool, run_dir: Path | None = None, factor: int | None = None
) -> list[str]:
    where = ["--run-dir", str(run_dir)] if run_dir else []
    script = FAULTS_DIR / f"{fault}.py"
    return [
        "paratrain",
        "launch",
        "-n",
        "2",
        *launch_args,
        *where,
        str(script.relative_to(ROOT)),
        *(["--fix"] if fix else []),
        *(["--factor", str(factor)] if fix and factor else []),
    ]


def throughput(fault: str, launch_args: list[str], fix: bool, run_dir: Path, factor: int | None = None) -> float:
    """Launch one run and return rank 0's THROUGHPUT; one retry, since a local rendezvous fails now and then
    (a port taken between choosing and binding it)."""
    cmd = [str(PARATRAIN), *command(fault, launch_args, fix, run_dir, factor)[1:]]
    for attempt in (1, 2):
        shutil.rmtree(run_dir, ignore_errors=True)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
        found = (
            re.findall(r"^THROUGHPUT ([0-9.]+)$", (run_dir / "logs" / "rank0.log").read_text(), re.M)
            if (run_dir / "logs" / "rank0.log").exists()
            else []
        )
        if proc.returncode == 0 and found:
            return float(found[-1])
        print(
            f"attempt {attempt} failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stderr[-2000:]}", file=sys.stderr
        )
    raise SystemExit(f"run failed twice: {shlex.join(cmd)}")


def diagnose(run_dir: Path) -> tuple[str, float | None, str, int | None]:
    """The doctor's top finding on a run: its check, predicted speed-up (None when it gives none), text and the
    remedy's size (its global batch's factor, None without one); the whole diagnosis is kept in RUN/doctor.json."""
    proc = subprocess.run([str(PARATRAIN), "doctor", str(run_dir), "--json"], capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:
        return f"doctor exit {proc.returncode}", None, proc.stderr, None
    (run_dir / "doctor.json").write_text(proc.stdout)
    findings = json.loads(proc.stdout)["findings"]
    if not findings:
        return "none", None, "", None
    top = findings[0]
    speedup = top.get("predicted_speedup")
    text = " ".join(str(top.get(k, "")) for k in ("finding", "evidence", "cause", "remedy", "where")).lower()
    factor = top.get("global_batch_factor")
    return (
        top["check"],
        float(speedup) if isinstance(speedup, (int, float)) else None,
        text,
        int(factor) if factor and factor > 1 else None,
    )


@contextmanager
def busy_core(on: bool):
    """Another process on core 1 for the whole catalogue, as `--busy` asks: the machine half busy."""
    if not on:
        yield
        return
    hog = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def median_or_none(values: list[float | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    return statistics.median(numbers) if numbers else None


def catalogue(args: argparse.Namespace, launch_args: list[str]) -> None:
    listed = (
        FAULTS
        if FAULTS_DIR.name == "doctor_faults"
        else sorted(p.stem for p in FAULTS_DIR.glob("*.py") if p.stem != "common")
    )
    faults = args.faults.split(",") if args.faults else listed
    unknown = [f for f in faults if not (FAULTS_DIR / f"{f}.py").exists()]
    if unknown:
        raise SystemExit(f"no such fault script: {', '.join(unknown)} (choose from {', '.join(listed)})")
    expected_file = FAULTS_DIR / "expected.json"
    expected = json.loads(expected_file.read_text()) if expected_file.exists() else {}
    results = {f: {"faulty": [], "fixed": [], "checks": [], "predicted": [], "named": [], "factor": []} for f in faults}
    with busy_core(args.busy), Progress() as progress:
        task = progress.add_task("catalogue", total=len(faults) * args.repeats * 2)
        for r in range(1, args.repeats + 1):
            for fault in faults:
                row = results[fault]
                progress.update(task, description=f"{fault}-{r}-fault")
                row["faulty"].append(throughput(fault, launch_args, False, args.out / f"{fault}-{r}-fault"))
                progress.advance(task)
                check, predicted, text, factor = diagnose(args.out / f"{fault}-{r}-fault")
                factor = factor if fault in FOLLOW_FACTOR and FAULTS_DIR.name == "doctor_faults" else None
                row["checks"].append(check)
                row["predicted"].append(predicted)
                row["factor"].append(factor)
                keywords = expected.get(fault, {}).get("keywords", [])
                row["named"].append([k for k in keywords if k.lower() in text])
                progress.update(task, description=f"{fault}-{r}-fixed")
                row["fixed"].append(throughput(fault, launch_args, True, args.out / f"{fault}-{r}-fixed", factor))
                progress.advance(task)
    (args.out / "catalogue.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{args.repeats} round(s), medians; raw figures in {args.out / 'catalogue.json'}\n")
    table(results, expected, launch_args)


RESUMMARISE = (
    "import json, sys; from pathlib import Path; from paratrain.launch import probe_summary; "
    "run = Path(sys.argv[1]); s = json.loads((run / 'summary.json').read_text()); "
    "[s.pop(k, None) for k in ('breakdown', 'probe')]; s.update(probe_summary.summarise(run)); "
    "(run / 'summary.json').write_text(json.dumps(s))"
)


def rediagnose(args: argparse.Namespace, launch_args: list[str]) -> None:
    """The faulty runs of an earlier catalogue (OUT/catalogue.json) diagnosed again, by the code on --pythonpath:
    each run copied to OUT/rediagnosed/, its ranks' probe records summarised again and the doctor run. The same
    runs read by the code before and after a change."""
    results = json.loads((args.out / "catalogue.json").read_text())
    expected_file = FAULTS_DIR / "expected.json"
    expected = json.loads(expected_file.read_text()) if expected_file.exists() else {}
    copies = args.out / "rediagnosed"
    shutil.rmtree(copies, ignore_errors=True)
    for fault, row in results.items():
        row.update(checks=[], predicted=[], named=[])
        for r in range(1, len(row["faulty"]) + 1):
            copy = copies / f"{fault}-{r}-fault"
            shutil.copytree(args.out / f"{fault}-{r}-fault", copy)
            subprocess.run([sys.executable, "-c", RESUMMARISE, str(copy)], check=True, env=ENV)
            check, predicted, text, _ = diagnose(copy)
            row["checks"].append(check)
            row["predicted"].append(predicted)
            row["named"].append([k for k in expected.get(fault, {}).get("keywords", []) if k.lower() in text])
    print(f"\n{args.out}'s faulty runs diagnosed again with PYTHONPATH={ENV.get('PYTHONPATH', '')}\n")
    table(results, expected, launch_args)


def table(results: dict, expected: dict, launch_args: list[str]) -> None:
    print("| fault | top finding | expected keywords named | predicted gain | measured gain | within 30 % | command |")
    print("|---|---|---|---|---|---|---|")
    for fault, row in results.items():
        measured = statistics.median(fixed / faulty for fixed, faulty in zip(row["fixed"], row["faulty"]))
        predicted = median_or_none(row["predicted"])
        checks = sorted(set(row["checks"]), key=row["checks"].count, reverse=True)
        within = "n/a" if predicted is None else ("yes" if abs(predicted - measured) <= 0.3 * measured else "no")
        keywords = expected.get(fault, {}).get("keywords")
        sizes = sorted({f for f in row.get("factor", []) if f})
        factors = f" --factor {'/'.join(map(str, sizes))}" if sizes else ""
        named = "-" if not keywords else " / ".join(", ".join(n) or "none" for n in row["named"])
        print(
            f"| {fault} | {' / '.join(checks)} | {named} | {'n/a' if predicted is None else f'{predicted:.2f}x'} | "
            f"{measured:.2f}x | {within} | `{shlex.join(command(fault, launch_args, False))} [--fix{factors}]` |"
        )


def overhead(args: argparse.Namespace, launch_args: list[str]) -> None:
    arms = {"probe": launch_args, "no-probe": [*launch_args, "--no-probe"]}
    samples: dict[str, list[float]] = {arm: [] for arm in arms}
    with Progress() as progress:
        task = progress.add_task("overhead", total=args.repeats * 2)
        for r in range(1, args.repeats + 1):
            # ABBA: which arm goes first alternates, so a drift within a round or a run's after-effects on
            # the next (caches, clocks) do not favour one arm
            for arm, extra in list(arms.items()) if r % 2 else list(arms.items())[::-1]:
                progress.update(task, description=f"healthy-{r}-{arm}")
                samples[arm].append(throughput("healthy", extra, False, args.out / f"healthy-{r}-{arm}"))
                progress.advance(task)
    (args.out / "overhead.json").write_text(json.dumps(samples, indent=1) + "\n")
    probe, bare = statistics.median(samples["probe"]), statistics.median(samples["no-probe"])
    for arm, values in samples.items():
        print(
            f"{arm}: median {statistics.median(values):.1f} samples/s over {len(values)} runs "
            f"({', '.join(f'{v:.0f}' for v in values)})"
        )
    print(f"probe / no-probe throughput: {probe / bare:.3f} (overhead {100 * (1 - probe / bare):.1f} %)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "doctor-catalogue", help="run directories go here")
    p.add_argument("--faults", help=f"comma-separated, of: {','.join(FAULTS)} (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of faulty and fixed runs, alternating")
    p.add_argument("--launch-args", default="", help="extra `paratrain launch` flags, e.g. '--no-probe'")
    p.add_argument("--overhead", action="store_true", help="healthy.py with and without --no-probe instead")
    p.add_argument("--dir", type=Path, default=None, help="the folder of fault scripts (and expected.json)")
    p.add_argument("--busy", action="store_true", help="keep core 1 busy with another process through every run")
    p.add_argument("--pythonpath", help="run launch and the doctor from this src/ (another checkout's code)")
    p.add_argument(
        "--rediagnose", action="store_true", help="diagnose OUT's faulty runs again (with --pythonpath's code)"
    )
    args = p.parse_args()
    global FAULTS_DIR
    FAULTS_DIR = (args.dir or FAULTS_DIR).resolve()
    if args.pythonpath:
        ENV["PYTHONPATH"] = str(Path(args.pythonpath).resolve())
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    launch_args = shlex.split(args.launch_args)
    (overhead if args.overhead else rediagnose if args.rediagnose else catalogue)(args, launch_args)


if __name__ == "__main__":
    main()
