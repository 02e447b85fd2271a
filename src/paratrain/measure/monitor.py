"""The monitor: a sampler thread in the launching process that records what the machine, the ranks
and the GPUs were doing, into RUN_DIR/system.jsonl (one JSON object per line, flushed per sample).

    {"time": unix s, "kind": "host", "cpu_percent": [per core], "memory_used_bytes": int}
    {"time": ..., "kind": "rank", "rank": r, "pid": p, "cpu_percent": 100 = one core busy,
     "tree_cpu_percent": the same of the rank and its child processes (DataLoader workers),
     "rss_bytes": int, "num_threads": int, "cores": [the rank's CPU affinity]}
    {"time": ..., "kind": "gpu", "index": CUDA device number, "utilization_percent": ...,
     "memory_used_bytes": ..., "memory_total_bytes": ..., "power_w": ..., "sm_clock_mhz": ...}

It never runs inside a rank: the ranks' processes are read from outside through /proc (psutil),
so the training loop pays nothing per step. Each figure covers the interval since the previous
sample: psutil's CPU percentages are differences of cumulative CPU times, so a process's first
reading only sets the baseline and its samples start one interval after it was found (never a
bogus 0). Which process is which rank is read from the process itself (see `ranks_by_log` and
`ranks_by_environment`).

GPU figures come from NVML (`nvidia-ml-py`, imported as `pynvml`; the `gpu` extra) only when the
ranks use CUDA devices, and only for the devices of this machine's ranks: rank `local_rank` computes
on CUDA device `local_rank % device count` (engine/distributed.py), so `n` local ranks use devices
0 .. min(n, count) - 1 (a run across nodes samples node 0's). NVML sees every GPU of the machine
while CUDA numbers the ones the ranks' CUDA_VISIBLE_DEVICES names (indices, GPU-UUIDs or their
unique prefixes, MIG-UUIDs; the list ends at the first entry that names no device, as in CUDA),
in the order CUDA_DEVICE_ORDER says. The monitor reads those two variables from the ranks'
environment (this process's, plus `launch --env`), and the ranks are started with
CUDA_DEVICE_ORDER=PCI_BUS_ID unless that environment sets it: CUDA's default, FASTEST_FIRST, may
differ from PCI order on a machine with mixed GPUs, and NVML's own index order is not promised
to be PCI order either, so the monitor sorts NVML's devices by PCI bus id itself (NVIDIA's CUDA
C Programming Guide, "CUDA Environment Variables").
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

log = logging.getLogger("paratrain.monitor")

SYSTEM_FILE = "system.jsonl"
DEFAULT_HZ = 2.0

RankOf = Callable[[psutil.Process], int | None]


def ranks_by_log(run_dir: Path) -> RankOf:
    """paratrain's own ranks (`train`): the process that holds RUN_DIR/logs/rank<R>.log open is rank R.

    Their environment cannot tell: multiprocessing's spawn sets RANK inside the started
    interpreter, which /proc/<pid>/environ (the environment at exec) does not show. A rank opens
    its log once it has joined the process group, so it is sampled from then on.
    """
    logs = (Path(run_dir) / "logs").resolve()
    name = re.compile(r"rank(\d+)\.log")

    def rank_of(proc: psutil.Process) -> int | None:
        for f in proc.open_files():
            path = Path(f.path)
            match = name.fullmatch(path.name)
            if match and path.parent == logs:
                return int(match.group(1))
        return None

    return rank_of


def wait_for_rank(root_pid: int, rank_of: RankOf, rank: int, timeout_s: float = 60.0) -> int:
    """The pid of rank `rank` among `root_pid`'s descendants, by the rule `rank_of`, once it exists
    (a rank is recognised from when it has joined its process group); TimeoutError after `timeout_s`.
    For tools that act on one rank of a run they started: a fault injection, a profiler."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.Process(root_pid).children(recursive=True):
            try:
                if rank_of(proc) == rank:
                    return proc.pid
            except psutil.Error:  # exited meanwhile, or not ours to read
                continue
        time.sleep(0.02)
    raise TimeoutError(f"no descendant of process {root_pid} became rank {rank} within {timeout_s:.0f} s")


