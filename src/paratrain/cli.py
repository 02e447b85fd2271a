"""The `paratrain` command: parse, call one library function, print. No logic lives here.

`train`'s flags are generated from TrainConfig's fields (name, type, default, help), so a flag,
its config-file key and its Python keyword are always the same thing.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError

# Sections of `paratrain train --help`, each starting at the named field (in TrainConfig's order).
TRAIN_SECTIONS = {
    "workload": "what to train",
    "workers": "parallelism",
    "batch_size": "batch, learning rate and optimizer",
    "precision": "compute",
    "seed": "run directory and bookkeeping",
}


# What to do about a path that cannot be made or read, by the error the operating system gave. By
# errno, not exception class: a read-only file system (what root meets where permissions would not
# stop it), a name too long or a full disk are plain OSErrors.
_UNWRITABLE = "pass a path you may write to (or read, for an input), or change its permissions"
FILE_SYSTEM_FIXES = {
    errno.EACCES: _UNWRITABLE,
    errno.EPERM: _UNWRITABLE,
    errno.EROFS: "the file system is read-only; pass a path on a writable one",
    errno.ENOTDIR: "a part of the path is a file, not a directory; pass a path under a directory",
    errno.EISDIR: "it is a directory; pass a file's path",
    errno.ENOENT: "check the path",
    errno.EEXIST: "pass a path that does not exist yet, or remove it",
    errno.ENAMETOOLONG: "a name in the path is longer than the file system allows; pass a shorter one",
    errno.ENOSPC: "the disk is full; free space or pass a path on another disk",
    errno.EDQUOT: "the disk quota is used up; free space or pass a path on another disk",
}


class Parser(argparse.ArgumentParser):
    """argparse, but bad input is one line on stderr and exit status 2 (no usage dump), and no
    abbreviated flags: `--epoch 1` must not quietly mean `--epochs 1`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def unrecognized(self, extras: Sequence[str]) -> typing.NoReturn:
        """Refuse unknown arguments, suggesting the nearest flag for a near miss."""
        flags = [f for f in extras if f.startswith("-")]
        if not flags:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        wrong = flags[0].split("=", 1)[0]
        near = difflib.get_close_matches(wrong, list(self._option_string_actions), n=1, cutoff=0.6)
        self.error(f"unknown option {wrong}" + (f" (did you mean {near[0]}?)" if near else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` belongs to a sweep's or a study's script, untouched by argparse; `launch`
    # hands everything after the script's path to the script (argparse.REMAINDER, as torchrun does).
    cut = "--" in argv and argv[:1] != ["launch"]
    passthrough = argv[argv.index("--") + 1 :] if cut else []
    args, extras = parser.parse_known_args(argv[: len(argv) - len(passthrough) - (1 if cut else 0)])
    if extras:
        parser.commands.get(getattr(args, "command", None), parser).unrecognized(extras)
    if getattr(args, "command", None) in ("sweep", "scale", "slurm"):
        args.script_args = passthrough
    elif cut:
        parser.error("arguments after -- are only for paratrain sweep --script and scale --script")
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except UsageError as exc:
        print(f"paratrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("paratrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`paratrain doctor RUN | head`): what it read is all it wanted. Python's own
        # idiom (signal module docs): point stdout at devnull so the flush at exit raises nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        if exc.filename is None or exc.errno not in FILE_SYSTEM_FIXES:
            raise
        # A path the user passed cannot be made or read: theirs to fix, so one line, not a traceback.
        print(
            f"paratrain {args.command}: error: {exc.filename}: {exc.strerror}; {FILE_SYSTEM_FIXES[exc.errno]}",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        from paratrain.errors import RunFailed

        if isinstance(exc, RunFailed):
            print(f"paratrain {args.command}: {exc}", file=sys.stderr)
            return 1
        raise


def build_parser() -> Parser:
    parser = Parser(prog="paratrain", description="Train PyTorch models in parallel and measure whether it pays off.")
    from paratrain import __version__

    parser.add_argument("--version", action="version", version=f"paratrain {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)

    train = commands.add_parser(
        "train",
        help="train one workload on N workers and write a run directory",
        description="Train one workload on N workers (ranks) and write a run directory "
        "(config.json, metrics.jsonl, summary.json, logs/).",
    )
    train.add_argument("--config", type=Path, help="YAML, TOML or JSON file of these options (flags override it)")
    train.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    _add_model_flags(train, TRAIN_SECTIONS)
    train.set_defaults(handler=_train, command="train")

    scale = commands.add_parser(
        "scale",
        help="scaling study: the same job on 1, 2, 4, ... workers",
        description="Run the same training job on several worker counts and report epoch time "
        "(first epoch excluded), samples/s, speedup, efficiency and accuracy.",
    )
    scale.add_argument("--workers", required=True, help="worker counts, e.g. 1,2,4")
    scale.add_argument(
        "--mode",
        choices=["weak", "strong"],
        default="weak",
        help="weak: per-worker batch fixed, global batch grows (default); strong: global batch fixed and split",
    )
    scale.add_argument("--repeats", type=int, default=1, help="runs per point (median and spread reported)")
    scale.add_argument(
        "--workload", action="append", help="workload(s), comma-separated or repeated (default cifar10-cnn)"
    )
    scale.add_argument(
        "--strategy",
        action="append",
        help="strategies to compare on more than one worker, comma-separated "
        "(e.g. ddp,zero1,fsdp,pipeline); one line each against the same 1-worker run",
    )
    scale.add_argument("--out", type=Path, required=True, help="study directory")
    scale.add_argument("--resume", action="store_true", help="finish an interrupted study, skipping finished points")
    scale.add_argument(
        "--script",
        type=Path,
        help="study your own torchrun-style script (see paratrain launch); "
        "arguments for it go after --; it reports paratrain.report(samples_per_s=...)",
    )
    scale.add_argument(
        "--no-probe",
        dest="probe",
        action="store_false",
        default=argparse.SUPPRESS,
        help="with --script: run the script's ranks without the probe (no step breakdown)",
    )
    scale.add_argument(
        "--quiet", action="store_true", help="no progress bar of the running point; a line per finished point"
    )
    _add_model_flags(scale, TRAIN_SECTIONS, exclude=SCALE_OWNS)
    scale.set_defaults(handler=_scale, command="scale")

    sweep = commands.add_parser(
        "sweep",
        help="hyperparameter search, N trials at once (Optuna; Comet optimizer config format)",
        description="Run a hyperparameter search with N trials at once, each on its own cores/GPUs. CONFIG is a Comet "
        "optimizer file (algorithm grid|random|bayes, parameters, spec). Trials run --script PATH (any "
        "program; parameters as --name value, the metric back via paratrain.report() or its last stdout "
        "line) or a built-in workload made from the train flags. Rerun the same command to resume.",
        epilog="example: paratrain sweep batch.json -j 2 --out runs/sweep --workload cifar10-cnn --epochs 3 "
        "--lr-scaling none",
    )
    sweep.add_argument("config", nargs="?", type=Path, help="the search space (JSON, YAML, or JSON with # comments)")
    sweep.add_argument("-j", "--jobs", type=int, default=1, help="trials at once (default: 1)")
    sweep.add_argument("--out", type=Path, help="sweep directory (required unless --join DIR)")
    sweep.add_argument("--script", type=Path, help="run this program per trial; arguments for it go after --")
    sweep.add_argument(
        "--param-style",
        choices=["space", "equals", "plain", "none"],
        default="space",
        help="parameters as --name value (space), --name=value (equals), name=value (plain, Hydra) or "
        "none (only PARATRAIN_PARAMS JSON in the environment)",
    )
    sweep.add_argument(
        "--workers-per-trial", type=int, default=1, help="data-parallel workers inside each trial (default: 1)"
    )
    sweep.add_argument(
        "--storage", help="Optuna storage URL, e.g. postgresql://user@host/db (default: DIR/study.journal)"
    )
    sweep.add_argument(
        "--join", metavar="DIR_OR_URL", help="add workers to a running sweep (its directory or storage URL)"
    )
    sweep.add_argument("--study-name", help="study name in the storage (default: the config's name)")
    sweep.add_argument(
        "--pruner",
        choices=["auto", "median", "none"],
        default="auto",
        help="stop trials below the median of earlier ones at the same epoch; auto (default): median for "
        "random and bayes, none for a grid or a sweep over a batch size (never pruned by batch)",
    )
    sweep.add_argument("--trial-timeout", type=float, help="seconds before a trial is stopped and recorded as failed")
    sweep.add_argument(
        "--n-trials", type=int, help="start at most N trials in this command, then stop (rerun to continue)"
    )
    sweep.add_argument("--timeout", type=float, help="start no trial after this many seconds; running trials finish")
    sweep.add_argument(
        "--allow-oversubscribe", action="store_true", help="allow -j x --workers-per-trial beyond the cores/GPUs"
    )
    sweep.add_argument("--quiet", action="store_true", help="no live table; a line per trial")
    sweep.add_argument(
        "--no-probe",
        dest="probe",
        action="store_false",
        help="with a .py --script: run each trial's script without the probe (no step breakdown)",
    )
    _add_model_flags(sweep, TRAIN_SECTIONS, exclude=SWEEP_OWNS)
    sweep.set_defaults(handler=_sweep, command="sweep")

    from paratrain.config import LaunchConfig

    about = {name: field.description for name, field in LaunchConfig.model_fields.items()}
    launch = commands.add_parser(
        "launch",
        help="run your own torchrun-style script on N ranks, pinned and monitored, into a run directory",
        description="Run any torchrun-style script (it reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) on N "
        "local ranks under PyTorch's elastic launcher, each rank on its own cores, with the monitor sampling CPU, "
        "memory and GPUs into RUN_DIR/system.jsonl. Everything after the script's path goes to the script. paratrain "
        "exits with the script's exit status. See docs/launch.md.",
        epilog="example: paratrain launch -n 2 --run-dir runs/mine train.py --epochs 3",
    )
    launch.add_argument(
        "-n", "--workers", type=int, default=argparse.SUPPRESS, metavar="N", help=f"{about['workers']} (default: 1)"
    )
    launch.add_argument("--threads-per-worker", type=int, default=argparse.SUPPRESS, help=about["threads_per_worker"])
    launch.add_argument(
        "--allow-oversubscribe", action="store_true", default=argparse.SUPPRESS, help=about["allow_oversubscribe"]
    )
    launch.add_argument("--run-dir", type=Path, default=argparse.SUPPRESS, help=about["run_dir"])
    launch.add_argument(
        "--monitor-hz", type=float, default=argparse.SUPPRESS, help=f"{about['monitor_hz']} (default: 2)"
    )
    launch.add_argument(
        "--no-probe", dest="probe", action="store_false", default=argparse.SUPPRESS, help=about["probe"]
    )
    launch.add_argument("script", type=Path, help=about["script"])
    launch.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    launch.set_defaults(handler=_launch, command="launch")

    report = commands.add_parser("report", help="one self-contained HTML page for a run, a study or several runs")
    report.add_argument("paths", nargs="+", type=Path, help="run or study directories")
    report.add_argument("--out", type=Path, help="the HTML file (default: DIR/report.html, or comparison-report.html)")
    report.set_defaults(handler=_report, command="report")

    compare = commands.add_parser("compare", help="compare runs: final metrics, throughput, overlaid curves")
    compare.add_argument("paths", nargs="+", type=Path, help="two or more run directories")
    compare.add_argument(
        "--out", type=Path, default=Path("comparison-report.html"), help="the HTML page with the overlays"
    )
    compare.set_defaults(handler=_compare, command="compare")

    doctor = commands.add_parser(
        "doctor",
        help="why a run, study or sweep is slow, and what to change",
        description="Read a run, scaling study or sweep directory and print ranked findings: "
        "the evidence (numbers from the run), the cause, the remedy (a command or "
        "code change) and the predicted gain. See docs/doctor.md.",
    )
    doctor.add_argument("path", type=Path, help="a run directory (--run-dir), a scaling study's or a sweep's --out")
    doctor.add_argument("--json", action="store_true", help="print the diagnosis as JSON (for tools)")
    doctor.add_argument(
        "--verify",
        action="store_true",
        help="rerun the run as it was and with the top finding's remedy (when it is a paratrain flag), "
        "alternating, into RUN-verify/, and print the predicted gain beside the measured one",
    )
    doctor.add_argument("--repeats", type=int, default=1, help="--verify: rounds of baseline and remedy runs (median)")
    doctor.set_defaults(handler=_doctor, command="doctor")

    from paratrain.config import PlanConfig

    plan = commands.add_parser(
        "plan",
        help="predict memory, step time and speedup of every strategy on 1 ... N devices, before you queue",
        description="Measure the model here (FLOPs, parameters, activation bytes per sample, on the meta device: "
        "nothing is trained), then predict per-device memory and step time for ddp, zero1, fsdp, pipeline and hybrid "
        "on 1 ... N devices of a table of accelerators (or this machine's cores), which strategies fit, and one "
        "recommendation with its reason. See docs/planner.md.",
        epilog="example: paratrain plan --workload gpt-medium --device a100 --precision bf16 --nodes 8 --gpus-per-node "
        "8",
    )
    for name, field in PlanConfig.model_fields.items():
        option = "--" + name.replace("_", "-")
        if name == "calibrate":
            plan.add_argument(
                option, nargs="+", type=Path, default=argparse.SUPPRESS, metavar="RUN_DIR", help=field.description
            )
            continue
        kind, choices = _flag_type(field.annotation)
        plan.add_argument(
            option,
            type=kind if kind in (int, float) else str,
            choices=choices,
            default=argparse.SUPPRESS,
            metavar=None if choices else name.upper(),
            help=field.description,
        )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (the same numbers as the table)")
    plan.set_defaults(handler=_plan, command="plan")

    workloads = commands.add_parser("workloads", help="list the named workloads and models")
    workloads.set_defaults(handler=_workloads, command="workloads")

    download = commands.add_parser("download-cifar10", help="download the canonical CIFAR-10 archive (needs internet)")
    download.add_argument("data_dir", type=Path, help="directory to put cifar-10-python.tar.gz in")
    download.set_defaults(handler=_download, command="download-cifar10")

    slurm = commands.add_parser(
        "slurm",
        help="sbatch scripts for a run, each point of a scaling study, or a sweep on a SLURM cluster",
        description="Write the sbatch scripts of `paratrain train|scale|sweep` with these flags: one job per run or "
        "study point (--gres, --ntasks-per-node, --cpus-per-task and srun line from its ranks), and for a "
        "study a last job that collects the points into OUT (paratrain report OUT). --submit submits them. "
        "`paratrain slurm scale --help` lists both the study's flags and the SLURM flags. See docs/cluster.md.",
        epilog="example: paratrain slurm scale --workers 1,2,4 --workload cifar10-resnet50v2 --gpus-per-node 4 "
        "--time 00:30:00 --partition gpu --setup 'module load python' --out study",
    )
    slurm.add_argument("target", choices=["train", "scale", "sweep"], help="the command every job runs")
    slurm.add_argument("options", nargs=argparse.REMAINDER, help="that command's flags, and the SLURM flags")
    slurm.set_defaults(handler=_slurm, command="slurm")
    cache = commands.add_parser("cache", help="list the decoded-dataset cache with sizes, or clear it")
    cache.add_argument(
        "--clear",
        nargs="?",
        const="",
        metavar="PREFIX",
        help="delete every entry, or those whose names start with PREFIX",
    )
    cache.add_argument("--cache-dir", type=Path, help="the cache (default $PARATRAIN_CACHE or ~/.cache/paratrain)")
    cache.set_defaults(handler=_cache, command="cache")
    from paratrain.config import CommbenchConfig, flag

    bench = commands.add_parser(
        "commbench",
        help="collective latency and bandwidth on N local ranks, fitted to latency + bytes/bandwidth",
        description="Time all-reduce, broadcast, all-gather and reduce-scatter on the backend (and the shared-memory "
        "average of CPU ranks) from --min-size to --max-size, fit t = alpha + bytes/beta to each, and save "
        "the JSON (paratrain plan --interconnect FILE reads it). See docs/synchronisation.md.",
        epilog="example: paratrain commbench --workers 2 --out commbench.json",
    )
    for name, field in CommbenchConfig.model_fields.items():
        kind, choices = _flag_type(field.annotation)
        if kind is bool:
            bench.add_argument(flag(name), action="store_true", default=argparse.SUPPRESS, help=field.description)
        else:
            bench.add_argument(
                flag(name), type=kind, choices=choices, default=argparse.SUPPRESS, help=field.description
            )
    bench.set_defaults(handler=_commbench, command="commbench")

    from paratrain.batch import COMMAND_OWNED
    from paratrain.config import FindBatchConfig, LRFindConfig, NoiseScaleConfig, RecommendConfig

    for name, model, handler, about, example in (
        (
            "find-batch",
            FindBatchConfig,
            _find_batch,
            "the largest per-worker batch that fits (probe runs, doubling then bisection) and the throughput knee",
            "paratrain find-batch --workload cifar10-cnn --memory-limit 2G --out batch",
        ),
        (
            "noise-scale",
            NoiseScaleConfig,
            _noise_scale,
            "the gradient noise scale B_simple, which predicts the critical batch, measured during a short run",
            "paratrain noise-scale --workers 2 --batch-size 32 --steps 200 --out batch",
        ),
        (
            "lr-find",
            LRFindConfig,
            _lr_find,
            "the LR range test: an exponential LR sweep and the LR it suggests",
            "paratrain lr-find --batch-size 32 --out batch",
        ),
        (
            "recommend",
            RecommendConfig,
            _recommend,
            "batch per worker and in all, LR and its scaling, warmup, "
            "schedule and optimizer for N workers, from find-batch, noise-scale and lr-find",
            "paratrain recommend --workers 2 --epochs 10 --out batch --apply",
        ),
    ):
        command = commands.add_parser(
            name, help=about, description=f"Measure {about}. See docs/batch-size.md.", epilog=f"example: {example}"
        )
        for field_name, field in model.model_fields.items():
            if field_name != "train":
                _add_field(command, field_name, field)
        # recommend chooses the workers itself, and takes a --schedule for the run it recommends.
        batch_owns = (*COMMAND_OWNED, *ACROSS_NODES)
        owned = (*tuple(f for f in batch_owns if f != "schedule"), "workers") if name == "recommend" else batch_owns
        _add_model_flags(command, TRAIN_SECTIONS, exclude=owned)
        command.set_defaults(handler=handler, command=name)
    parser.commands = commands.choices  # for suggestions when a subcommand's flag is mistyped
    return parser


def _commbench(args: argparse.Namespace) -> int:
    from paratrain.commbench import run_commbench
    from paratrain.config import CommbenchConfig, validate

    result = run_commbench(
        validate(CommbenchConfig, {k: v for k, v in vars(args).items() if k not in ("handler", "command")})
    )
    for c in result["collectives"]:
        regimes = []
        for r in c["regimes"]:
            beta = f"{r['beta_bytes_per_s'] / 1e9:.2f} GB/s" if r["beta_bytes_per_s"] else "unbounded"
            upto = (
                ""
                if len(c["regimes"]) == 1
                else "larger: "
                if r["up_to_bytes"] is None
                else f"to {r['up_to_bytes'] // 1024:,}K: "
            )
            regimes.append(f"{upto}alpha {r['alpha_s'] * 1e6:.1f} us, beta {beta}")
        print(f"{c['op']:15} {c['path']:5} worst fit error {c['max_error']:4.0%}  {'; '.join(regimes)}")
    print(f"saved: {result['path']}")
    return 0


# Train flags that `scale` and `sweep` replace with their own. Their runs are on this machine, so the
# flags of a run across nodes are train's only (sweep's own --timeout limits the whole search).
ACROSS_NODES = ("nodes", "node_rank", "rdzv", "rdzv_backend", "rdzv_timeout")
SCALE_OWNS = ("workers", "workload", "strategy", "run_dir", "resume", "quiet", *ACROSS_NODES)
SWEEP_OWNS = ("workers", "run_dir", "resume", "quiet", "allow_oversubscribe", "timeout", *ACROSS_NODES)


def _add_model_flags(parser: argparse.ArgumentParser, sections: dict[str, str], exclude: Sequence[str] = ()) -> None:
    from paratrain.config import TrainConfig

    group: Any = parser
    for name, field in TrainConfig.model_fields.items():
        if name in sections:
            group = parser.add_argument_group(sections[name])
        if name in exclude:
            continue
        _add_field(group, name, field)


def _add_field(group: Any, name: str, field: Any) -> None:
    """One flag from one pydantic field: its name, type, default and description."""
    flag = "--" + name.replace("_", "-")
    default = field.get_default(call_default_factory=True)
    shown = "" if default in (None, [], False) or field.is_required() else f" (default: {_show(default)})"
    kind, choices = _flag_type(field.annotation)
    if kind is bool and default is True:
        # On by default: the flag takes a value so that it can be turned off; pydantic reads the word.
        group.add_argument(
            flag, choices=["true", "false"], default=argparse.SUPPRESS, help=f"{field.description}{shown}"
        )
    elif kind is bool:
        group.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=field.description)
    else:
        group.add_argument(
            flag,
            type=kind,
            choices=choices,
            default=argparse.SUPPRESS,
            metavar=name.upper() if choices is None else None,
            help=f"{field.description}{shown}",
        )


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any], list[str] | None]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if annotation in (bool, int, float):
        return annotation, None
    return str, None


def _cache(args: argparse.Namespace) -> int:
    from rich.table import Table

    from paratrain.workloads.cache import cache_entries, clear_cache
    from paratrain.workloads.datasets import default_cache_dir

    where = args.cache_dir or default_cache_dir()
    if args.clear is not None:
        gone = clear_cache(args.cache_dir, args.clear)
        print(
            f"removed {len(gone)} entr{'y' if len(gone) == 1 else 'ies'}, {_mib(sum(e.size_bytes for e in gone))} from "
            f"{where}"
        )
        return 0
    entries = cache_entries(args.cache_dir)
    table = Table(title=f"dataset cache {where}: {len(entries)} entries, {_mib(sum(e.size_bytes for e in entries))}")
    for col in ("entry", "size", "modified"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for e in entries:
        table.add_row(e.path.name, _mib(e.size_bytes), e.modified)
    _wide_console().print(table)
    return 0


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def _train_values(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if args.config:
        from paratrain.config import load_config_file

        values = load_config_file(args.config)
    values.update({k: v for k, v in vars(args).items() if k not in ("handler", "command", "config", "json")})
    return values


def _train(args: argparse.Namespace) -> int:
    from paratrain import forkserver

    values = _train_values(args)
    # Started before this process imports torch (and pydantic): see paratrain/forkserver.py.
    with forkserver.serving(values.get("workers", 1) != 1):
        from paratrain.launch import train

        summary = train(values)
    if args.json:
        print(json.dumps(summary, indent=2))
    elif "role" in summary:  # a process of a run across nodes or tasks that rank 0 writes
        print(f"{summary['role']}: completed; rank 0 writes the summary to {summary['run_dir']}")
    elif not values.get("quiet"):
        _print_summary(summary)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"paratrain: {summary['strategy']} on {summary['workers']} worker(s)", show_header=False)
    b = summary["breakdown"]
    rows = [
        # Replicas, not workers: the stages of one pipeline share a batch.
        (
            "global batch",
            f"{summary['global_batch_size']} "
            f"({summary['global_batch_size'] // (summary['batch_size'] * summary['grad_accum'])} x "
            f"{summary['batch_size']}{' x ' + str(summary['grad_accum']) if summary['grad_accum'] > 1 else ''})",
        ),
        ("learning rate", f"{summary['lr']:.4g} ({summary['lr_scaling']} from {summary['base_lr']:.4g})"),
        (
            "epoch time",
            f"{summary['epoch_time_s']:.2f} s (median of {summary['timed_epochs']} epoch(s)"
            f"{', first excluded' if summary['timed_epochs'] < summary['epochs'] else ''})",
        ),
        (
            "throughput",
            f"{summary['samples_per_s']:,.0f} samples/s"
            + (f", {summary['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in summary else ""),
        ),
        (
            "step time",
            f"data {b['data_s'] * 1e3:.1f} ms, compute {b['compute_s'] * 1e3:.1f} ms, comm {b['comm_s'] * 1e3:.1f} ms, "
            f"optimizer {b['optimizer_s'] * 1e3:.1f} ms, other {b['other_s'] * 1e3:.1f} ms",
        ),
        *[
            (
                "sent per step",
                " / ".join(f"{n / 2**10:,.0f} KiB" for n in sent) + f" per rank, through {summary['allreduce']}",
            )
            for sent in [summary.get("comm_bytes_per_step")]
            if sent and summary["workers"] > 1
        ],
        *[
            (
                "pipeline",
                f"{p['stages']} stages x {p['dp']} replica(s), {p['schedule']}, {p['microbatches']} micro-batches; "
                f"bubble {'n/a' if summary['bubble_fraction'] is None else format(summary['bubble_fraction'], '.1%')}"
                f" measured, {summary['bubble_fraction_theory']:.1%} in theory",
            )
            for p in [summary.get("pipeline")]
            if p
        ],
        ("train loss", f"{summary['train_loss']:.4f}"),
        (
            f"{summary['val_split']} accuracy",
            f"{summary['val_accuracy']:.2%} (loss {summary['val_loss']:.4f}"
            + (f", {summary['val_bits_per_byte']:.3f} bits/byte)" if "val_bits_per_byte" in summary else ")"),
        ),
        *(
            [
                (
                    "MFU",
                    f"{summary['mfu']:.1%} ({summary['flops_per_sample']:.3g} FLOPs/sample; peak "
                    f"{summary['mfu_peak']['flops_per_s'] / 1e9:,.0f} GFLOP/s, "
                    f"{summary['mfu_peak']['source'].split(':')[0]})",
                )
            ]
            if summary.get("mfu") is not None
            else []
        ),
        ("peak memory", ", ".join(f"{m / 2**20:.0f} MiB" for m in summary["peak_memory_bytes"]) + " per rank"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
        (
            "other load",
            f"{summary['machine_load']['other_fraction']:.0%} of the run's cores went to other work"
            f"{' (contended: timings unreliable)' if summary['machine_load']['contended'] else ''}",
        ),
        ("run dir", summary["run_dir"]),
    ]
    for key, value in rows:
        table.add_row(key, value)
    _wide_console().print(table)


def _scale_values(args: argparse.Namespace) -> dict[str, Any]:
    own = {
        "workers",
        "mode",
        "repeats",
        "workload",
        "strategy",
        "out",
        "resume",
        "script",
        "script_args",
        "probe",
        "quiet",
        "handler",
        "command",
    }
    train = {k: v for k, v in vars(args).items() if k not in own}
    return {
        "workers": args.workers,
        "mode": args.mode,
        "repeats": args.repeats,
        "quiet": args.quiet,
        **({"workload": args.workload} if args.workload else {}),
        **({"strategy": args.strategy} if args.strategy else {}),
        "out": args.out,
        **({"probe": args.probe} if "probe" in vars(args) else {}),
        "resume": args.resume,
        "train": train,
        "script": args.script,
        "script_args": args.script_args,
    }


def _scale(args: argparse.Namespace) -> int:
    from rich.console import Console

    from paratrain import forkserver
    from paratrain.config import ScaleConfig, validate
    from paratrain.reporting import write_report
    from paratrain.reporting.plots import study_plots
    from paratrain.scale import run_study

    study = validate(ScaleConfig, _scale_values(args))
    console = Console(stderr=True)

    def banner() -> None:
        console.print(
            f"[bold]{study.mode} scaling[/] of {study.script.name if study.script else ', '.join(study.workload)} on "
            f"{study.workers} worker(s), "
            f"{study.repeats} run(s) each; on CPU a worker is a rank with its own core(s), and one process "
            "on all cores is measured as the reference; the first epoch of every run is excluded from timing"
        )

    def progress(workload: str, workers: int, repeat: int, summary: dict) -> None:
        # A script reports what it measures: its epoch time and accuracy may be missing.
        shown = [
            f"{summary['samples_per_s']:,.0f} samples/s",
            *([f"epoch {summary['epoch_time_s']:.2f} s"] if summary.get("epoch_time_s") is not None else []),
            *([f"accuracy {summary['val_accuracy']:.2%}"] if summary.get("val_accuracy") is not None else []),
            *(["contended"] if summary.get("machine_load", {}).get("contended") else []),
        ]
        console.print(f"  {Path(summary['run_dir']).name}: {', '.join(shown)}")

    with forkserver.serving(max(study.workers) > 1 and study.script is None):
        result = run_study(study, on_start=banner, on_point=progress)
    study_plots(result, study.out)
    page = write_report([study.out])
    _print_study(result)
    print(f"report: {page}")
    return 0


def _print_study(result: dict[str, Any]) -> None:
    from rich.table import Table

    from paratrain.reporting import study_headline, study_notes, study_table

    columns, rows = study_table(result)
    table = Table(title=f"{result['mode']} scaling (epoch time: median, first epoch excluded)")
    for col in columns:
        table.add_column(col, justify="left" if col in ("workload", "flags") else "right")
    for row in rows:
        table.add_row(*row)
    console = _wide_console()
    console.print(table)
    for line in study_notes(result):
        console.print(f"  {line}", soft_wrap=True, markup=False)
    for line in study_headline(result):
        console.print(line, soft_wrap=True, markup=False, style="bold")


def _launch(args: argparse.Namespace) -> int:
    from paratrain.launch.script import launch_script

    summary = launch_script({k: v for k, v in vars(args).items() if k not in ("handler", "command")})
    reported = ", ".join(f"{k}={v:.4g}" for k, v in summary["reported"].items())
    print(
        f"{summary['status']}: {summary['workers']} rank(s), {summary['wall_time_s']:.1f} s, exit status "
        f"{summary['exit_code']}{'; reported ' + reported if reported else ''}; run dir {summary['run_dir']}"
    )
    if summary["status"] != "completed":
        print(f"paratrain launch: {summary['error']}", file=sys.stderr)
    return summary["exit_code"]


def _sweep_values(args: argparse.Namespace) -> dict[str, Any]:
    own = {
        "config",
        "jobs",
        "out",
        "script",
        "script_args",
        "param_style",
        "workers_per_trial",
        "storage",
        "join",
        "study_name",
        "pruner",
        "trial_timeout",
        "n_trials",
        "timeout",
        "allow_oversubscribe",
        "quiet",
        "probe",
    }
    values = {k: v for k, v in vars(args).items() if k in own}
    values["train"] = {k: v for k, v in vars(args).items() if k not in own | {"handler", "command"}}
    return values


def _sweep(args: argparse.Namespace) -> int:
    from paratrain.config import SweepConfig, validate
    from paratrain.reporting import write_report
    from paratrain.reporting.plots import sweep_plots
    from paratrain.sweep.driver import run_sweep
    from paratrain.sweep.progress import SweepProgress

    cfg = validate(SweepConfig, _sweep_values(args))
    progress: list[SweepProgress] = []

    def ready(sweep, slots, where, items, done) -> None:
        progress.append(SweepProgress(sweep.space.metrics, items, done, cfg.quiet))
        progress[0].console.print(
            f"[bold]sweep[/] {sweep.space.name!r}: {sweep.space.algorithm}, {items} trial(s), "
            f"{len(slots)} at once ({'; '.join(s.describe() for s in slots)}); storage {where}",
            soft_wrap=True,
        )
        progress[0].__enter__()

    def listen(kind, info) -> None:
        progress[0](kind, info)

    try:
        result = run_sweep(cfg, listen, ready)
    finally:
        if progress:
            progress[0].__exit__(None, None, None)
    out = Path(result["out"])
    sweep_plots(result, out)
    page = write_report([out])
    _print_sweep(result)
    print(f"report: {page}")
    return 0


def _print_sweep(result: dict[str, Any]) -> None:
    from rich.table import Table

    from paratrain.reporting import sweep_notes
    from paratrain.sweep.progress import show_params

    metrics = result["metric"]
    table = Table(
        title=f"sweep {result['name']!r}: {', '.join(f'{m} ({o})' for m, o in zip(metrics, result['objective']))}"
    )
    shown_metrics = result["recorded_metrics"]
    for col in ("trial", "params", *shown_metrics, "state"):
        table.add_column(col, justify="left" if col in ("params", "state") else "right")
    for r in result["trials"]:
        shown = [f"{r['metrics'][m]:.4g}" if m in r["metrics"] else "-" for m in shown_metrics]
        state = r["state"].lower() + (f": {r['reason']}" if r["reason"] and r["state"] != "COMPLETE" else "")
        table.add_row(str(r["number"]), show_params(r["params"]), *shown, state[:80])
    console = _wide_console()
    console.print(table)
    best = result["best"]
    if "pareto_front" in best:
        console.print(f"Pareto front: trials {', '.join(str(r['number']) for r in best['pareto_front'])}")
    elif best:
        console.print(
            f"best: trial {best['number']} ({show_params(best['params'])}) {metrics[0]} = {best['value']:.4g}"
        )
    for line in sweep_notes(result):
        console.print(line, soft_wrap=True, markup=False)


def _wide_console():
    """rich wraps tables to 80 columns when stdout is not a terminal; logs and pipes want whole rows."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)


def _slurm(args: argparse.Namespace) -> int:
    from paratrain.config import SlurmConfig, validate
    from paratrain.slurm import write_slurm

    # One parser knows the target's flags and the SLURM flags, so a typo in either is caught
    # (with a suggestion) and `paratrain slurm scale --help` shows both.
    inner = build_parser().commands[args.target]
    inner.prog = f"paratrain slurm {args.target}"
    group = inner.add_argument_group("SLURM")
    for name, field in SlurmConfig.model_fields.items():
        option = "--" + name.replace("_", "-")
        if option in inner._option_string_actions:  # --out of scale and sweep, --nodes of train: one flag
            continue
        kind, _ = _flag_type(field.annotation)
        if kind is bool:
            group.add_argument(option, action="store_true", default=argparse.SUPPRESS, help=field.description)
        elif typing.get_origin(field.annotation) is list:
            group.add_argument(
                option, action="append", default=argparse.SUPPRESS, metavar="LINE", help=field.description
            )
        else:
            group.add_argument(
                option, type=kind, default=argparse.SUPPRESS, metavar=name.upper(), help=field.description
            )
    parsed, extras = inner.parse_known_args(args.options)
    if extras:
        inner.unrecognized(extras)
    if args.target == "train":
        if args.script_args:
            raise UsageError("arguments after -- are only for paratrain slurm sweep --script")
    else:
        parsed.script_args = args.script_args
    values = vars(parsed)
    slurm = {k: values.pop(k) for k in SlurmConfig.model_fields if k in values and k != "out"}
    slurm["out"] = values.pop("out") if args.target == "train" and "out" in values else values.get("out")
    command = {"train": _train_values, "scale": _scale_values, "sweep": _sweep_values}[args.target](
        argparse.Namespace(**values)
    )
    result = write_slurm(args.target, command, validate(SlurmConfig, slurm))
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
    return 0


def _report(args: argparse.Namespace) -> int:
    from paratrain.reporting import write_report

    print(write_report(args.paths, args.out))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from rich.table import Table

    from paratrain.reporting import comparison_rows, held_out_split, write_report
    from paratrain.reporting.verdict import human
    from paratrain.runs import open_run_dir

    if len(args.paths) < 2:
        raise UsageError("compare needs at least two run directories")
    runs = [open_run_dir(p) for p in args.paths]
    rows = comparison_rows(runs)
    table = Table(title="comparison (ratios and differences against the first run)")
    for col in (
        "run",
        "strategy",
        "workers",
        "global batch",
        "samples/s",
        "x first",
        "epoch time",
        "train loss",
        f"{held_out_split(runs)} acc",
        "Δ acc",
        "state/rank",
        "activ./rank",
    ):
        table.add_column(col, justify="left" if col in ("run", "strategy") else "right", no_wrap=col == "run")
    for r in rows:
        table.add_row(
            Path(r["run"]).name,
            r["strategy"] or "-",
            str(r["workers"]),
            str(r["global_batch_size"]),
            f"{r['samples_per_s']:,.0f}",
            f"{r['throughput_vs_first']:.2f}",
            f"{r['epoch_time_s']:.2f} s",
            f"{r['train_loss']:.4f}",
            f"{r['val_accuracy']:.2%}",
            f"{r['val_accuracy_diff']:+.2%}",
            human("model_state_bytes", r["model_state_bytes"]),
            human("activations_peak_bytes", r["activations_peak_bytes"]),
        )
    _wide_console().print(table)
    print(f"overlays: {write_report(args.paths, args.out)}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from paratrain.config import PlanConfig, validate
    from paratrain.plan import run_plan

    cfg = validate(PlanConfig, {k: v for k, v in vars(args).items() if k not in ("handler", "command", "json")})
    result = run_plan(cfg)
    page = _write_plan(result, cfg.out) if cfg.out is not None else None
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_plan(result)
        if page is not None:
            print(f"report: {page}")
    return 0


def _write_plan(result: dict[str, Any], out: Path) -> Path:
    """plan.json, the plots and report.html in `out`; returns the page. Here, in the command, not in
    plan: the planner sits below the reports in the layers (pyproject.toml's import-linter contract)."""
    from paratrain.plan import PLAN_FILE
    from paratrain.reporting import write_report
    from paratrain.reporting.plots import plan_plots
    from paratrain.runs import write_json

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / PLAN_FILE, result)
    plan_plots(result, out)
    return write_report([out])


def _print_plan(result: dict[str, Any]) -> None:
    from rich.table import Table

    from paratrain.reporting.verdict import human

    model, device = result["model"], result["device"]
    table = Table(
        title=f"plan: {model['name']} ({model['params']:,} parameters, {model['flops_per_sample']:.3g} FLOPs/sample) "
        f"on {device['name']} {device['precision']}, {result['optimizer']}"
    )
    for col in (
        "devices",
        "strategy",
        "layout",
        "global batch",
        "step time",
        "samples/s",
        "speedup",
        "efficiency",
        "memory/device",
        "fits",
    ):
        table.add_column(col, justify="left" if col in ("strategy", "layout") else "right")
    for r in result["rows"]:
        layout = (
            f"{r['data_parallel']} x {r['stages']} stages, M={r['microbatches']}"
            if r["stages"] > 1
            else f"{r['data_parallel']} replica(s)"
        )
        table.add_row(
            str(r["devices"]),
            r["strategy"],
            layout,
            str(r["global_batch"]),
            f"{r['step_time_s'] * 1e3:,.2f} ms",
            f"{r['samples_per_s']:,.0f}",
            f"{r['speedup']:.2f}",
            f"{r['efficiency']:.2f}",
            human("rss_peak_bytes", r["memory_per_device_bytes"]),
            "yes" if r["fits"] else "no",
        )
    console = _wide_console()
    console.print(table)
    rec = result["recommendation"]
    console.print(
        f"recommendation: {rec['strategy'] or 'none'} on {rec['devices']} device(s): {rec['reason']}",
        soft_wrap=True,
        markup=False,
        style="bold",
    )
    console.print(
        f"efficiency {device['efficiency']:.3f} of the peak: {device['efficiency_source']}",
        soft_wrap=True,
        markup=False,
    )
    bend = result["pareto"]["bend_devices"]
    if bend:
        console.print(
            f"cost against time bends at {bend} devices: beyond it each halving of the wall time costs more "
            "device-hours",
            soft_wrap=True,
            markup=False,
        )
    console.print(f"backend: {result['backend']['use']} ({result['backend']['why']})", soft_wrap=True, markup=False)


def _doctor(args: argparse.Namespace) -> int:
    from paratrain.doctor import diagnose, format_text

    if args.repeats != 1 and not args.verify:
        raise UsageError(f"--repeats {args.repeats} counts --verify's rounds; add --verify, or drop --repeats")
    if args.verify:
        from paratrain.doctor.verify import format_verify, verify

        result = verify(args.path, args.repeats)
        print(json.dumps(result, indent=2) if args.json else format_verify(result))
        return 0
    diagnosis = diagnose(args.path)
    print(json.dumps(diagnosis, indent=2) if args.json else format_text(diagnosis))
    return 0


def _workloads(args: argparse.Namespace) -> int:
    from paratrain.workloads import WORKLOADS
    from paratrain.workloads.gpt import PRESETS
    from paratrain.workloads.models import MODELS

    for name, workload in WORKLOADS.items():
        print(f"{name:24} {workload.description}")
    print(
        f"\nmodels (--model): {', '.join([*MODELS, *PRESETS])}; datasets (--dataset): cifar10, synthetic, text; "
        "or your own pkg.module:factory for either"
    )
    return 0


def _batch_config(args: argparse.Namespace, model: Any) -> Any:
    """A batch command's own options, with every other flag as the train flags of its runs."""
    from paratrain.config import validate

    own = set(model.model_fields) - {"train"}
    values = {k: v for k, v in vars(args).items() if k in own}
    values["train"] = {k: v for k, v in vars(args).items() if k not in own | {"handler", "command"}}
    return validate(model, values)


def _find_batch(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from paratrain.batch.find_batch import RESULT_FILE, find_batch
    from paratrain.config import FindBatchConfig

    cfg = _batch_config(args, FindBatchConfig)
    console = Console(stderr=True)
    with console.status("find-batch: preparing") as status:

        def on_probe(kind: str, probe: dict[str, Any]) -> None:
            # A spinner, not lines: every probe is in the table at the end, and bad input stays one line.
            if kind == "start":
                status.update(f"find-batch: probing batch {probe['batch']}")
            else:
                status.update(
                    f"find-batch: batch {probe['batch']} "
                    + (f"fits, {probe['samples_per_s']:,.0f} samples/s" if probe["fits"] else "ran out of memory")
                )

        result = find_batch(cfg.train, cfg.out, cfg.margin, cfg.max_batch, cfg.probe_steps, cfg.knee_within, on_probe)
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
    _wide_console().print(table)
    print(
        f"largest batch that fits: {result['max_batch']} (limited by {result['limited_by']}); with the "
        f"{result['margin']:.0%} margin use at most {result['safe_batch']}; knee (within {result['knee_within']:.0%} "
        f"of the best {result['best_samples_per_s']:,.0f} samples/s): {result['knee_batch']}"
    )
    print(f"saved: {Path(cfg.out) / RESULT_FILE}")
    return 0


def _noise_scale(args: argparse.Namespace) -> int:
    from paratrain.batch.noise_scale import RESULT_FILE, measure_noise_scale
    from paratrain.config import NoiseScaleConfig

    cfg = _batch_config(args, NoiseScaleConfig)
    r = measure_noise_scale(cfg.train, cfg.out, cfg.steps, cfg.ema_steps)

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
    print(f"saved: {Path(cfg.out) / RESULT_FILE}")
    return 0


def _lr_find(args: argparse.Namespace) -> int:
    from paratrain.batch.lr_find import RESULT_FILE, find_lr
    from paratrain.config import LRFindConfig

    cfg = _batch_config(args, LRFindConfig)
    r = find_lr(cfg.train, cfg.out, cfg.steps, cfg.lr_min, cfg.lr_max, cfg.target_batch)
    stop = f"diverged at LR {r['diverged_at_lr']:.3g}" if r["diverged_at_lr"] else "did not diverge"
    print(
        f"LR range test {r['lr_min']:g} -> {r['lr_max']:g} over {r['steps']} steps at global batch "
        f"{r['global_batch_size']}: {stop}"
    )
    print(f"suggested LR {r['suggested_lr']:.3g} ({r['rule']}); steepest descent: {r['steepest_lr']:.3g}")
    s = r["scaled"]
    print(f"for global batch {s['global_batch_size']}: LR {s['lr']:.3g} ({s['scaling']} scaling)")
    print(f"saved: {Path(cfg.out) / RESULT_FILE}")
    return 0


def _recommend(args: argparse.Namespace) -> int:
    from rich.console import Console

    from paratrain.batch.recommend import RESULT_FILE, recommend
    from paratrain.config import RecommendConfig

    cfg = _batch_config(args, RecommendConfig)
    console = Console(stderr=True)
    r = recommend(
        cfg.train,
        cfg.workers,
        cfg.out,
        cfg.noise_steps,
        cfg.lr_steps,
        cfg.max_batch,
        on_stage=lambda stage: console.print(f"recommend: {stage}"),
    )
    for key in ("per_worker_batch", "global_batch", "lr", "warmup_epochs", "schedule", "optimizer"):
        value = r[key]["value"]
        print(
            f"{key.replace('_', ' '):17} {value:.4g}  "
            if isinstance(value, float)
            else f"{key.replace('_', ' '):17} {value}  ",
            f"({r[key]['source']})",
            sep="",
        )
    for note in r["notes"]:
        print(f"note: {note}")
    if cfg.apply:
        print(r["command"])
    print(f"saved: {Path(cfg.out) / RESULT_FILE}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from paratrain.workloads.datasets import download_cifar10

    print(download_cifar10(args.data_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
