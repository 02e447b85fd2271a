"""Numbers written as a person writes them: the one place for the terminal, the HTML pages, the
doctor's findings and the planner's reasons alike.

Below every layer that prints (plan's reasons, the doctor, the reports, the CLI), so each of them
can use it without importing another's module.
"""

from __future__ import annotations

import math
from typing import Any


def size(n: float) -> str:
    """Bytes in the unit a person would pick: 840 KiB, 41 MiB, 1.3 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}" if n < 10 * scale else f"{n / scale:,.0f} {unit}"
    return f"{n / 2**10:,.0f} KiB"


def seconds(value: float) -> str:
    """A duration: 140 s, 2.35 s, 12.5 s, 40.0 ms."""
    if value >= 100:
        return f"{value:,.0f} s"
    if value >= 0.1:
        return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    return f"{value * 1e3:.1f} ms"


def ms(value: float) -> str:
    """Seconds in milliseconds: 3.2 ms, 140 ms."""
    return f"{value * 1e3:.1f} ms" if value < 0.1 else f"{value * 1e3:,.0f} ms"


def rate(value: float) -> str:
    """A throughput: 1,234, 48.9, 0.93 (three figures below 100, none after the point above)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def significant(value: float, figures: int = 3) -> str:
    """A predicted figure to the precision a prediction has, `figures` significant ones: 16,800, 267,
    1.23, 0.0456 (a rate measured is written by `rate`)."""
    if value == 0:
        return "0"
    rounded = float(f"{value:.{figures}g}")
    decimals = max(figures - 1 - math.floor(math.log10(abs(rounded))), 0)
    return f"{rounded:,.{decimals}f}"


def pct(fraction: float) -> str:
    """A share: 35%, 0.4%."""
    return f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.1%}"


def speedup(saving: float) -> str:
    """A saved fraction of time as the speed-up it buys."""
    return f"{1 / (1 - saving):.2f}x faster" if saving < 0.995 else "more than 100x faster"


# Keys whose values are fractions, shown as percentages.
_PERCENT_KEYS = ("accuracy", "mfu", "fraction")


def human(key: str, value: Any) -> str:
    """A value as a person writes it, guided by its key's name (accuracy as %, seconds, MiB, ...)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(human(key, v) for v in value) if value else "-"
    if isinstance(value, dict):
        return "; ".join(f"{k} {human(k, v)}" for k, v in value.items()) if value else "-"
    if isinstance(value, (int, float)) and key.endswith("_bytes"):
        return size(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if not isinstance(value, float):
        return str(value)
    if value != value:
        return "-"
    if any(k in key for k in _PERCENT_KEYS):
        return f"{value:.1%}"
    if key.endswith("_per_s"):
        return f"{value:,.0f}"
    if key.endswith("_s"):
        return seconds(value)
    if "loss" in key or "bits_per_byte" in key:
        return f"{value:.3f}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
