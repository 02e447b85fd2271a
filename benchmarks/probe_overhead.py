"""The probe's own cost per training step, measured inside one process (issue #26: at most 2 % of a healthy
script's throughput).

End-to-end runs with and without `launch --no-probe` (benchmarks/doctor_catalogue.py --overhead) differ by
the VM's run-to-run noise (±15 % here) more than by the probe. This measures the hooks alone: one process
trains the catalogue's healthy model (benchmarks/doctor_faults/common.py: SmallCNN, 32 samples a step, a
DataLoader, SGD with momentum) in blocks of `--steps` steps, alternating blocks with the probe's hooks
installed (module forward hooks, optimizer hooks, DataLoader, autograd.backward, collectives, torch.save;
exactly what launch installs) and removed, and compares the median step time of each kind of block. Not
covered here: DDP's all-reduce through the probe's timed Python comm hook (one call per bucket per step),
which only the end-to-end figure includes.

    .venv/bin/python benchmarks/probe_overhead.py [--blocks 20] [--steps 40]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "doctor_faults"))
from common import SmallCNN, synthetic_cifar  # noqa: E402

# The probe as launch loads it: by path, outside the paratrain package.
spec = importlib.util.spec_from_file_location("paratrain_probe", ROOT / "src" / "paratrain" / "launch" / "probe.py")
probe_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_module)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=20, help="blocks of each kind, alternating")
    p.add_argument("--steps", type=int, default=40, help="training steps per block")
    args = p.parse_args()
    torch.set_num_threads(1)            # a launched rank's one core
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(*synthetic_cifar(4096)), batch_size=32, shuffle=True, drop_last=True)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = iter(())

    def block() -> float:
        nonlocal batches
        started = time.perf_counter()
        for _ in range(args.steps):
            try:
                images, labels = next(batches)
            except StopIteration:
                batches = iter(loader)
                images, labels = next(batches)
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        return (time.perf_counter() - started) / args.steps

    block()     # warm-up
    times: dict[str, list[float]] = {"probe": [], "bare": []}
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.blocks):
            for arm in (("probe", "bare") if i % 2 else ("bare", "probe")):
                probe = None
                if arm == "probe":
                    probe = probe_module.Probe(str(Path(scratch) / "rank0.jsonl"), 0)
                    probe.install(torch)
                times[arm].append(block())
                if probe is not None:
                    for undo in reversed(probe.restore):
                        undo()
                    probe.flush()
    with_probe, bare = statistics.median(times["probe"]), statistics.median(times["bare"])
    pairs = [p / b for p, b in zip(times["probe"], times["bare"])]
    print(f"step with the probe {with_probe * 1e3:.2f} ms, without {bare * 1e3:.2f} ms (medians of {args.blocks} "
          f"blocks of {args.steps} steps each); overhead {100 * (with_probe / bare - 1):+.1f} %; per block pair "
          f"{min(pairs):.3f}-{max(pairs):.3f}, median {statistics.median(pairs):.3f}")


if __name__ == "__main__":
    main()
