"""Mutation testing of one module at a time (issue #25; docs/benchmarks.md "Mutation testing").

    make mutate MODULE=plan/links.py            # or: .venv/bin/python scripts/mutate.py plan/links.py

mutmut 3 runs in a scratch copy of the tree (/tmp/paratrain-mutate/<module>), so the working tree,
which others edit, is never touched and each module gets its own configuration: the fast test
files that pin its numbers (TESTS below; add yours there) and, where a module also holds code
that computes nothing a user reads, the functions whose mutants count (FUNCTIONS). Error
messages' wording is not mutated (lines that raise UsageError and the string lines that continue
them): a message is checked for what it names, not letter by letter. One mutant at a time by
default (--max-children 1): this is a 2-core machine shared with timing measurements.
Prints killed / survived / timeout per module and the kill rate; `mutmut show NAME` in the
scratch directory shows a survivor.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = Path("/tmp/paratrain-mutate")

# module (under src/paratrain) -> the test files that pin it: fast ones only (seconds a mutant).
TESTS = {
    "plan/links.py": ["tests/test_formulas_links.py", "tests/test_formulas_step_time.py"],
    "plan/step_time.py": ["tests/test_formulas_step_time.py", "tests/test_properties_plan.py"],
    "plan/calibrate.py": ["tests/test_formulas_step_time.py"],
    "plan/memory.py": [
        "tests/test_formulas_memory.py",
        "tests/test_formulas_unit_bytes.py",
        "tests/test_properties_plan.py",
    ],
    "plan/search.py": ["tests/test_plan_search.py", "tests/test_properties_plan.py"],
    "plan/depth.py": ["tests/test_plan_depth.py", "tests/test_properties_plan.py"],
    "workloads/models.py": ["tests/test_models.py", "tests/test_formulas_engine_memory.py", "tests/test_plan_depth.py"],
    "commbench.py": ["tests/test_formulas_links.py"],
    "batch/lr_find.py": ["tests/test_formulas_batch.py", "tests/test_properties_batch.py"],
    "batch/find_batch.py": ["tests/test_formulas_batch.py", "tests/test_properties_batch.py"],
    "sweep/space.py": ["tests/test_formulas_sweep_space.py", "tests/test_sweep_space.py"],
    "slurm.py": ["tests/test_formulas_slurm.py"],
    "doctor/script_checks.py": [
        "tests/test_formulas_doctor.py",
        "tests/test_properties_doctor.py",
        "tests/test_properties_doctor_gains.py",
    ],
    "doctor/rank_checks.py": [
        "tests/test_formulas_rank_checks.py",
        "tests/test_formulas_doctor.py",
        "tests/test_properties_doctor.py",
    ],
    "doctor/causes.py": [
        "tests/test_formulas_causes.py",
        "tests/test_formulas_causes_edges.py",
        "tests/test_properties_doctor_gains.py",
    ],
    "doctor/ledger.py": [
        "tests/test_formulas_ledger.py",
        "tests/test_formulas_expected.py",
        "tests/test_formulas_causes.py",
        "tests/test_properties_doctor_gains.py",
    ],
    "doctor/expected.py": ["tests/test_formulas_expected.py"],
    "doctor/growth.py": ["tests/test_formulas_growth.py"],
    "launch/step_trend.py": ["tests/test_formulas_growth.py"],
    "doctor/script_collectives.py": ["tests/test_formulas_causes.py", "tests/test_formulas_doctor.py"],
    "doctor/wasted_compute.py": ["tests/test_formulas_wasted_compute.py"],
    "launch/trace_summary.py": ["tests/test_formulas_causes.py", "tests/test_properties_probe_summary.py"],
    "doctor/finding.py": ["tests/test_formulas_doctor.py", "tests/test_properties_doctor_gains.py"],
    "doctor/checks.py": [
        "tests/test_formulas_doctor_runs.py",
        "tests/test_formulas_doctor.py",
        "tests/test_formulas_epochs.py",
        "tests/test_properties_doctor.py",
    ],
    "doctor/study_checks.py": [
        "tests/test_formulas_study_checks.py",
        "tests/test_formulas_doctor_runs.py",
        "tests/test_properties_doctor.py",
    ],
    "engine/timing.py": ["tests/test_formulas_timing.py"],
    "engine/memory.py": ["tests/test_formulas_engine_memory.py"],
    "engine/batch_schedule.py": ["tests/test_formulas_batch_schedule.py", "tests/test_properties_batch_schedule.py"],
    "engine/script_schedule.py": ["tests/test_formulas_batch_schedule.py"],
    "scale/__init__.py": [
        "tests/test_formulas_scale.py",
        "tests/test_formulas_epochs.py",
        "tests/test_properties_scale.py",
    ],
    "launch/probe_summary.py": [
        "tests/test_formulas_probe_summary.py",
        "tests/test_formulas_probe_summary_edges.py",
        "tests/test_formulas_doctor.py",
        "tests/test_properties_probe_summary.py",
    ],
}
# module -> the functions whose mutants count, where the module also runs things (probes, runs,
# benchmarks) that no unit test here can afford; none listed: the whole module.
FUNCTIONS = {
    # What a script's schedule decides and records; hooking into DDP and FSDP runs in the 2-rank tests only.
    "engine/script_schedule.py": ["micro_steps", "step_done", "load_state_dict", "_doubling_speedup", "_changed"],
    "batch/lr_find.py": ["scaling_rule", "smooth", "suggest"],
    "batch/find_batch.py": ["knee", "binsearch", "find_batch"],
    "commbench.py": ["fit_alpha_beta", "fit_regimes", "regime_for", "_largest", "message_sizes"],
    # The table and the points, not the running of them (run_study, plan's look at this machine).
    "scale/__init__.py": [
        "point_config",
        "script_point_config",
        "study_points",
        "study_spec",
        "_finished",
        "is_all_cores_reference",
        "scaling_rows",
        "workload_label",
        "_threads",
        "_row",
        "_median_breakdown",
    ],
    # Activation checkpointing and its operator policy, not the models' layers (test_models.py's own checks).
    "workloads/models.py": ["checkpoint_blocks", "_checkpoint_contexts", "_within", "_ops", "__call__"],
    # Not the process limit (setrlimit would bound the test process itself: the --memory-limit runs test it).
    "engine/memory.py": [
        "reset_peak_memory",
        "peak_memory_bytes",
        "peak_rss_bytes",
        "release_cached_memory",
        "storage_bytes",
        "_optimizer_tensors",
        "held_bytes",
        "_pack",
        "_release",
        "__init__",
        "watch",
        "_keep",
        "count",
        "figures",
        "_unpack",
        "per_rank",
        "is_out_of_memory",
    ],
}
MESSAGE_LINES = [r"raise UsageError\(", r"raise RunFailed\(", r"^\s+f?\"[^\"]*\"?\)?$", r"^\s+f\"", r"^\s+\"[^\"]"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module", help="a module under src/paratrain, e.g. plan/links.py")
    parser.add_argument("--tests", nargs="*", help="test files (default: the module's in TESTS)")
    parser.add_argument("--max-children", type=int, default=1)
    args = parser.parse_args()
    module = args.module.removeprefix("src/").removeprefix("paratrain/")
    tests = args.tests or TESTS.get(module)
    if not tests or not (ROOT / "src/paratrain" / module).is_file():
        sys.exit(
            f"mutate: no module src/paratrain/{module} or no tests for it: pass --tests or add it to TESTS "
            f"(known: {', '.join(TESTS)})"
        )
    work = SCRATCH / module.replace("/", "-").removesuffix(".py")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    patterns = "\n    ".join(MESSAGE_LINES)
    (work / "setup.cfg").write_text(f"""[mutmut]
