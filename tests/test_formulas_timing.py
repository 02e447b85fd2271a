"""The step-time breakdown (engine/timing.py) against hand-computed cases: what each phase gets, the
clamps that keep the five phases adding up to the step, and the GPU path's deferred event reads
(run here with a clock whose stamps are numbers: CUDA events cannot be made on this machine)."""

from __future__ import annotations

import pytest
import torch

from paratrain.engine.timing import PHASES, Clock, StepBreakdown


def breakdown_of(spans: dict[str, float], steps: int, clock: Clock | None = None) -> dict[str, float]:
    """The means after `steps` steps whose spans (seconds, summed over the steps) are `spans`."""
    timing = StepBreakdown(clock or Clock(torch.device("cpu")))
    for phase, seconds in spans.items():
        timing.span(phase, 10.0, 10.0 + seconds)
    for _ in range(steps):
        timing.step_done()
    return timing.means()


def test_each_phase_per_step_and_other_as_the_rest():
    # Over 2 steps: data 0.02, forward+backward 0.1 of which 0.03 exposed all-reduce, optimizer 0.02 of
    # which 0.005 averaging, the steps 0.2. Per step: data 0.01; compute 0.05 - 0.015 = 0.035;
    # comm 0.015 + 0.0025 = 0.0175; optimizer 0.01 - 0.0025 = 0.0075; other 0.1 - 0.07 = 0.03.
    spans = {"data_s": 0.02, "forward_backward": 0.1, "comm_s": 0.03, "optimizer_s": 0.02, "optimizer_comm_s": 0.005}
    means = breakdown_of({**spans, "step": 0.2}, steps=2)
    assert list(means) == list(PHASES)
    expected = {"data_s": 0.01, "compute_s": 0.035, "comm_s": 0.0175, "optimizer_s": 0.0075, "other_s": 0.03}
    assert means == pytest.approx(expected)
    assert sum(means.values()) == pytest.approx(0.1)


def test_the_clamps_keep_every_phase_within_its_span():
    # Exposed communication longer than forward+backward (clock granularity) is all of it: compute 0.
    means = breakdown_of({"forward_backward": 0.04, "comm_s": 0.05, "step": 0.1}, steps=1)
    assert (means["compute_s"], means["comm_s"]) == pytest.approx((0.0, 0.04))
    # A negative exposure (the last bucket handed over after backward ended) counts as none.
    means = breakdown_of({"forward_backward": 0.04, "comm_s": -0.01, "step": 0.1}, steps=1)
    assert (means["compute_s"], means["comm_s"]) == pytest.approx((0.04, 0.0))
    # Averaging in the optimizer step is at most the step's optimizer time.
    means = breakdown_of({"optimizer_s": 0.01, "optimizer_comm_s": 0.02, "step": 0.1}, steps=1)
    assert (means["optimizer_s"], means["comm_s"]) == pytest.approx((0.0, 0.01))
    # Phases that overran the step leave no negative rest.
    means = breakdown_of({"data_s": 0.2, "step": 0.1}, steps=1)
    assert means["other_s"] == 0.0 and means["data_s"] == pytest.approx(0.2)


def test_no_step_yet_divides_by_one_and_reset_starts_over():
    assert breakdown_of({"data_s": 0.3, "step": 0.5}, steps=0) == pytest.approx(
        {"data_s": 0.3, "compute_s": 0.0, "comm_s": 0.0, "optimizer_s": 0.0, "other_s": 0.2}
    )
    timing = StepBreakdown(Clock(torch.device("cpu")))
    timing.span("data_s", 0.0, 1.0)
    timing.step_done()
    timing.reset()
    timing.span("step", 0.0, 0.25)
    timing.step_done()
    assert timing.means() == pytest.approx(
        {"data_s": 0.0, "compute_s": 0.0, "comm_s": 0.0, "optimizer_s": 0.0, "other_s": 0.25}
    )


class NumberEvents(Clock):
    """The GPU path's clock with numbers for events: stamps kept, read only when the means are."""

    def __init__(self):
        self.cuda = True
        self.reads = 0

    def seconds(self, start, end):
        self.reads += 1
        return end - start


def test_gpu_spans_are_read_once_when_the_means_are_after_one_synchronize(monkeypatch):
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synchronized.append(True))
    clock = NumberEvents()
    timing = StepBreakdown(clock)
    timing.span("data_s", 1.0, 1.5)
    timing.span("step", 1.0, 3.0)
    timing.step_done()
    timing.step_done()
    assert clock.reads == 0 and not synchronized  # nothing read during the steps
    assert timing.means() == pytest.approx(
        {"data_s": 0.25, "compute_s": 0.0, "comm_s": 0.0, "optimizer_s": 0.0, "other_s": 0.75}
    )
    assert (clock.reads, len(synchronized)) == (2, 1)
    assert timing.means()["data_s"] == pytest.approx(0.25)  # read once: the pending spans were cleared
    assert (clock.reads, len(synchronized)) == (2, 1)


def test_the_cpu_clock_reads_the_wall_clock_and_subtracts():
    clock = Clock(torch.device("cpu"))
    start = clock.stamp()
    assert isinstance(start, float) and not clock.cuda
    assert clock.seconds(1.25, 3.0) == 1.75
    assert Clock(torch.device("cuda")).cuda


def test_spans_of_a_phase_add_up_over_the_steps(monkeypatch):
    timing = StepBreakdown(Clock(torch.device("cpu")))
    for _ in range(4):
        timing.span("data_s", 0.0, 0.5)
        timing.span("step", 0.0, 1.0)
        timing.step_done()
    assert timing.means()["data_s"] == pytest.approx(0.5) and timing.means()["other_s"] == pytest.approx(0.5)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    deferred = StepBreakdown(NumberEvents())
    for _ in range(4):
        deferred.span("data_s", 0.0, 0.5)
        deferred.step_done()
    assert deferred.means()["data_s"] == pytest.approx(0.5)


class TimedEvent:
    """torch.cuda.Event's part the clock uses, on the host: record() notes the time (ms between two)."""

    def __init__(self, enable_timing=False):
        self.enable_timing, self.at = enable_timing, None

    def record(self):
        self.at = TimedEvent.now

    def elapsed_time(self, end):
        assert self.enable_timing and end.enable_timing, "events need enable_timing=True to be timed"
        return (end.at - self.at) * 1000.0


def test_the_gpu_clock_records_timing_events_and_reads_them_in_seconds(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", TimedEvent)
    clock = Clock(torch.device("cuda", 0))
    TimedEvent.now = 2.0
    start = clock.stamp()
    TimedEvent.now = 2.25
    end = clock.stamp()
    assert isinstance(start, TimedEvent) and start.enable_timing
    assert clock.seconds(start, end) == pytest.approx(0.25)
