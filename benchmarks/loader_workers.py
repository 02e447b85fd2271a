"""DataLoader workers beyond the cores (issue #26, docs/doctor.md "Not yet done"): one process trains the
catalogue's small CNN at batch 64 from a Dataset doing CPU work per sample (four pooling passes, about
10 ms a batch), with WORKERS DataLoader workers and THREADS torch threads, and prints samples/s, the
step, the process's CPU per step and its threads' run-queue wait per step (`/proc/self/task/*/schedstat`:
time runnable but waiting for a core). Epoch 0 is warm-up; epochs 1-2 are timed.

    .venv/bin/python benchmarks/loader_workers.py 0 2; .venv/bin/python benchmarks/loader_workers.py 4 2
    taskset -c 0 .venv/bin/python benchmarks/loader_workers.py 0 1; taskset -c 0 .venv/bin/python benchmarks/loader_workers.py 4 1
"""
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent / "doctor_faults"))
from common import SmallCNN, synthetic_cifar  # noqa: E402


class Decoded(Dataset):
    def __init__(self, n: int):
        self.x, self.y = synthetic_cifar(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        image = self.x[i]
        for _ in range(4):      # augmentation-like CPU work in the loader
            image = torch.nn.functional.avg_pool2d(image[None], 3, 1, 1)[0] * 1.01
        return image, self.y[i]


def run_queue_wait_s() -> float:
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[1])
    return total / 1e9


workers, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
loader = DataLoader(Decoded(4096), batch_size=64, shuffle=True, drop_last=True,
                    **(dict(num_workers=workers, persistent_workers=True) if workers else {}))
model = SmallCNN()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
samples, began = 0, None
for epoch in range(3):
    for x, y in loader:
        if epoch == 1 and began is None:
            began, waited, cpu = time.perf_counter(), run_queue_wait_s(), time.process_time()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if began is not None:
            samples += len(x)
elapsed, steps = time.perf_counter() - began, samples / 64
print(f"workers={workers} threads={threads} samples/s={samples / elapsed:.0f} step={elapsed / steps * 1e3:.1f}ms "
      f"cpu/step={(time.process_time() - cpu) / steps * 1e3:.1f}ms "
      f"run-queue wait/step={(run_queue_wait_s() - waited) / steps * 1e3:.1f}ms")
