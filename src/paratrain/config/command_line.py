"""Every config field as an argparse flag: one generator for every command's flags.

A field's name is the flag (`batch_size` is `--batch-size`), its type and choices the flag's, its
description the help, its default the one shown; `cli(...)` in a field's `json_schema_extra` says when
it is not a plain `--name VALUE`. Defaults stay unset on the command line, so that the model applies
its own and knows which fields were given.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any


def add_config_flags(parser: argparse.ArgumentParser, model: Any, skip: Sequence[str] = ()) -> None:
    """One flag (or argument) per field of `model`, in its order, under its `flag_sections`; a
    `train` field brings TrainConfig's flags, less the model's own and its `train_flags_left_out`."""
    # Looked up in the package at each call: a caller (or a test) that puts a subclass there gets its flags.
    from paratrain.config import TrainConfig, cli_options

    group: Any = parser
    sections = getattr(model, "flag_sections", {})
    for name, field in model.model_fields.items():
        if name in sections:
            group = parser.add_argument_group(sections[name])
        how = cli_options(field)
        if name in skip or how.get("hidden"):
            continue
        if name == "train" and model is not TrainConfig:
            left_out = {*model.model_fields, *getattr(model, "train_flags_left_out", ())}
            add_config_flags(parser, TrainConfig, skip=[f for f in TrainConfig.model_fields if f in left_out])
            continue
        _add_field(group, name, field, how)


def _add_field(group: Any, name: str, field: Any, how: dict[str, Any]) -> None:
    """One flag from one pydantic field: its name, type, default and description. Defaults stay
    unset (SUPPRESS), so that the model applies its own and knows which fields were given."""
    default = field.get_default(call_default_factory=True)
    kind, choices = _flag_type(field.annotation)
    # Nothing, off and 0 go unsaid: the description says what they mean.
    said = "(default" in (field.description or "")
    silent = field.is_required() or default in (None, [], False) or "flag" in how or said
    shown = "" if silent else f" (default: {_show(default)})"
    many = typing.get_origin(field.annotation) is list
    options: dict[str, Any] = {"help": f"{field.description}{shown}"}
    if how.get("positional"):
        nargs = {"...": argparse.REMAINDER}.get(how.get("nargs"), how.get("nargs"))
        group.add_argument(name, **({"nargs": nargs} if nargs else {}), **options)
        return
    names = [how["short"]] if "short" in how else []
    names.append(how.get("flag", "--" + name.replace("_", "-")))
    options["default"] = argparse.SUPPRESS
    if kind is bool and default is True and "flag" in how:
        options.update(action="store_false", dest=name)  # --no-probe
    elif kind is bool and default is True:
        # On by default: the flag takes a value so that it can be turned off; pydantic reads the word.
        options.update(choices=["true", "false"])
    elif kind is bool:
        options.update(action="store_true")
    elif "nargs" in how:
        options.update(
            nargs=how["nargs"], metavar=how.get("metavar"), **({"const": how["const"]} if "const" in how else {})
        )
    elif many:
        # Repeatable, and comma-separated where the model splits its values (config.comma_separated).
        options.update(action="append", metavar=how.get("metavar", name.upper()))
    else:
        options.update(
            type=kind, choices=choices, metavar=how.get("metavar", name.upper() if choices is None else None)
        )
    group.add_argument(*names, **options)


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
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


def config_values(model: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Parsed flags as `model`'s input: its own fields, and the rest as its `train` values."""
    values = {k: v for k, v in given.items() if k in model.model_fields}
    if "train" in model.model_fields:
        values["train"] = {k: v for k, v in given.items() if k not in model.model_fields}
    return values
