"""The device's own time per step and phase, on GPU ranks: CUDA events at the outermost phase boundaries."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from paratrain.launch.probe import DEVICE_PHASES


class HostEvent:
    """A stand-in for torch.cuda.Event(enable_timing=True) on the host clock (tests without a GPU)."""

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()
        self.stream = stream

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.at - self.at) * 1e3


def tensor_device(torch: Any, module: Any, args: tuple[Any, ...]) -> Any:
    """The CUDA device a training forward runs on: its first parameter's, else its first input's; None on
    the CPU. The script may have moved the model to cuda:1 without making it the current device, so the
    current device is not asked."""
    for tensor in [*module.parameters(), *(a for a in args if isinstance(a, torch.Tensor))]:
        if tensor.device.type == "cuda":
            return tensor.device
    return None


class DeviceTimeline:
    """Events recorded on the current stream of the device the model runs on, at the outermost phase
    boundaries (torch.cuda.Event(enable_timing=True).record(stream), PyTorch's idiom for timing device
    work). An event is read only once the device has passed it (Event.query() is True), a step or more
    later, so the timeline adds no host-device synchronisation."""

    def __init__(self, make_event: Callable[[], Any], stream: Callable[[], Any] = lambda: None):
        self.make_event, self.stream = make_event, stream
        self.start: Any = None
        self.spans: list[tuple[str, Any, Any]] = []
        self.open: tuple[str, Any] | None = None
        self.pending: list[tuple[int, Any, Any, list[tuple[str, Any, Any]]]] = []

    def _event(self) -> Any:
        event = self.make_event()
        event.record(self.stream())
        return event

    def enter(self, phase: str) -> None:
        if self.start is None:
            self.start = self._event()
        if phase in DEVICE_PHASES:
            self.open = (phase, self._event())

    def leave(self, phase: str) -> None:
        if self.open is not None and self.open[0] == phase:
            self.spans.append((phase, self.open[1], self._event()))
            self.open = None

    def end_step(self, step: int) -> list[dict[str, Any]]:
        """Close this step; return the records of the steps the device has finished. Events are dropped as
        soon as they are read, so a long run holds only the few steps the device has not yet passed."""
        if self.start is not None:
            self.pending.append((step, self.start, self._event(), self.spans))
        self.start, self.spans, self.open = None, [], None
        done = []
        while self.pending and self.pending[0][2].query():
            step, start, end, spans = self.pending.pop(0)
            record: dict[str, Any] = {
                "kind": "device",
                "step": step,
                "span_s": round(start.elapsed_time(end) / 1e3, 6),
                **dict.fromkeys(DEVICE_PHASES, 0.0),
            }
            for phase, began, ended in spans:
                record[phase] = round(record[phase] + began.elapsed_time(ended) / 1e3, 6)
            done.append(record)
        return done


def device_timeline(torch: Any, device: Any, stand_in: bool) -> DeviceTimeline | None:
    """A timeline on `device` (a CUDA device the model's tensors are on), or the host-clock stand-in; None
    for a CPU model. CUDA is never initialised here: a script that has put a model on a GPU has done so."""
    if stand_in:
        return DeviceTimeline(HostEvent)
    if device is None:
        return None
    cuda = torch.cuda
    return DeviceTimeline(lambda: cuda.Event(enable_timing=True), lambda: cuda.current_stream(device))
