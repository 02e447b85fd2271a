"""How much of the run's cores other work took while the ranks trained (summary.json `machine_load`).

A timing is only as good as the machine was quiet. The launching process reads the kernel's
per-core CPU counters and the CPU time of its own process tree before and after the ranks run:
whatever the run's cores were busy with that the run did not account for is other work, and on a
virtual machine `steal` is time the hypervisor gave to someone else while a core wanted to run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from paratrain.launch.placement import available_cores
from paratrain.measure.monitor import tree_cpu_seconds

# Other work above this share of the run's core capacity (cores x wall time) marks a run contended:
# time taken from the run on that scale exceeds the few per cent by which repeats on a quiet machine
# differ, while one competing busy process on a run's core takes about half of it.
CONTENDED_ABOVE = 0.10


@dataclass(frozen=True)
class LoadReading:
    time_s: float
    busy_s: float  # user + nice + system, summed over the measured cores
    steal_s: float
    tree_cpu_s: float  # this process and its descendants, including those already reaped


def read_load(cores: Sequence[int]) -> LoadReading:
    per_core = psutil.cpu_times(percpu=True)
    mine = [per_core[c] for c in cores if c < len(per_core)]
    # Linux counts guest time inside user and nice already; iowait is idle time. Interrupt time is
    # left out: the kernel charges it to no process, and much of it is the run's own (loopback traffic).
    busy = sum(t.user + t.nice + t.system for t in mine)
    steal = sum(getattr(t, "steal", 0.0) for t in mine)
    return LoadReading(time.perf_counter(), busy, steal, tree_cpu_seconds(psutil.Process()))


def machine_load(start: LoadReading, end: LoadReading, cores: int) -> dict[str, Any]:
    """The `machine_load` record of summary.json from two readings over `cores` cores."""
    wall = end.time_s - start.time_s
    run_cpu = end.tree_cpu_s - start.tree_cpu_s
    other = max(0.0, end.busy_s - start.busy_s - run_cpu)  # counters tick at 10 ms: never below zero
    steal = end.steal_s - start.steal_s
    fraction = (other + steal) / (cores * wall) if wall > 0 else 0.0
    return {
        "cores": cores,
        "wall_s": wall,
        "run_cpu_s": run_cpu,
        "other_cpu_s": other,
        "steal_s": steal,
        "other_fraction": fraction,
        "contended": fraction > CONTENDED_ABOVE,
    }


class LoadMeter:
    """Started right before the ranks, finished right after: measures the cores the ranks were
    pinned to, or every core this process may use when they are not pinned (GPU ranks, oversubscribed)."""

    def __init__(self, cpu_sets: list[list[int]] | None):
        self.cores = sorted({c for cores in cpu_sets for c in cores}) if cpu_sets else available_cores()
        self.start = read_load(self.cores)

    def finish(self) -> dict[str, Any]:
        return machine_load(self.start, read_load(self.cores), len(self.cores))
