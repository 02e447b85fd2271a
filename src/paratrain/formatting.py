"""Numbers written as a person writes them, shared by the analysis modules and the reports.

Below every layer that prints (plan's reasons, the reports, the CLI), so each of them can use it
without importing another's module.
"""

from __future__ import annotations


def size(n: float) -> str:
    """Bytes in the unit a person would pick: 840 KiB, 41 MiB, 1.3 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}" if n < 10 * scale else f"{n / scale:,.0f} {unit}"
    return f"{n / 2**10:,.0f} KiB"
