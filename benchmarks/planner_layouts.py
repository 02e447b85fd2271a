"""Predicted against measured step time of the layouts beyond ddp on this machine: fsdp, tensor parallelism
(with and without sequence parallelism) and a pipeline of 2 stages of gpt-tiny on 2 workers (one core each),
planned by `paratrain plan --device cpu`, calibrated two ways (docs/planner.md):

- from single and ddp runs only: planner_accuracy.py's calibration. Runs on 1 and 2 workers at two batch sizes
  give the compute efficiency, the fixed compute a step, the per-step overhead and the synchronisation wait;
  what the layouts add, their collectives and their split compute, is predicted from the plan's model alone;
- with the layout's own runs too, at the same two batch sizes: the plan fits the layout's cost beyond its model
  of it (a fixed part a step and a part a sample: calibrate.py's LayoutCost).

Each is checked on runs at two other batch sizes. Runs alternate the layouts within a repeat so drift hits all
alike; the table gives the median of --repeats. About 6 minutes a repeat here; it takes both cores, so run it on
a quiet machine.

    .venv/bin/python benchmarks/planner_layouts.py --repeats 3

`--layouts pipeline` measures one of them (the single and ddp runs are always run: they calibrate). The pipeline
of 4 micro-batches calibrates its own cost at batches 4 and 16 (6 does not divide into 4). `--model FACTORY` takes
a user's own nn.Module factory instead, trained on synthetic 3 x 32 x 32 images (1,536 an epoch, SGD), calibrated
at 32 and 128 a worker and predicted at 48 and 96:

    PYTHONPATH=tests .venv/bin/python benchmarks/planner_layouts.py --model user_factories:wide_mlp --layouts pipeline
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from planner_accuracy import plan, train


@dataclass(frozen=True)
class Workload:
    """What is trained and planned: the train flags of every run, the plan's model flags, the optimizer, the
    batches (per worker) the single and ddp runs calibrate at and each layout is predicted and measured at
    (tp: per group), and a layout's own calibration batches where the common ones do not divide into its
    micro-batches."""

    name: str
    flags: list[str]
    plan_model: list[str]  # the plan's model flags
    optimizer: str
    calibrate: tuple[int, ...]
    batches: tuple[int, ...]
    own_calibrate: dict[str, tuple[int, ...]] = field(default_factory=dict)


GPT_TINY = Workload(
    "gpt-tiny",
    ["--samples-per-epoch", "384", "--eval-samples", "32", "--epochs", "2", "--optimizer", "adam"],
    ["--workload", "gpt-tiny"],
    "adam",
    (6, 16),
    (8, 32),
    {"pipeline of 4 micro-batches": (4, 16)},  # 6 does not divide into 4
)


def user_model(factory: str) -> Workload:
    """A user's model on synthetic images (the workload gives the data, the model replaces its network), at
    batches where its step is more than overhead; 32 and 128 divide into 4 micro-batches."""
    flags = ["--model", factory, "--synthetic-samples", "1536", "--epochs", "2", "--optimizer", "sgd"]
    return Workload("synthetic-cnn", flags, ["--model", factory], "sgd", (32, 128), (48, 96))


# layout -> (its train flags on 2 workers, its plan flags, the plan row's strategy, replicas). `train
# --batch-size` is per replica (a tensor-parallel group is one), `plan --batch-size` per device: the plan
# is given the global batch of the run it predicts.
LAYOUTS = {
    "ddp": (["--strategy", "ddp"], ["--strategy", "ddp"], "ddp", 2),
    "fsdp": (["--strategy", "fsdp"], ["--strategy", "fsdp"], "fsdp", 2),
    "tp": (["--tp", "2"], ["--strategy", "ddp", "--tp", "2"], "tp", 1),
    "tp, sequence parallel": (
        ["--tp", "2", "--sequence-parallel"],
        ["--strategy", "ddp", "--tp", "2", "--sequence-parallel"],
        "tp",
        1,
    ),
    # 2 stages of 2 micro-batches (every batch above divides by 2); the plan is told the runs' micro-batches
    "pipeline": (
        ["--strategy", "pipeline", "--microbatches", "2"],
        ["--strategy", "pipeline", "--microbatches", "2"],
        "pipeline",
        1,
    ),
    # the same with a smaller bubble (1/5 against 1/3): a check of the pipeline's model at another schedule shape
    "pipeline of 4 micro-batches": (
        ["--strategy", "pipeline", "--microbatches", "4"],
        ["--strategy", "pipeline", "--microbatches", "4"],
        "pipeline",
        1,
    ),
}


def run(workload: str, workers: int, batch: int, flags: list[str], run_dir: Path, measured: bool) -> dict:
    """train's summary of the run, or with `measured` the one an earlier run left in `run_dir`."""
    if not measured:
        return train(workload, workers, batch, flags, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["command"] = f"(measured in {run_dir})"
    return summary


def step_s(summary: dict) -> float:
    return summary["global_batch_size"] / summary["samples_per_s"]


def run_name(layout: str, batch: int, repeat: int) -> str:
    return f"{layout.replace(', ', '-').replace(' ', '-')}-b{batch}-r{repeat}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of every point, in turn; the median counts")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    parser.add_argument("--measured", type=Path, help="predict the runs an earlier --out kept, training nothing")
    parser.add_argument(
        "--layouts",
        type=lambda s: re.split(r",(?! )", s),  # "tp, sequence parallel" is one name: a comma and a space inside it
        default=list(LAYOUTS),
        help=f"comma-separated, of: {'; '.join(LAYOUTS)}",
    )
    parser.add_argument("--model", help="a user's model factory (module:function) instead of gpt-tiny")
    args = parser.parse_args()
    work = user_model(args.model) if args.model else GPT_TINY
    unknown = set(args.layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown layout(s): {', '.join(sorted(unknown))}")
    layouts = {name: LAYOUTS[name] for name in args.layouts}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.measured or args.out or Path(tmp)
        calibration: list[Path] = []
        own: dict[str, list[Path]] = {name: [] for name in layouts}  # each layout's runs at the calibration batches
        measured: dict[tuple[str, int], list[dict]] = {}
        commands: list[str] = []
        own_batches = {name: work.own_calibrate.get(name, work.calibrate) for name in layouts}
        for repeat in range(args.repeats):
            for batch in sorted({*work.calibrate, *(b for batches in own_batches.values() for b in batches)}):
                for workers in (1, 2) if batch in work.calibrate else ():
                    run_dir = out / f"calibrate-w{workers}-b{batch}-r{repeat}"
                    summary = run(work.name, workers, batch, work.flags, run_dir, args.measured is not None)
                    calibration.append(run_dir)
                    commands += [summary["command"]] if repeat == 0 else []
                for name, (train_flags, *_) in layouts.items():
                    # ddp's runs at these batches are the calibration's own
                    if name == "ddp" or batch not in own_batches[name]:
                        continue
                    run_dir = out / run_name(name, batch, repeat)
                    summary = run(work.name, 2, batch, [*work.flags, *train_flags], run_dir, args.measured is not None)
                    own[name].append(run_dir)
                    commands += [summary["command"]] if repeat == 0 else []
            for batch in work.batches:
                for name, (train_flags, *_) in layouts.items():
                    run_dir = out / run_name(name, batch, repeat)
                    summary = run(work.name, 2, batch, [*work.flags, *train_flags], run_dir, args.measured is not None)
                    measured.setdefault((name, batch), []).append(summary)
                    commands += [summary["command"]] if repeat == 0 else []
                    print(f"repeat {repeat + 1} {name} b{batch}: {step_s(summary) * 1e3:.2f} ms", file=sys.stderr)
        print(
            "| layout, 2 workers | batch | measured step (ms), median (runs) | predicted from single and ddp "
            "| error | predicted with the layout's own runs | error | contended |"
        )
        print("|---|---|---|---|---|---|---|---|")
        worst = {"plain": 0.0, "own": 0.0}
        for batch in work.batches:
            for name, (_, plan_flags, strategy, replicas) in layouts.items():
                runs = measured[(name, batch)]
                steps = [step_s(s) for s in runs]
                median = statistics.median(steps)
                cells = []
                for kind, runs_used in (("plain", calibration), ("own", calibration + own[name])):
                    flags = ["--global-batch", str(batch * replicas), *plan_flags]
                    predicted, plan_command = plan(work.plan_model, work.optimizer, runs_used, flags)
                    commands.append(plan_command)
                    row = next(r for r in predicted["rows"] if r["devices"] == 2 and r["strategy"] == strategy)
                    error = (row["step_time_s"] - median) / median
                    worst[kind] = max(worst[kind], abs(error))
                    cells += [f"{row['step_time_s'] * 1e3:.1f} ms", f"{error:+.1%}"]
                shown = ", ".join(f"{t * 1e3:.1f}" for t in steps)
                contended = "yes" if any(s["machine_load"]["contended"] for s in runs) else ""
                print(f"| {name} | {batch} | {median * 1e3:.1f} ms ({shown}) | {' | '.join(cells)} | {contended} |")
        print(
            f"\nlargest error: {worst['plain']:.1%} from single and ddp, "
            f"{worst['own']:.1%} with the layouts' own runs; {args.repeats} repeat(s)"
        )
        print("\ncommands (RUNS: the run directories above):")
        for command in commands:
            print(f"    paratrain {command.replace(str(out), 'RUNS')}")


if __name__ == "__main__":
    main()