source_paths = src
only_mutate = src/paratrain/{module}
pytest_add_cli_args_test_selection =
    {chr(10).join("    " + t for t in tests).strip()}
pytest_add_cli_args =
    -p
    no:logging
    -p
    no:cacheprovider
do_not_mutate_patterns =
    {patterns}
process_isolation = forkserver
use_git_change_detection = false
""")
    dotted = "paratrain." + module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    names = [f"{dotted}.x_{f}__mutmut_*" for f in FUNCTIONS.get(module, [])] + [
        f"{dotted}.x\u01c1*{f}__mutmut_*" for f in FUNCTIONS.get(module, [])
    ]
    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        sys.exit("mutate: mutmut is not installed: make mutate installs it (pip install -e '.[mutate]')")
    print(f"mutate: mutmut run in {work} (its output: {work / 'mutmut.log'})", flush=True)
    with open(work / "mutmut.log", "w") as log:
        run = subprocess.run(
            [str(mutmut), "run", "--max-children", str(args.max_children), *(names if names else [])],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    results = subprocess.run([str(mutmut), "results", "--all", "true"], cwd=work, capture_output=True, text=True).stdout
    states: dict[str, list[str]] = {}
    for line in results.splitlines():
        match = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
        if match and (not names or any(_glob(n, match.group(1)) for n in names)):
            states.setdefault(match.group(2).strip(), []).append(match.group(1))
    killed = len(states.get("killed", []))
    counted = sum(len(v) for k, v in states.items() if k not in ("skipped", "not checked"))
    print(f"\n{module}: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(states.items())))
    for state in ("survived", "no tests", "timeout", "suspicious"):
        for name in states.get(state, []):
            print(f"  {state}: {name}   (cd {work} && {mutmut} show {name})")
    if counted:
        print(f"kill rate {module}: {killed}/{counted} = {killed / counted:.1%}  (tests: {' '.join(tests)})")
    return run.returncode


def _glob(pattern: str, name: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, pattern)


if __name__ == "__main__":
    sys.exit(main())
