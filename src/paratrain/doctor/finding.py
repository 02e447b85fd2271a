"""A finding of the doctor, and the few formats its texts share."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Finding:
    check: str
    finding: str
    evidence: str
    cause: str
    remedy: str
    predicted_gain: str
    saving: float | None  # predicted fraction of time saved; None: not a time finding (accuracy, advice)
    severity: str = ""
    # When the remedy is a paratrain flag: the configuration changes it makes (rerun_command's), which
    # `doctor --verify` applies; None for a code change or advice.
    rerun: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.severity:
            s = self.saving
            self.severity = "advice" if s is None else "high" if s >= 0.3 else "medium" if s >= 0.1 else "low"

    @property
    def predicted_speedup(self) -> float | None:
        """The saving as a speed-up factor (2.0: twice as fast); None for advice."""
        return None if self.saving is None else 1 / max(1 - self.saving, 0.005)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "predicted_speedup": self.predicted_speedup}


def accumulation(per_micro_step: float, per_step: float, comm: float) -> tuple[int, float, float]:
    """Accumulating g micro-steps per all-reduce: g x the per-micro-step work, then the all-reduce and
    the per-step work (optimizer, ...) once, for g times the samples. g is the smallest power of two
    up to 8 that brings the all-reduce under 10 % of that. Returns g, the time of g micro-steps, and
    the saved fraction against g steps now."""
    now = per_micro_step + per_step + comm
    for g in (2, 4, 8):
        new = g * per_micro_step + per_step + comm
        if comm / new <= 0.10:
            break
    return g, new, 1 - new / (g * now)
