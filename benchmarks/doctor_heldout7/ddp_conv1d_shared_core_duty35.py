"""Plain DDP 1-D convolutional sequence classifier, identical work on both ranks, with a light neighbour
process (about a third of a core) on rank 1's core.

Situation (simulated): the training code and data are the same on every rank, but the core rank 1 is pinned
to is shared for the whole run with another tenant's light periodic process (think of a log shipper or a
sidecar that wakes every ~20 ms and works for 7 ms of CPU: roughly 35 % duty). The script itself simulates
that neighbour: rank 1 starts a separate Python process that spins until it has used 7 ms of CPU time, then
sleeps for 13 ms, again and again, pinned with `os.sched_setaffinity` to rank 1's own core
(`os.sched_getaffinity(0)` inside rank 1). Each time it wakes it preempts rank 1's training thread, so rank
1's forward/backward/optimizer take somewhat longer in wall time for the same CPU work, and rank 0 waits for
it in every gradient all-reduce. Nothing in the training code is rank-dependent; the neighbour is stopped
(and dies with rank 1) when training ends.
Fix (--fix): the neighbour is not started (the core is rank 1's alone again); the training is unchanged.
Expected diagnosis: a slow core, not a straggler in the code: both ranks do the same work per step, but
rank 1's core is partly taken by a foreign process (about a third of it), so rank 1's compute phases are
slower in wall time and rank 0 waits in the all-reduce; remedy: free rank 1's core (stop or move the other
process, isolate cores), not a change to the code.
"""

import atexit
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

# The simulated neighbour: spin until it has used ON ms of CPU time, sleep OFF ms (OFF = 0: a steady busy
# loop), and again, until its parent
# (rank 1) is gone; PR_SET_PDEATHSIG also kills it if rank 1 dies without cleaning up.
NEIGHBOUR = r"""
import ctypes, os, signal, sys, time
on, off, parent = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, int(sys.argv[3])
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
spins = 0
while os.getppid() == parent:
    until = time.thread_time() + on
    while time.thread_time() < until:
        spins += 1
    if off:
        time.sleep(off)
"""
ON_MS, OFF_MS = 7.0, 13.0
CHANNELS, LENGTH, CLASSES = 6, 256, 8
STARTED: dict[int, float] = {}


def synthetic_sensor(samples: int, seed: int = 0):
    """Six-channel signals (accelerometer + gyroscope-like), 256 time steps, 8 activity classes."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=g)
    t = torch.arange(LENGTH) / 50.0
    freq = (1.0 + labels.float())[:, None, None] * torch.linspace(0.5, 1.5, CHANNELS)[None, :, None]
    x = torch.sin(2 * torch.pi * freq * t) + 0.5 * torch.randn(samples, CHANNELS, LENGTH, generator=g)
    return x, labels


def start_neighbour(on_ms: float, off_ms: float) -> subprocess.Popen:
    """Start the competing load and pin it to this process's own core(s)."""
    cores = os.sched_getaffinity(0)
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(on_ms), str(off_ms), str(os.getpid())])
    os.sched_setaffinity(proc.pid, cores)
    STARTED[proc.pid] = time.monotonic()
    atexit.register(stop_neighbour, proc)
    print(
        f"rank {dist.get_rank()}: neighbour pid {proc.pid} on cores {sorted(cores)}, "
        f"{on_ms:g} ms of CPU on / {off_ms:g} ms off",
        flush=True,
    )
    return proc


def stop_neighbour(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:  # how much of the core the neighbour took, for the log
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            alive = time.monotonic() - STARTED[proc.pid]
            print(
                f"neighbour pid {proc.pid}: {cpu:.1f} s CPU in {alive:.1f} s ({100 * cpu / alive:.0f} % of a core)",
                flush=True,
            )
        except (OSError, KeyError, IndexError, ValueError):
            pass
        proc.kill()
        proc.wait()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    neighbour = start_neighbour(ON_MS, OFF_MS) if rank == 1 and not args.fix else None
    try:
        x, y = synthetic_sensor(2 * 40 * args.batch_size)
        dataset = TensorDataset(x, y)
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
        torch.manual_seed(0)
        model = DDP(
            nn.Sequential(
                nn.Conv1d(CHANNELS, 64, 7, padding=3),
                nn.ReLU(),
                nn.Conv1d(64, 64, 5, padding=2),
                nn.ReLU(),
                nn.MaxPool1d(2),
                nn.Conv1d(64, 128, 5, padding=2),
                nn.ReLU(),
                nn.AdaptiveAvgPool1d(1),
                nn.Flatten(),
                nn.Linear(128, CLASSES),
            )
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        meter, epoch = Meter(args), 0
        while True:
            sampler.set_epoch(epoch)
            total_loss = steps = 0
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total_loss += loss.item()
                steps += 1
                if meter.step(len(yb)):
                    break
            if rank == 0:
                print(f"epoch {epoch} loss {total_loss / max(steps, 1):.4f}", flush=True)
            epoch += 1
            if meter.end_epoch():
                break
        meter.report()
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()
    finally:
        if neighbour is not None:
            stop_neighbour(neighbour)


if __name__ == "__main__":
    main()
