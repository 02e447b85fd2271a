"""What a rank's DataLoader workers cost it when they share its cores, measured in the run itself."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# DataLoader workers that share the rank's cores with torch's threads: in a few steps the rank's workers are
# stopped from the batch's arrival to the next fetch (or the step's end), so forward and backward run as
# they would without them: the first after warm-up, then every PAUSE_EVERY steps, PAUSES times in all.
PAUSE_FIRST_STEP = 10
PAUSE_EVERY = 16
PAUSES = 12


@contextmanager
def random_streams_kept(torch: Any) -> Iterator[None]:
    """torch's, Python's and NumPy's random streams as they were before the block: what the probe reads from a
    dataset in the rank (a batch, a sample) leaves the script's own draws unchanged."""
    import random

    numpy = sys.modules.get("numpy")
    states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state() if numpy else None)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        if numpy:
            numpy.random.set_state(states[2])


class WorkerPause:
    """What a rank's DataLoader workers cost it when they share its cores, measured in the run itself.

    The counterfactual "no workers on these cores" is run for real: in a few steps the workers of the
    iterator that delivered the step's first batch are stopped (SIGSTOP) from that batch's arrival until
    the next fetch or the step's end, and the forward and backward time of the micro-steps begun in
    between is kept apart. Stopping them is safe: the batches they prefetched (2 per worker by default)
    stay in the queue, a later fetch resumes them first (the rank never waits on a stopped worker), and
    the step's end, a hook failure and the interpreter's exit all resume them. The workers' own CPU time
    (/proc/<pid>/stat) per batch is what their loading would cost inside the rank without them.
    Only where torch's threads and the workers outnumber the rank's cores: elsewhere nothing is stopped."""

    def __init__(self) -> None:
        self.stopped: list[int] = []
        self.batches: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.due = False
        self.taken = 0

    def count(self, iterator: Any) -> None:
        try:
            self.batches[iterator] = self.batches.get(iterator, 0) + 1
        except TypeError:  # an iterator that cannot be weakly referenced is not measured
            pass

    @staticmethod
    def cpu_s(pids: list[int]) -> float | None:
        """User and system CPU seconds of these processes so far; None where /proc cannot tell."""
        total = 0
        try:
            for pid in pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            return None
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self, iterator: Any, threads: int, cores: int) -> dict[str, Any] | None:
        """At a due step's first batch: stop the iterator's workers when they crowd the rank's cores, and
        return the reading that goes into the step record (workers' CPU so far, batches delivered)."""
        self.due = False
        workers = getattr(iterator, "_workers", None) or []
        pids = [w.pid for w in workers if getattr(w, "pid", None)]
        if not pids or threads + len(pids) <= cores or iterator not in self.batches:
            return None
        cpu = self.cpu_s(pids)
        if cpu is None:
            return None
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                self.stopped.append(pid)
            except OSError:
                pass
        self.taken += 1
        return {"loader_id": id(iterator), "loader_cpu_s": round(cpu, 3), "loader_batches": self.batches[iterator]}

    def inline_load_s(self, iterator: Any, batch: int, torch: Any) -> float | None:
        """Seconds to prepare one batch of `batch` samples in the rank's own process, as the remedy
        (num_workers=0) would: the iterator's own dataset and collate function on fixed indices, timed
        while the workers are stopped. Every random stream is restored, so the script's data and
        augmentation are unchanged. None for an iterable dataset (no index to fetch) or any error."""
        dataset, collate = getattr(iterator, "_dataset", None), getattr(iterator, "_collate_fn", None)
        if (
            dataset is None
            or collate is None
            or batch <= 0
            or not getattr(iterator, "_auto_collation", False)
            or isinstance(dataset, torch.utils.data.IterableDataset)
        ):
            return None
        started = time.perf_counter()
        try:
            with random_streams_kept(torch):
                size = len(dataset)
                indices = [(self.taken * batch + j) % size for j in range(batch)]
                fetch_many = getattr(dataset, "__getitems__", None)
                collate(fetch_many(indices) if fetch_many else [dataset[i] for i in indices])
            return time.perf_counter() - started
        except Exception:
            return None

    def resume(self) -> None:
        pids, self.stopped = self.stopped, []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:  # the worker has gone (its iterator shut down)
                pass
