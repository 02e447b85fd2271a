"""The `paratrain` command: parse flags into a command's config, call its function, print the result.

Every command's flags are generated from its config model (config/) by `add_config_flags`
(config/command_line.py): a flag, its config-file key and its Python keyword are the same thing, and
a field added to a model is a flag with its help without an edit here. A model with a `train` field
takes every train flag too. The work is in commands.py (what `import paratrain` callers call); the printing in
reporting/terminal.py. What is left here is argparse and the exit statuses.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.config.command_line import add_config_flags, config_values
from paratrain.errors import RunFailed, UsageError

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
# A flag of the CLI itself, not of a command's config: where train's flags are read from (and --json,
# how a result is printed, in `Command.json`).
CONFIG_HELP = "YAML, TOML or JSON file of these options (flags override it)"


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


# -- the commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """A subcommand: its config model (whose `command_text` gives its help), the function that runs
    it from the validated config and prints, and the help of its --json when it has one."""

    name: str
    config: str  # the config model's name in paratrain.config
    run: Callable[[Any, argparse.Namespace], int]  # the validated config and the CLI's own flags -> exit status
    json: str = ""


def _train(values: dict[str, Any], args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.config import TrainConfig, validate

    if args.config_file:
        from paratrain.config import load_config_file

        values = {**load_config_file(args.config_file), **values}
    # Checked here, before torch is imported (seconds): a mistake is one line at once. The fork server still
    # starts before this process imports torch (forkserver.py).
    validate(TrainConfig, values)
    summary = commands.train(values, fork_server=True)
    from paratrain.reporting import terminal

    if args.json:
        terminal.show_json(summary)
    elif "role" in summary:  # a process of a run across nodes or tasks that rank 0 writes
        print(f"{summary['role']}: completed; rank 0 writes the summary to {summary['run_dir']}")
    elif not values.get("quiet"):
        terminal.show_train(summary)
    return 0


def _scale(cfg: Any, args: argparse.Namespace) -> int:
    from rich.console import Console

    from paratrain import commands
    from paratrain.reporting import terminal

    banner, point = terminal.study_progress(Console(stderr=True), cfg)
    result = commands.scale(cfg, on_start=banner, on_point=point, fork_server=True)
    terminal.show_study(result)
    print(f"report: {result['report']}")
    return 0


def _sweep(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal
    from paratrain.sweep.progress import SweepProgress

    progress: list[SweepProgress] = []

    def ready(sweep, slots, where, items, done) -> None:
        progress.append(SweepProgress(sweep.space.metrics, items, done, cfg.quiet))
        progress[0].console.print(
            f"[bold]sweep[/] {sweep.space.name!r}: {sweep.space.algorithm}, {items} trial(s), "
            f"{len(slots)} at once ({'; '.join(s.describe() for s in slots)}); storage {where}",
            soft_wrap=True,
        )
        progress[0].__enter__()

    try:
        result = commands.sweep(cfg, lambda kind, info: progress[0](kind, info), ready)
    finally:
        if progress:
            progress[0].__exit__(None, None, None)
    terminal.show_sweep(result)
    print(f"report: {result['report']}")
    return 0


def _launch(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    summary = commands.launch(cfg)
    terminal.show_launch(summary)
    if summary["status"] != "completed":
        print(f"paratrain launch: {summary['error']}", file=sys.stderr)
    return summary["exit_code"]


def _report(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands

    print(commands.report(cfg))
    return 0


def _compare(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    terminal.show_compare(commands.compare(cfg))
    return 0


def _doctor(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    result = commands.doctor(cfg)
    terminal.show_json(result) if args.json else terminal.show_doctor(result, cfg.verify)
    return 0


def _plan(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    result = commands.plan(cfg)
    if args.json:
        terminal.show_json({k: v for k, v in result.items() if k != "report"})
        return 0
    terminal.show_plan(result)
    if "report" in result:
        print(f"report: {result['report']}")
    return 0


def _workloads(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    terminal.show_workloads(commands.workloads(cfg))
    return 0


def _download(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands

    print(commands.download_cifar10(cfg))
    return 0


def _cache(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    terminal.show_cache(commands.cache(cfg))
    return 0


def _commbench(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.reporting import terminal

    terminal.show_commbench(commands.commbench(cfg))
    return 0


def _find_batch(cfg: Any, args: argparse.Namespace) -> int:
    from rich.console import Console

    from paratrain import commands
    from paratrain.batch.find_batch import RESULT_FILE
    from paratrain.reporting import terminal

    with Console(stderr=True).status("find-batch: preparing") as status:
        result = commands.find_batch(cfg, terminal.find_batch_status(status))
    terminal.show_find_batch(result, Path(cfg.out) / RESULT_FILE)
    return 0


def _noise_scale(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.batch.noise_scale import RESULT_FILE
    from paratrain.reporting import terminal

    terminal.show_noise_scale(commands.noise_scale(cfg), Path(cfg.out) / RESULT_FILE)
    return 0


def _lr_find(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.batch.lr_find import RESULT_FILE
    from paratrain.reporting import terminal

    terminal.show_lr_find(commands.lr_find(cfg), Path(cfg.out) / RESULT_FILE)
    return 0


def _recommend(cfg: Any, args: argparse.Namespace) -> int:
    from rich.console import Console

    from paratrain import commands
    from paratrain.batch.recommend import RESULT_FILE
    from paratrain.reporting import terminal

    console = Console(stderr=True)
    result = commands.recommend(cfg, on_stage=lambda stage: console.print(f"recommend: {stage}"))
    terminal.show_recommend(result, cfg.apply, Path(cfg.out) / RESULT_FILE)
    return 0


def _slurm(cfg: Any, args: argparse.Namespace) -> int:
    from paratrain import commands
    from paratrain.config import SlurmConfig, validate
    from paratrain.reporting import terminal

    # One parser knows the target's flags and the SLURM flags, so a typo in either is caught
    # (with a suggestion) and `paratrain slurm scale --help` shows both.
    target = COMMANDS[args.target]
    inner = Parser(prog=f"paratrain slurm {args.target}", **_parser_texts(target))
    _add_arguments(inner, target)
    group = inner.add_argument_group("SLURM")
    shared = [n for n in SlurmConfig.model_fields if "--" + n.replace("_", "-") in inner._option_string_actions]
    add_config_flags(group, SlurmConfig, skip=shared)  # --out of scale and sweep, --nodes of train: one flag
    parsed, extras = inner.parse_known_args(args.options)
    if extras:
        inner.unrecognized(extras)
    if args.target == "train" and args.script_args:
        raise UsageError("arguments after -- are only for paratrain slurm sweep --script")
    values = _given(parsed)
    if args.target == "train" and parsed.config_file:
        from paratrain.config import load_config_file

        values = {**load_config_file(parsed.config_file), **values}
    if args.target != "train":
        values["script_args"] = args.script_args
    slurm = {k: values.pop(k) for k in SlurmConfig.model_fields if k in values and k != "out"}
    slurm["out"] = values.pop("out") if args.target == "train" and "out" in values else values.get("out")
    command = values if args.target == "train" else config_values(_model(target.config), values)
    terminal.show_slurm(commands.slurm(args.target, command, validate(SlurmConfig, slurm)))
    return 0


COMMANDS = {
    c.name: c
    for c in (
        Command("train", "TrainConfig", _train, json="print the summary as JSON on stdout"),
        Command("scale", "ScaleConfig", _scale),
        Command("sweep", "SweepConfig", _sweep),
        Command("launch", "LaunchConfig", _launch),
        Command("report", "ReportConfig", _report),
        Command("compare", "CompareConfig", _compare),
        Command("doctor", "DoctorConfig", _doctor, json="print the diagnosis as JSON (for tools)"),
        Command("plan", "PlanConfig", _plan, json="print the plan as JSON (the same numbers as the table)"),
        Command("workloads", "WorkloadsConfig", _workloads),
        Command("download-cifar10", "DownloadConfig", _download),
        # its flags are its target's and SlurmConfig's, parsed from its options (_slurm)
        Command("slurm", "SlurmConfig", _slurm),
        Command("cache", "CacheConfig", _cache),
        Command("commbench", "CommbenchConfig", _commbench),
        Command("find-batch", "FindBatchConfig", _find_batch),
        Command("noise-scale", "NoiseScaleConfig", _noise_scale),
        Command("lr-find", "LRFindConfig", _lr_find),
        Command("recommend", "RecommendConfig", _recommend),
    )
}


def _model(name: str) -> Any:
    import paratrain.config

    return getattr(paratrain.config, name)


def _parser_texts(command: Command) -> dict[str, str | None]:
    text = _model(command.config).command_text
    return {
        "description": text.description or None,
        "epilog": f"example: {text.example}" if text.example else None,
    }


def _add_arguments(parser: argparse.ArgumentParser, command: Command) -> None:
    """A command's arguments: its config's flags, and the CLI's own (--config, --json) where it has them."""
    if command.name == "train":
        parser.add_argument("--config", dest="config_file", type=Path, help=CONFIG_HELP)
    if command.json:
        parser.add_argument("--json", action="store_true", help=command.json)
    if command.name == "slurm":
        parser.add_argument("target", choices=["train", "scale", "sweep"], help="the command every job runs")
        parser.add_argument("options", nargs=argparse.REMAINDER, help="that command's flags, and the SLURM flags")
    else:
        add_config_flags(parser, _model(command.config))
    parser.set_defaults(command=command.name)


