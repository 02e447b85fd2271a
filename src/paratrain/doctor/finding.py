"""A finding of the doctor, and the few formats its texts share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The share of the step a finding saves (or its cause takes) from which it is high, and medium.
SEVERITY_HIGH = 0.3
SEVERITY_MEDIUM = 0.1


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
    # Where the time goes: the line of code, the layer or the setting that spends it.
    where: str | None = None
    # The measured share of the step the cause takes. Severity follows it where it is larger than the saving
    # (a remedy whose size is unknown saves a bound, not less of the time).
    share: float | None = None
    # The gain is an upper bound ("up to 4.8x if data preparation were free"), not a prediction.
    bound: bool = False
    # Seconds per step of each probe phase this finding accounts for (doctor/ledger.py): what no finding
    # accounts for is reported as unexplained.
    explains: dict[str, float] = field(default_factory=dict)
    # On a contended machine: whether the contention could not explain this finding (doctor.tempered), so
    # it ranks above the contention caveat.
    above_contention: bool = False
    # Other work measured on the finding's own cores explains it whole (a rank running the same work slower on a
    # core other work shared): on a contended machine it ranks after the caveat whatever its share.
    contention_explains: bool = False
    # What the remedy does to the global batch: 8.0 multiplies it by 8, 0.25 divides it by 4; None leaves it. Remedies
    # moving it in opposite directions contradict each other (doctor.one_voice keeps the higher-ranked one).
    global_batch_factor: float | None = None

    def __post_init__(self) -> None:
        if not self.severity:
            s = self.saving if self.share is None or self.saving is None else max(self.saving, self.share)
            self.severity = (
                "advice" if s is None else "high" if s >= SEVERITY_HIGH else "medium" if s >= SEVERITY_MEDIUM else "low"
            )

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
