"""Where the suite's time goes: seconds per test file and the slowest tests, from the JUnit XML that
`make test` writes (build/test-times.xml; pytest's `--junit-xml`, each test's setup, call and teardown).

    .venv/bin/python scripts/test_times.py                       # build/test-times.xml
    .venv/bin/python scripts/test_times.py /tmp/ci/main/build/test-times.xml --top 40

The brief keeps the suite near 20 minutes; `--durations=25` in the CI log names the slowest tests but
not the files whose many middling tests add up, which is where most of the time is. Not part of
`make test`.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def read(path: Path) -> tuple[float, list[tuple[str, str, float]]]:
    """The session's seconds as pytest reports them, and (file, test, seconds) for every test case."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        print(f"test_times.py: {path} is not a JUnit XML report ({exc}); run `make test` again", file=sys.stderr)
        sys.exit(2)
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = []
    for case in root.iter("testcase"):
        module = case.get("classname", "")
        # pytest names a module test's class "tests.test_x" and a class's test "tests.test_x.TestY"
        parts = module.split(".")
        file = "/".join(parts[:2]) + ".py" if len(parts) >= 2 else module
        cases.append((file, case.get("name", ""), float(case.get("time", 0.0))))
    return float(suite.get("time", 0.0)) if suite is not None else 0.0, cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, default=ROOT / "build" / "test-times.xml")
    parser.add_argument("--top", type=int, default=20, help="how many files and tests to list")
    args = parser.parse_args()
    if not args.report.is_file():
        parser.exit(2, f"test_times.py: {args.report} is not a file; run `make test` first, or give the report\n")
    run, cases = read(args.report)
    total = sum(seconds for _, _, seconds in cases)
    by_file: dict[str, list[float]] = defaultdict(list)
    for file, _, seconds in cases:
        by_file[file].append(seconds)
    print(f"{len(cases)} tests: {total / 60:.1f} min in the tests, of the run's {run / 60:.1f}")
    print()
    print("| file | tests | minutes | share |\n|---|---:|---:|---:|")
    ranked = sorted(by_file.items(), key=lambda item: -sum(item[1]))
    for file, times in ranked[: args.top]:
        print(f"| {file} | {len(times)} | {sum(times) / 60:.1f} | {sum(times) / total:.0%} |")
    print("\n| test | seconds |\n|---|---:|")
    for file, name, seconds in sorted(cases, key=lambda c: -c[2])[: args.top]:
        print(f"| {file}::{name} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
