"""Every command's flags come from its config model (#28): a field added to a config is a flag of its
command, with its help, without an edit to the CLI; a train flag means the same in every command
that takes train flags; and the CLI and a Python caller of paratrain.commands get the same result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pydantic import Field

import paratrain.config
from paratrain import commands
from paratrain.cli import COMMANDS, build_parser, main
from paratrain.config import PlanConfig, ScaleConfig, TrainConfig, cli_options, validate
from paratrain.config.command_line import config_values


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A command's arguments by destination (flags and positionals)."""
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def _flag_commands() -> dict[str, type]:
    """Each command's config model; slurm's flags are its target's and SlurmConfig's, parsed from its options."""
    return {name: getattr(paratrain.config, c.config) for name, c in COMMANDS.items() if name != "slurm"}


def test_every_command_has_its_help_from_its_config():
    parsers = build_parser().commands
    for name, c in COMMANDS.items():
        text = getattr(paratrain.config, c.config).command_text
        assert text.help and parsers[name].description == (text.description or None), name


def test_every_field_of_every_command_is_a_flag_with_its_description():
    parsers = build_parser().commands
    checked = 0
    for name, model in _flag_commands().items():
        actions = _actions(parsers[name])
        own = [f for f, field in model.model_fields.items() if f != "train" and not cli_options(field).get("hidden")]
        for field_name in own:
            assert field_name in actions, (name, field_name)
            assert actions[field_name].help.startswith(model.model_fields[field_name].description), (name, field_name)
            checked += 1
        if "train" in model.model_fields:
            left_out = {*model.model_fields, *model.train_flags_left_out}
            expected = {f for f in TrainConfig.model_fields if f not in left_out}
            taken = {dest for dest in actions if dest in TrainConfig.model_fields and dest not in model.model_fields}
            assert taken == expected, (name, taken ^ expected)
            checked += len(expected)
        extra = set(actions) - set(model.model_fields) - set(TrainConfig.model_fields) - {"json", "config_file"}
        assert not extra, (name, extra)  # nothing declared by hand beside the config
    assert checked > 400


def test_a_field_added_to_a_config_is_a_flag_of_its_command_and_of_those_that_take_train_flags(monkeypatch):
    class Study(ScaleConfig):
        warm_runs: int = Field(0, ge=0, description="untimed runs before each point")

    class Train(TrainConfig):
        dropout: float = Field(0.0, ge=0, description="dropout probability of the model's head")

    monkeypatch.setattr(paratrain.config, "ScaleConfig", Study)
    monkeypatch.setattr(paratrain.config, "TrainConfig", Train)
    parsers = build_parser().commands
    assert _actions(parsers["scale"])["warm_runs"].help.startswith("untimed runs before each point")
    for name in ("train", "scale", "sweep", "find-batch", "noise-scale", "lr-find", "recommend"):
        assert _actions(parsers[name])["dropout"].help.startswith("dropout probability"), name
    assert "warm_runs" not in _actions(parsers["train"])
    # parsed into the model: the study's own field at the top, the train field inside `train`
    args = parsers["scale"].parse_args(["--workers", "1,2", "--out", "study", "--warm-runs", "2", "--dropout", "0.1"])
    values = config_values(Study, {k: v for k, v in vars(args).items() if k != "command"})
    study = validate(Study, values)
    assert (study.warm_runs, study.train, study.workers) == (2, {"dropout": 0.1}, [1, 2])  # typed by the flag


def test_a_train_flag_means_the_same_in_every_command_that_takes_it():
    parsers = build_parser().commands
    helps: dict[str, set[str]] = {}
    for name, model in _flag_commands().items():
        if "train" not in model.model_fields and model is not TrainConfig:
            continue
        for dest, action in _actions(parsers[name]).items():
            if dest in TrainConfig.model_fields and dest not in model.model_fields:
                helps.setdefault(dest, set()).add(action.help)
    assert len(helps) > 60
    assert all(len(texts) == 1 for texts in helps.values()), {k: v for k, v in helps.items() if len(v) > 1}


def test_list_flags_repeat_and_split_on_commas():
    parsers = build_parser().commands
    args = parsers["plan"].parse_args(
        ["--workload", "cifar10-cnn", "--device", "a100", "--gpus", "8,16", "--gpus", "64"]
    )
    plan = validate(PlanConfig, config_values(PlanConfig, {k: v for k, v in vars(args).items() if k != "command"}))
    assert plan.gpus == [8, 16, 64]


def test_plan_from_python_writes_what_the_cli_writes(tmp_path, capsys):
    flags = ["--workload", "cifar10-cnn", "--device", "a100", "--gpus", "1,8"]
    assert main(["plan", *flags, "--out", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    result = commands.plan(PlanConfig(workload="cifar10-cnn", device="a100", gpus=[1, 8], out=tmp_path / "python"))
    assert Path(result["report"]) == tmp_path / "python" / "report.html"
    files = {p.name for p in (tmp_path / "cli").iterdir()}
    assert files == {p.name for p in (tmp_path / "python").iterdir()} and "report.html" in files
    from_cli = json.loads((tmp_path / "cli" / "plan.json").read_text())
    from_python = json.loads((tmp_path / "python" / "plan.json").read_text())
    assert from_cli["rows"] == from_python["rows"] and from_cli["rows"]


@pytest.mark.parametrize("argv", [["report"], ["doctor", "a", "--repeats", "2"], ["compare", "a"]])
def test_the_reading_commands_refuse_through_their_configs(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
