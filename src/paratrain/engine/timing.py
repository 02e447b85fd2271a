"""The step-time breakdown: where each optimizer step's time goes.

Phases are marked with timestamps: wall-clock reads on CPU, CUDA events on GPUs, so that timing
never forces a host sync in the middle of a step; GPU events are resolved into seconds at the loop's
log points, which wait for the device anyway (every --log-every steps), so that no more than a log
interval's events are ever held.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

PHASES = ("data_s", "compute_s", "comm_s", "optimizer_s", "other_s")


class Clock:
    """Timestamps on the device's timeline."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            return start.elapsed_time(end) / 1000.0
        return end - start


class StepBreakdown:
    """Seconds per optimizer step spent in each phase.

    - `data_s`: waiting for the batch (indexing, host-to-device copy, augmentation);
    - `compute_s`: forward and backward, minus the exposed communication;
    - `comm_s`: exposed communication: the part of backward after the last gradient bucket was
      handed to the all-reduce, i.e. the synchronisation that computation did not hide, plus
      communication inside the optimizer step (local SGD's parameter averaging, a parameter
      server's push and pull), which nothing overlaps;
    - `optimizer_s`: the optimizer step, that communication excluded;
    - `other_s`: the rest (loss bookkeeping, LR update, Python overhead).
    The five add up to the step time.
    """

    def __init__(self, clock: Clock):
        self.clock = clock
        self.pending: list[tuple[str, Any, Any]] = []
        self.totals: dict[str, float] = defaultdict(float)
        self.steps = 0

    def span(self, phase: str, start: Any, end: Any) -> None:
        """Add one span to a phase: data_s, forward_backward, comm_s, optimizer_s, optimizer_comm_s or step."""
        if self.clock.cuda:
            self.pending.append((phase, start, end))
        else:
            self.totals[phase] += end - start

    def step_done(self) -> None:
        self.steps += 1

    def resolve(self) -> None:
        """Add the pending CUDA events' spans to the totals and let the events go (module docstring)."""
        if self.pending:
            torch.cuda.synchronize()
            for phase, start, end in self.pending:
                self.totals[phase] += self.clock.seconds(start, end)
            self.pending.clear()

    def means(self) -> dict[str, float]:
        self.resolve()
        n = max(self.steps, 1)
        t = {
            phase: self.totals.get(phase, 0.0) / n
            for phase in ("data_s", "forward_backward", "comm_s", "optimizer_s", "optimizer_comm_s", "step")
        }
        comm = min(max(t["comm_s"], 0.0), t["forward_backward"])
        in_step = min(t["optimizer_comm_s"], t["optimizer_s"])
        out = {
            "data_s": t["data_s"],
            "compute_s": t["forward_backward"] - comm,
            "comm_s": comm + in_step,
            "optimizer_s": t["optimizer_s"] - in_step,
        }
        out["other_s"] = max(t["step"] - sum(out.values()), 0.0)
        return out

    def reset(self) -> None:
        self.pending.clear()
        self.totals.clear()
        self.steps = 0
