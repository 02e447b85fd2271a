"""Peak memory of one run on one rank, not of the process's whole life.

A rank can run inside a process that trained before (`--workers 1` runs in the calling process:
scaling studies, sweeps' in-process trials, notebooks). Both counters paratrain reads are
high-water marks that never go down by themselves, so each run resets them when it starts:
- GPUs: `torch.cuda.max_memory_allocated`, reset by `torch.cuda.reset_peak_memory_stats`; at the
  end the caching allocator's blocks go back to the driver (`torch.cuda.empty_cache`) so the next
  run in the process starts from what it allocates itself.
- CPU: the process's peak resident set (`VmHWM` in /proc/self/status), reset by writing 5 to
  /proc/self/clear_refs (Linux 4.0 and newer); elsewhere `ru_maxrss`, which cannot be reset.
"""
from __future__ import annotations

import re
import resource
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_memory(device: torch.device) -> None:
    """Start counting this run's peak from what is resident now."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        pass    # no /proc (not Linux) or not allowed: the peak then covers the process's life


def peak_memory_bytes(device: torch.device) -> int:
    """The largest memory this run has held on `device` since `reset_peak_memory`."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        match = None
    if match:
        return int(match.group(1)) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024    # Linux reports KiB


def release_cached_memory(device: torch.device) -> None:
    """Give the caching allocator's free blocks back, so the next run in this process is not charged."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