def ranks_by_environment(run_id: str) -> RankOf:
    """Scripts started by the elastic agent (`launch`): each worker is started with RANK and the
    agent's TORCHELASTIC_RUN_ID in its environment; the run id tells this run's ranks from others."""

    def rank_of(proc: psutil.Process) -> int | None:
        env = proc.environ()
        if env.get("TORCHELASTIC_RUN_ID") == run_id and env.get("RANK", "").isdigit():
            return int(env["RANK"])
        return None

    return rank_of


PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _text(value: Any) -> str:
    """NVML's strings: bytes in older nvidia-ml-py releases, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def devices_in_cuda_order(nvml: Any, environ: Mapping[str, str]) -> list[Any]:
    """The NVML handle of each device, in the order CUDA numbers them in a process with
    `environ`, assuming PCI order. NVMLError when NVML cannot list them."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    by_pci = sorted(handles, key=lambda h: _text(nvml.nvmlDeviceGetPciInfo(h).busId).upper())
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return by_pci
    uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in by_pci]
    out: list[Any] = []
    seen: set[int] = set()
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith("MIG-"):
            try:
                out.append(nvml.nvmlDeviceGetHandleByUUID(entry))
            except nvml.NVMLError:
                break
            continue
        if entry.isdigit():
            position = int(entry) if int(entry) < len(by_pci) else -1
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            position = matches[0] if len(matches) == 1 else -1
        if position < 0:
            break  # CUDA stops at the first entry that names no device (or more than one)
        if position in seen:
            return []  # and a device named twice makes none visible
        seen.add(position)
        out.append(by_pci[position])
    return out