def build_parser() -> Parser:
    from paratrain import __version__

    parser = Parser(prog="paratrain", description="Train PyTorch models in parallel and measure whether it pays off.")
    parser.add_argument("--version", action="version", version=f"paratrain {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS.values():
        help_text = _model(command.config).command_text.help
        _add_arguments(commands.add_parser(command.name, help=help_text, **_parser_texts(command)), command)
    parser.commands = commands.choices  # for suggestions when a subcommand's flag is mistyped
    return parser


CLI_ONLY = ("command", "config_file", "json", "target", "options")


def _given(parsed: argparse.Namespace) -> dict[str, Any]:
    """The flags given (defaults are unset), without the CLI's own."""
    return {k: v for k, v in vars(parsed).items() if k not in CLI_ONLY}


def _run(args: argparse.Namespace) -> int:
    command = COMMANDS[args.command]
    if command.name == "train":
        return command.run(_given(args), args)  # validated after the fork server starts (_train)
    if command.name == "slurm":
        return command.run(None, args)  # its target's config and its own, from its options (_slurm)
    from paratrain.config import validate

    model = _model(command.config)
    return command.run(validate(model, config_values(model, _given(args))), args)


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
    if not hasattr(args, "command"):
        parser.print_help()
        return 2
    try:
        return _run(args)
    except UsageError as exc:
        print(f"paratrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"paratrain {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"paratrain {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
