"""The rank-side probe: where the time of an unmodified training script goes, step by step.

`paratrain launch` (and `scale --script`, and sweep `--script` trials) start each rank of a Python
script as `python -m paratrain.launch.probe script.py ...` (`command()`) instead of `python script.py ...`:
the probe installs itself, then runs the script as `__main__`, with its own argv and sys.path[0], the way
the interpreter would. Nothing imports torch before the script does: the hooks go in when the script
itself imports torch (a post-import hook), so a script that sets OMP_NUM_THREADS or CUDA_VISIBLE_DEVICES
before `import torch` behaves exactly as without the probe. That is why this package uses the standard
library only at module level (torch is handed to its functions), and why `import paratrain`, which it
runs under, imports no torch (the import-linter contract in pyproject.toml).

What it hooks, all at the torch level, so DDP, FSDP2, a bare model and frameworks on top
(Lightning, Accelerate) are seen alike (hooks.py):
    optimizer step   torch.optim's global step pre/post hooks: the step boundary, and its own time
    data             DataLoader iterators' __next__ (the wait for the next batch); what each loader reads
    forward          the outermost nn.Module call; a call without grad, or of a module in eval mode, is
                     evaluation; a call inside backward (activation checkpointing's recompute) is neither
    backward         torch.autograd.backward (what loss.backward() calls)
    recompute        the checkpointed functions torch.utils.checkpoint runs again inside backward
    communication    collectives called from Python (torch.distributed.*, Work.wait: FSDP2's, a model's own,
                     the script's) and, for DDP, the tail of backward after its last gradient bucket was
                     handed to the all-reduce: the communication backward did not hide
    checkpoint       torch.save
    host syncs       counted, not timed: Tensor.item/.tolist/.cpu/.numpy of a GPU tensor and
                     torch.cuda.synchronize (each drains the device's queue)
    garbage          Python's collections, timed by gc.callbacks, whichever phase they interrupt
Time is charged exclusively to the innermost phase (a forward inside Lightning's optimizer closure
is forward, not optimizer); what no phase claims is `other` (Python, logging, host reads).
For a few steps after warm-up torch.profiler records what ran (window.py): the trace says which
operators, Python functions and modules the time of each phase went to.

Each rank appends JSON lines to RUN_DIR/probe/rank<R>.jsonl: a `state` record when what it saw
changes (torch's threads, DataLoader workers, DDP's settings, dtypes, loaders), a `step` record per
optimizer step (seconds per phase, samples, all-reduce rounds), and a `fallback` record if a hook ever
failed: the probe then steps aside for the rest of the run and the script goes on untouched.
launch/probe_summary.py turns the files into summary.json's `breakdown` and `probe` blocks.
"""

from __future__ import annotations

import sys

RUN_DIR_ENV = "PARATRAIN_RUN_DIR"
# `collective`: a collective the script itself calls between the phases (a loss averaged for a log
# line, a barrier); `comm`: one inside forward or backward (FSDP2's, a model's own, DDP's exposed tail).
# `recompute`: forward work activation checkpointing runs again inside backward.
PHASES = (
    "data",
    "forward",
    "backward",
    "recompute",
    "comm",
    "collective",
    "optimizer",
    "eval",
    "checkpoint",
    "other",
)
# On GPU ranks the phases' host times are the time to launch their kernels; CUDA events recorded at the
# outermost phase boundaries give the device's own. Tests name "cpu" here for a host-clock stand-in.
DEVICE_EVENTS_ENV = "PARATRAIN_PROBE_DEVICE_EVENTS"
DEVICE_PHASES = ("forward", "backward", "optimizer", "eval")
# Host reads of a device tensor wait for the device's queue to drain: a host-device synchronisation.
# They are counted on this device type (a CUDA build's GPU; tests name "cpu" as a stand-in, since a
# CPU tensor's read is no sync at all).
SYNC_DEVICE_ENV = "PARATRAIN_PROBE_SYNC_DEVICE"
# "0" turns the profiler window off (benchmarks/probe_overhead.py measures the hooks alone with it).
TRACE_ENV = "PARATRAIN_PROBE_TRACE"
# The profiled steps' trace. The rank writes plain JSON: gzip (torch's export at level 9) stalled a rank whose
# steps run much Python for 5-20 s after its profiled steps; the launcher compresses it after the run.
RAW_TRACE_FILE = "trace-rank{rank}.json"
TRACE_FILE = RAW_TRACE_FILE + ".gz"
# Calibration: a per-device batch this small or smaller gets its forward and backward timed at a larger
# batch once (the small-batch check's measured slope), on copies of the model's own layers; so do a
# rank with more threads than cores, and a model in float64 (at float32 too).
SMALL_BATCH = 16
CALIBRATION_STEP = 3  # after warm-up: the first steps allocate and fill caches
# After this many steps (and the calibration, if any) the global module hooks give way to hooks on the
# outermost modules seen so far.
NARROW_AFTER_STEP = CALIBRATION_STEP


def command(script: str) -> list[str]:
    """How a probed rank (or sweep trial) starts: `python -m paratrain.launch.probe SCRIPT ARGS...`. The
    probe runs as the program and runs the script as __main__; `import paratrain` imports no torch, so
    the script still imports it first."""
    return [sys.executable, "-m", "paratrain.launch.probe", script]
