"""The flake loop (issue #25): each test file run N times in a row, each time in a fresh pytest process.

    make flake                                   # every tests/test_*.py, 20 times each (hours: the suite x 20)
    make flake FILES="tests/test_doctor_probe.py tests/test_launch.py" N=20
    .venv/bin/python scripts/flake.py tests/test_doctor_probe.py --runs 20
    .venv/bin/python scripts/flake.py tests/test_doctor_probe.py -k loader --runs 20   # the tests pytest -k selects

A fresh process per run, not pytest-repeat's `--count`: the flakes met so far live at process scope
(a rank aborting at exit after its process group was destroyed, module fixtures that start ranks once,
a port taken between choosing and binding it), which repeating tests inside one pytest process does not
recreate. Every failure is kept: the run's last lines go to OUT/<file>-<i>.log, and OUT/flake.json holds
runs, failures, seconds and the commits tested per file (appended to across invocations, so a loop cut
short still counts).
Exit status 1 when any run failed. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]


def key(name: str, select: str | None) -> str:
    return f"{name} -k {select}" if select else name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test files (default: every tests/test_*.py)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "flake")
    parser.add_argument(
        "-k",
        dest="select",
        help="only the tests this pytest -k expression selects (kept apart in flake.json as FILE -k EXPR)",
    )
    args = parser.parse_args()
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    missing = [f for f in files if not (ROOT / f).is_file()]
    if missing or args.runs < 1:
        print(
            f"flake: {'no such test file: ' + ', '.join(missing) if missing else '--runs must be at least 1'}",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    record_path = args.out / "flake.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    failed = False
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
        or "unknown"
    )
    with Progress() as progress:
        task = progress.add_task("flake loop", total=len(files) * args.runs)
        for name in files:
            entry = record.setdefault(key(name, args.select), {"runs": 0, "failures": 0, "seconds": []})
            # the commit each run tested: a record gathered over several sessions says which code passed
            entry.setdefault("commits", {})
            entry["commits"][commit] = entry["commits"].get(commit, 0)
            for i in range(args.runs):
                progress.update(task, description=f"{name} {i + 1}/{args.runs}")
                began = time.monotonic()
                select = ["-k", args.select] if args.select else []
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:logging", "-x", *select, name],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                entry["runs"] += 1
                entry["commits"][commit] += 1
                entry["seconds"].append(round(time.monotonic() - began, 1))
                if done.returncode != 0:
                    entry["failures"] += 1
                    failed = True
                    log = args.out / f"{Path(name).stem}-{entry['runs']}.log"
                    log.write_text((done.stdout + done.stderr)[-20000:])
                    progress.console.print(f"FAILED {name} (run {entry['runs']}): {log}")
                record_path.write_text(json.dumps(record, indent=1))
                progress.advance(task)
    for name in files:
        entry = record[key(name, args.select)]
        print(f"{key(name, args.select)}: {entry['runs'] - entry['failures']} of {entry['runs']} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