class Monitor:
    """Samples at `hz` into `path` while it is entered: `with Monitor(...): launch the ranks`.

    `root` is the launching process (default: this one); the ranks are found among it and its
    descendants by `rank_of`. The first process found for a rank is the rank: processes it forks
    later (DataLoader workers) inherit its environment and open files but are not ranks.
    `cuda_ranks`: how many ranks on this machine compute on GPUs; `environ`: the ranks' environment
    (default: this process's), whose CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say which devices
    those are; `nvml` replaces the `pynvml` module (tests).
    """

    def __init__(
        self,
        path: Path,
        hz: float,
        rank_of: RankOf,
        root: psutil.Process | None = None,
        cuda_ranks: int = 0,
        nvml: Any = None,
        environ: Mapping[str, str] | None = None,
    ):
        if hz <= 0:
            raise ValueError(f"monitor frequency must be positive (got {hz})")
        self.path, self.period, self.rank_of = Path(path), 1.0 / hz, rank_of
        self.root = root or psutil.Process()
        self.cuda_ranks, self._nvml = cuda_ranks, nvml
        self._environ = dict(os.environ if environ is None else environ)
        self._exported: dict[str, str | None] | None = None  # what start() changed in os.environ
        self._handles: list[tuple[int, Any]] = []
        self._ranks: dict[int, tuple[int, psutil.Process]] = {}  # pid -> (rank, process), baseline taken
        self._trees: dict[int, tuple[float, float]] = {}  # pid -> (when, CPU seconds of its process tree)
        self._cores_before: list[Any] = []  # the host's per-core baseline, read by start()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: Any = None

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self._file = open(self.path, "a")
        if self.cuda_ranks and "CUDA_DEVICE_ORDER" not in self._environ:
            # The ranks started from here while the monitor runs number their GPUs in PCI order, the
            # order the mapping below assumes (a setting of the user's own wins, and is followed).
            self._exported = {name: os.environ.get(name) for name in PCI_ORDER}
            os.environ.update(PCI_ORDER)
            self._environ.update(PCI_ORDER)
        if self.cuda_ranks:
            self._open_gpus()
        self._cores_before = psutil.cpu_times(percpu=True)
        self._thread = threading.Thread(target=self._loop, name="paratrain-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._file is not None:
            self._file.close()
        if self._handles:
            self._nvml.nvmlShutdown()
        for name, value in (self._exported or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def _loop(self) -> None:
        due = time.monotonic() + self.period
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            for record in self.sample():
                self._file.write(json.dumps(record) + "\n")
            self._file.flush()
            due += self.period
            if due < time.monotonic():  # fell behind (a stalled machine): skip, never burst
                due = time.monotonic() + self.period

    def sample(self) -> list[dict[str, Any]]:
        """One round: the host, every rank found at least one round ago, every GPU."""
        now = time.time()
        return [self._host(now), *self._rank_samples(now), *(self._gpu(now, i, h) for i, h in self._handles)]

    def _host(self, now: float) -> dict[str, Any]:
        cores = psutil.cpu_times(percpu=True)
        percent = [_busy_percent(a, b) for a, b in zip(self._cores_before, cores)]
        self._cores_before = cores
        return {"time": now, "kind": "host", "cpu_percent": percent, "memory_used_bytes": psutil.virtual_memory().used}

    def _rank_samples(self, now: float) -> list[dict[str, Any]]:
        # One walk of the launcher's tree a sample, each rank's tree read from it (_process_tree).
        try:
            children = _process_tree(self.root)
        except psutil.Error:
            return []
        listed = [self.root, *(child for kids in children.values() for child in kids)]
        ready = self._find_ranks(listed, children)
        out = []
        for rank, proc in sorted(ready):
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    # A rank that is exiting has released its memory before it is reaped, and reads as
                    # 0 bytes rather than raising (seen here: a last sample of rank 0 at 0 bytes, 2
                    # threads): it has ended, like one that is gone.
                    if rss == 0 or proc.status() == psutil.STATUS_ZOMBIE:
                        raise psutil.ZombieProcess(proc.pid)
                    out.append(
                        {
                            "time": now,
                            "kind": "rank",
                            "rank": rank,
                            "pid": proc.pid,
                            "cpu_percent": round(proc.cpu_percent(), 1),
                            "tree_cpu_percent": self._tree_percent(proc, children),
                            "rss_bytes": rss,
                            "num_threads": proc.num_threads(),
                            "cores": proc.cpu_affinity(),
                        }
                    )
            except psutil.Error:  # it ended since it was listed
                self._ranks.pop(proc.pid, None)
        return out

    def _tree_percent(self, proc: psutil.Process, children: Mapping[int, list[psutil.Process]]) -> float:
        """The rank's and its children's CPU since the last sample, in per cent of one core: what the doctor
        takes off its cores' busy time to find other work on them (doctor/evidence.py core_contention)."""
        now, spent = time.monotonic(), tree_cpu_seconds(proc, _tree(proc, children))
        then, before = self._trees.get(proc.pid, (now, spent))
        self._trees[proc.pid] = (now, spent)
        return round(100.0 * max(0.0, spent - before) / (now - then), 1) if now > then else 0.0

    def _find_ranks(
        self, listed: list[psutil.Process], children: Mapping[int, list[psutil.Process]]
    ) -> list[tuple[int, psutil.Process]]:
        """Ranks among `listed` whose baseline was taken in an earlier round; new ones get their baseline now."""
        alive = {p.pid for p in listed}
        self._ranks = {pid: known for pid, known in self._ranks.items() if pid in alive}
        ready = list(self._ranks.values())
        taken = {rank for rank, _ in ready}
        for proc in sorted(listed, key=_started):  # parents before the children they fork
            if proc.pid in self._ranks:
                continue
            try:
                rank = self.rank_of(proc)
                if rank is None or rank in taken:
                    continue
                proc.cpu_percent()  # the baseline: psutil's first reading is always 0.0
                self._trees[proc.pid] = (time.monotonic(), tree_cpu_seconds(proc, _tree(proc, children)))
            except psutil.Error:
                continue
            self._ranks[proc.pid] = (rank, proc)
            taken.add(rank)
        return ready

    def _open_gpus(self) -> None:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                log.warning(
                    "no GPU samples: NVML's Python binding is missing; pip install 'paratrain[gpu]' (nvidia-ml-py)"
                )
                return
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.warning("no GPU samples: NVML did not start (%s)", exc)
            return
        try:
            devices = devices_in_cuda_order(nvml, self._environ)
        except nvml.NVMLError as exc:
            log.warning("no GPU samples: NVML did not list the devices (%s)", exc)
            nvml.nvmlShutdown()
            return
        order = self._environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
        if order != "PCI_BUS_ID" and len(devices) > 1:
            log.warning(
                "the ranks number their GPUs with CUDA_DEVICE_ORDER=%s; the GPU samples assume PCI order and may "
                "be attributed to the wrong CUDA device numbers",
                order,
            )
        # Local rank r computes on CUDA device r % count: n ranks use the first min(n, count) devices.
        self._handles = list(enumerate(devices[: self.cuda_ranks]))
        if not self._handles:
            log.warning(
                "no GPU samples: CUDA_VISIBLE_DEVICES=%r names none of this machine's %d GPU(s)",
                self._environ.get("CUDA_VISIBLE_DEVICES"),
                nvml.nvmlDeviceGetCount(),
            )
            nvml.nvmlShutdown()

    def _gpu(self, now: float, index: int, handle: Any) -> dict[str, Any]:
        nvml = self._nvml

        def read(what: Callable[[], Any]) -> Any:
            try:
                return what()
            except nvml.NVMLError:  # not supported by this device (power on some boards, MIG)
                return None

        memory = read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = read(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return {
            "time": now,
            "kind": "gpu",
            "index": index,
            "utilization_percent": read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_bytes": memory.used if memory else None,
            "memory_total_bytes": memory.total if memory else None,
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "sm_clock_mhz": read(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        }


def _started(proc: psutil.Process) -> float:
    try:
        return proc.create_time()
    except psutil.Error:
        return float("inf")


# Linux lists each thread's children in /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN, on in the
# distributions' kernels): reading them walks the launcher's tree alone. psutil's children() reads the parent of
# every process on the machine instead, at every sample: with a walk for each rank's tree as well (before
# 2026-12-01), a sample cost 68-72 ms of CPU among 570 processes with 2 ranks and 150-161 ms with 8, taken from
# the ranks' cores; 2-3 and 6 ms now (docs/launch.md). psutil has no walk of one tree; it stays the fallback.
_KERNEL_CHILDREN = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def _process_tree(root: psutil.Process) -> dict[int, list[psutil.Process]]:
    """The direct children of each process in `root`'s tree, by pid (root's included). A process that ends during
    the walk is left out, with what it started."""
    if not _KERNEL_CHILDREN:
        children: dict[int, list[psutil.Process]] = {}
        for proc in root.children(recursive=True):
            try:
                children.setdefault(proc.ppid(), []).append(proc)
            except psutil.Error:
                continue
        return children
    tree: dict[int, list[psutil.Process]] = {}
    frontier = [root.pid]
    while frontier:
        for pid in frontier:
            tree[pid] = []
            for child in _kernel_children(pid):
                try:
                    tree[pid].append(psutil.Process(child))
                except psutil.Error:  # ended since it was listed
                    continue
        frontier = [child.pid for pid in frontier for child in tree[pid] if child.pid not in tree]
    return tree


def _kernel_children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process ended
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(child) for child in f.read().split()]
        except OSError:  # the thread ended
            continue
    return found


def _tree(proc: psutil.Process, children: Mapping[int, list[psutil.Process]]) -> list[psutil.Process]:
    """`proc` and its descendants, from the direct children of each (_process_tree)."""
    members, frontier = [proc], [proc]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent.pid, [])]
        members += frontier
    return members


def tree_cpu_seconds(proc: psutil.Process, members: list[psutil.Process] | None = None) -> float:
    """CPU seconds of a process and its descendants (`members`, the process first, when the caller has them).
    A process's time is in exactly one place: its own counters while it runs, its parent's children_* once
    reaped, so the sum over the live tree counts each once."""
    total = 0.0
    for member in members or [proc, *proc.children(recursive=True)]:
        try:
            t = member.cpu_times()
        except psutil.Error:  # ended between the listing and the reading
            continue
        total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


def _busy_percent(before: Any, after: Any) -> float:
    """A core's busy share between two psutil.cpu_times readings: everything but idle and iowait
    (guest time is already inside user and nice on Linux, so it is not counted twice)."""

    def total(t: Any) -> float:
        return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    def idle(t: Any) -> float:
        return t.idle + getattr(t, "iowait", 0.0)

    elapsed = total(after) - total(before)
    return round(100.0 * (elapsed - (idle(after) - idle(before))) / elapsed, 1) if elapsed > 0 else 0.0


def monitor_run(
    run_dir: Path, hz: float, rank_of: RankOf, cuda_ranks: int = 0, env: Mapping[str, str] | None = None
) -> Monitor:
    """The monitor of a run launched from this process, writing RUN_DIR/system.jsonl. `cuda_ranks`:
    the GPU ranks this process starts on this machine (never the whole run's across nodes); `env`:
    what the ranks' environment adds to this process's (`launch --env`)."""
    return Monitor(
        Path(run_dir) / SYSTEM_FILE, hz, rank_of, cuda_ranks=cuda_ranks, environ={**os.environ, **(env or {})}
    )
