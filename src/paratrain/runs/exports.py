"""Exports a run's config asks for (`--mlflow`), run by the launcher once summary.json is written.

An exporter reads the finished run directory and adds what the analysis modules make of it
(MLflow's attaches the HTML report), so it sits above the launcher in the layers (pyproject.toml's
import-linter contract) and the launcher cannot import it. The package root registers it here
instead (paratrain/__init__.py, which Python imports before any module of the package), and the
launcher runs what is registered: every run of `paratrain.train`, whichever command starts it
(train, each point of scale, a sweep's trial, ...), is exported as its config asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Exporter:
    # Before the run directory is touched: refuses a config this exporter cannot serve (a missing package).
    check: Callable[[Any], None]
    # After summary.json: exports the run (if its config asks) and returns the keys to add to the summary.
    export: Callable[[Any, Path], dict[str, Any]]


_registered: list[Exporter] = []


def register(exporter: Exporter) -> None:
    if exporter not in _registered:
        _registered.append(exporter)


def check_exports(config: Any) -> None:
    for exporter in _registered:
        exporter.check(config)


def export_run(config: Any, run_dir: Path) -> dict[str, Any]:
    added: dict[str, Any] = {}
    for exporter in _registered:
        added.update(exporter.export(config, run_dir))
    return added
