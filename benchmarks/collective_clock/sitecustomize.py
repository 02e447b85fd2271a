"""Benchmark-only: every collective a training rank calls, timed (benchmarks/fsdp_exposed.py puts this directory
on PYTHONPATH and names an output directory in PARATRAIN_COLLECTIVE_CLOCK; nothing happens without both).

Off CUDA, FSDP2 issues its all-gathers and reduce-scatters with async_op=False (torch's _fsdp_param_group.py:
`unshard_async_op` is False, no streams on CPU), so a CPU rank is blocked for as long as each call lasts: the
time inside them is the rank's exposed communication, its wait for the other rank's arrival included. Each call
is appended to <dir>/rank<R>.jsonl as it ends (op, unix start, seconds, bytes): multiprocessing's spawned ranks leave
through os._exit, which runs no atexit handler.
"""

import functools
import json
import os
import time

OPS = ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def _bytes(args: tuple) -> int:
    """The whole buffer, as commbench counts it: an all-gather's output, a reduce-scatter's input."""
    return max((a.numel() * a.element_size() for a in args[:2] if hasattr(a, "numel")), default=0)


def _install(out: str) -> None:
    import torch.distributed as dist

    def timed(name, call):
        @functools.wraps(call)
        def wrapper(*args, **kwargs):
            wall, start = time.time(), time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                with open(os.path.join(out, f"rank{dist.get_rank()}.jsonl"), "a") as f:
                    f.write(json.dumps({"op": name, "unix": wall, "seconds": seconds, "bytes": _bytes(args)}) + "\n")

        return wrapper

    for name in OPS:
        setattr(dist, name, timed(name, getattr(dist, name)))


# In every process of the run: paratrain's ranks may be forked from a server started before any rank existed.
if os.environ.get("PARATRAIN_COLLECTIVE_CLOCK"):
    _install(os.environ["PARATRAIN_COLLECTIVE_CLOCK"])
