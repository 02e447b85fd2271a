"""What the user watches during a sweep: a live table on a terminal, one line per event otherwise."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def show_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def show_values(values: Any) -> str:
    if values is None:
        return "-"
    return ", ".join(f"{v:.4g}" for v in values)


class SweepProgress:
    """A listener for the driver: call it with ("start" | "report" | "end", info)."""

    def __init__(self, metrics: tuple[str, ...], total: int, already_done: int, quiet: bool):
        self.console = Console(stderr=True)
        self.metrics = metrics
        self.live_view = self.console.is_terminal and not quiet
        self.running: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.progress = Progress(
            TextColumn("trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[counts]}"),
            console=self.console,
        )
        self.task = self.progress.add_task("trials", total=total, completed=already_done, counts="")
        self.counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        # Live re-renders `self` (via __rich__) twice a second, so elapsed times tick between events.
        self.live = Live(self, console=self.console, refresh_per_second=2, transient=True) if self.live_view else None

    def __enter__(self) -> SweepProgress:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        with self.lock:
            number = info["number"]
            if kind == "start":
                self.running[number] = {**info, "started": time.perf_counter(), "last": ""}
                if not self.live_view:
                    self.console.print(f"trial {number} started on {info['slot']}: {show_params(info['params'])}")
            elif kind == "report":
                shown = {m: info["metrics"][m] for m in self.metrics if m in info["metrics"]}
                if number in self.running and shown:
                    self.running[number]["last"] = f"step {info['step']}: " + show_params(shown)
            else:
                self.running.pop(number, None)
                state = info["state"]
                self.counts[state] = self.counts.get(state, 0) + 1
                if not (info.get("reason") or "").startswith("interrupted"):
                    self.progress.advance(self.task)
                self.progress.update(
                    self.task, counts=", ".join(f"{n} {s.lower()}" for s, n in self.counts.items() if n)
                )
                result = show_values(info.get("values")) if state == "COMPLETE" else info.get("reason") or state.lower()
                line = f"trial {number} {state.lower()}: {show_params(info['params'])} -> {result}"
                if self.live is not None:
                    self.live.console.print(line)
                else:
                    self.console.print(line)

    def __rich__(self) -> Group:
        table = Table(title="running trials", title_justify="left", expand=False)
        for col in ("trial", "params", "elapsed", "last report"):
            table.add_column(col)
        for number, r in sorted(self.running.items()):
            table.add_row(
                str(number), show_params(r["params"]), f"{time.perf_counter() - r['started']:.0f} s", r["last"]
            )
        return Group(self.progress, table)
