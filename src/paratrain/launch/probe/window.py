"""A few steps recorded by torch.profiler: which operators (with dtypes and shapes), Python functions and
modules each phase's time went to.

After warm-up (the calibration and the narrowing of the module hooks done), the probe starts torch's profiler
(Kineto; CUDA kernels too where the script uses a GPU) with Python stacks, shapes and FLOPs, for
TRACE_STEPS steps, or one step when a step is long. Its phases are marked in the trace as
`paratrain:<phase>` ranges (torch.profiler.record_function), so each operator and Python call can be
charged to the phase it ran in. The trace goes to RUN_DIR/probe/trace-rank<R>.json (plain JSON: compressing it
here stalled the rank; the launcher compresses it to .json.gz after the run), in the Chrome trace
format that Perfetto, TensorBoard's profiler and HolisticTraceAnalysis read; launch/trace_summary.py
reads it for the doctor. The profiled steps run slower (Python calls are recorded): their records say
`profiled` and no mean includes them.
"""

from __future__ import annotations

from typing import Any

WINDOW_AFTER_STEP = 5  # the first profiled step is the next one
TRACE_STEPS = 3
LONG_STEP_S = 1.0  # steps longer than this are profiled one at a time: a trace of a few seconds is enough


class TraceWindow:
    def __init__(self, path: str, enabled: bool):
        self.path, self.enabled = path, enabled
        self.profiler: Any = None
        self.ranges: list[Any] = []
        self.left = 0
        self.active = False
        self.missing: str | None = None  # why no trace was written, for the doctor to say

    def step(self, torch: Any, steps: int, last_step_s: float) -> bool:
        """At each step's end: start the profiler after WINDOW_AFTER_STEP, stop it after the profiled steps.
        True when it started or stopped (the caller restarts its clock: that is no part of any step)."""
        if self.active:
            self.left -= 1
            if self.left <= 0:
                self._stop()
                return True
            return False
        if not self.enabled or steps != WINDOW_AFTER_STEP or self.profiler is not None:
            return False
        self.enabled = False
        from torch.autograd.profiler import _is_profiler_enabled

        if _is_profiler_enabled:  # the script profiles itself: leave it its profiler
            self.missing = "the script runs torch.profiler itself at this step: the probe left it its profiler"
            return False
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(activities=activities, record_shapes=True, with_flops=True, with_stack=True)
        self.profiler.start()
        self.left = 1 if last_step_s > LONG_STEP_S else TRACE_STEPS
        self.active = True
        self._annotate = torch.profiler.record_function
        return True

    def enter(self, phase: str) -> None:
        if self.active:
            mark = self._annotate(f"paratrain:{phase}")
            mark.__enter__()
            self.ranges.append(mark)

    def leave(self) -> None:
        if self.active and self.ranges:
            self.ranges.pop().__exit__(None, None, None)

    def _stop(self) -> None:
        while self.ranges:
            self.ranges.pop().__exit__(None, None, None)
        self.active = False
        try:
            self.profiler.stop()
            self.profiler.export_chrome_trace(self.path)
        except Exception as exc:  # the trace is the doctor's, never worth the script's run
            self.missing = f"torch.profiler could not record or write the trace: {type(exc).__name__}: {exc}"[:300]
        self.profiler = None

    def abandon(self) -> None:
        """The run ends (or the probe falls back) inside the window: stop without writing a trace."""
        if self.active:
            self.active = False
            self.ranges.clear()
            try:
                self.profiler.stop()
            except Exception:
                pass
            self.profiler = None
