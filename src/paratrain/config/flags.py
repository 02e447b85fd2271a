"""How a config field becomes a flag, and the readers every command shares: config files, sizes, and
validation errors as one line naming the flag."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib
import yaml
from pydantic import BaseModel, ValidationError

from paratrain.errors import UsageError


def cli(**how: Any) -> dict[str, Any]:
    """How a field appears on the command line when not as `--field-name VALUE`, for
    `Field(..., json_schema_extra=cli(...))`. Keys: positional (an argument, not a flag); nargs ("?",
    "+", or "..." for everything after it, as torchrun takes a script's arguments); short ("-n");
    flag (its spelling when it differs: --no-probe turns off a field that is on by default); metavar;
    const (the value of a flag given without one); hidden (never a flag: set after `--`, or by Python)."""
    return {"cli": how}


def cli_options(field: Any) -> dict[str, Any]:
    """What `cli(...)` declared for a pydantic field (empty for a plain flag)."""
    extra = field.json_schema_extra
    return extra.get("cli", {}) if isinstance(extra, dict) else {}


def comma_separated(value: Any) -> Any:
    """A list flag's input: '1,2,4', or ['1,2', '4'] from a flag given twice, -> ['1', '2', '4']."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [part.strip() for v in value for part in v.split(",") if part.strip()]
    return value


@dataclass(frozen=True)
class CommandText:
    """A command's words on the command line: its one-line help (in `paratrain --help`), the
    description atop its own --help, and an example command line."""

    help: str
    description: str = ""
    example: str = ""


_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """'2G', '512M', '1.5G', '1048576' -> bytes (binary units; a trailing B or iB is allowed)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a size; write it like 2G, 512M or 1.5G")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML, TOML or JSON config file into a dict of TrainConfig keys (dashes allowed)."""
    if path.is_dir():
        raise UsageError(f"config file {path} is a directory; pass a .yaml, .toml or .json file")
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist; pass an existing .yaml, .toml or .json file")
    try:
        text = path.read_text()
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    # UnicodeDecodeError (not UTF-8 text), json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors.
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(f"config file {path} does not parse: {first}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of option names to values")
    return {key.replace("-", "_"): value for key, value in data.items()}


def validate(model: type[BaseModel], values: dict[str, Any]) -> Any:
    """Build `model` from `values`, turning the first validation error into a one-line UsageError."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        # Every missing required option in one message, so a user fixes them in one go.
        missing = [flag(".".join(str(part) for part in e["loc"])) for e in exc.errors() if e["type"] == "missing"]
        if missing:
            raise UsageError(
                f"missing required option{'s' if len(missing) > 1 else ''} {', '.join(missing)}; see --help"
            ) from None
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            raise UsageError(f"unknown option {flag(where)}; see --help for the options") from None
        got = error.get("input")
        shown = f" (got {got!r})" if where and not isinstance(got, dict) and "(got" not in message else ""
        prefix = f"{flag(where)}: " if where else ""
        raise UsageError(f"{prefix}{message}{shown}") from None


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")
