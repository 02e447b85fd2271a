"""The progress bar rank 0 shows while it trains (rich); silent with --quiet or off a terminal."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class EpochProgress:
    # Redrawing costs CPU time on the rank's own core, so the bar is told about steps in chunks and
    # repaints twice a second at most.
    UPDATE_EVERY = 10

    def __init__(self, enabled: bool, epochs: int, steps_per_epoch: int):
        self.enabled = enabled
        self.epochs = epochs
        self.steps = steps_per_epoch
        self.progress: Progress | None = None
        self.task = None
        self._pending = 0
        if enabled:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TextColumn("{task.fields[loss]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                refresh_per_second=2,
                transient=False,
            )
            self.progress.start()

    def start_epoch(self, epoch: int) -> None:
        if self.progress:
            self.task = self.progress.add_task(f"epoch {epoch + 1}/{self.epochs}", total=self.steps, rate="", loss="")
            self._pending = 0

    def advance(self) -> None:
        if self.progress:
            self._pending += 1
            if self._pending >= self.UPDATE_EVERY:
                self.progress.advance(self.task, self._pending)
                self._pending = 0

    def show(self, samples_per_s: float, loss: float) -> None:
        if self.progress:
            self.progress.update(self.task, rate=f"{samples_per_s:,.0f} samples/s", loss=f"loss {loss:.4f}")

    def end_epoch(self) -> None:
        if self.progress:
            self.progress.update(self.task, completed=self.steps)

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
