"""Apply each mutant of an audit (a folder of .patch files written by someone who did not read the
tests), run the fast suite and the test files of the mutated area, and record whether any test failed.

    .venv/bin/python scripts/audit_mutants.py benchmarks/audit-58 --out runs/audit-58.json

Not part of `make test`. Bytecode is never written (PYTHONDONTWRITEBYTECODE): a patch that keeps a file's
size within one second of an earlier compile would otherwise run the old bytecode.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = sorted(glob.glob("tests/test_formulas_*.py", root_dir=ROOT)) + sorted(
    glob.glob("tests/test_properties*.py", root_dir=ROOT)
)
# The integration test files of each area, run beside the fast ones (the whole suite takes 25 minutes).
AREA = {
    "doctor/": ["tests/test_doctor.py"],
    "launch/": ["tests/test_doctor.py"],
    "scale/": ["tests/test_scale.py"],
    "reporting/": ["tests/test_scale.py", "tests/test_run_outcomes.py"],
    "batch/": ["tests/test_batch.py"],
    "plan/": ["tests/test_plan.py", "tests/test_plan_search.py", "tests/test_plan_depth.py"],
    "engine/batch_schedule": ["tests/test_batch_schedule.py"],
    "engine/": ["tests/test_synchronisation.py"],
}


def touched(patch: Path) -> list[str]:
    numstat = ["git", "apply", "--numstat", str(patch)]
    out = subprocess.run(numstat, cwd=ROOT, capture_output=True, text=True, check=True)
    return [line.split("\t")[2] for line in out.stdout.splitlines()]


def area_tests(files: list[str]) -> list[str]:
    tests: list[str] = []
    for f in files:
        inner = f.removeprefix("src/paratrain/")
        key = next((k for k in AREA if inner.startswith(k)), None)
        tests += [t for t in AREA.get(key, []) if t not in tests]
    return tests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    # This checkout's code, not the installed one (the audit also runs in a worktree at an older commit).
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT / "src")}
    results = []
    for patch in sorted(args.folder.glob("*.patch")):
        files = touched(patch)
        tests = FAST + area_tests(files)
        subprocess.run(["git", "apply", str(patch)], cwd=ROOT, check=True)
        started = time.time()
        try:
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:logging", "-p", "no:cacheprovider", *tests],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
        finally:
            subprocess.run(["git", "apply", "-R", str(patch)], cwd=ROOT, check=True)
        failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
        results.append(
            {
                "mutant": patch.name,
                "files": files,
                "tests": tests[len(FAST) :],
                "killed": run.returncode != 0,
                "first_failure": failed[0] if failed else None,
                "seconds": round(time.time() - started),
            }
        )
        print(f"{patch.name}: {'killed' if run.returncode else 'SURVIVED'} ({results[-1]['seconds']} s)", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    print(f"{sum(r['killed'] for r in results)} of {len(results)} killed")


if __name__ == "__main__":
    main()
