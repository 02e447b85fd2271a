"""The probe's cost on a healthy DDP script's throughput (issue #26: at most 2 %), measured on 2 real ranks,
alternating, inside one launch.

End-to-end runs with and without `launch --no-probe` (benchmarks/doctor_catalogue.py --overhead) differ by
the VM's run-to-run noise (±15-20 % per run here) more than by a few per cent of probe. So this script runs
under `paratrain launch -n 2 --no-probe` and installs the probe itself, exactly as launch's boot stage does
(launch/probe/hooks.py install): every hook (optimizer, DataLoader, autograd.backward, module hooks,
checkpointing's recompute, collectives, torch.save, gc callbacks) and DDP's all-reduce through the probe's timed
comm hook; the profiler window's steps fall in the first (warm-up) block, which is not timed, as they are kept
out of a launched run's figures. It trains two copies of
the model in blocks of `--steps` steps, alternating: one DDP built before the probe was installed, its
blocks run with the probe removed; one built under the probe, its blocks run with the probe installed (and
its global module hooks narrowing to the outermost modules after the first step, as in a launched run).
Rank 0 prints the median step of each arm and the median ratio of the block pairs.

    .venv/bin/paratrain launch -n 2 --no-probe benchmarks/probe_overhead.py [--model small-cnn|deep-linear]
        [--blocks 20] [--steps 40]

small-cnn is the catalogue's healthy model (benchmarks/doctor_faults/common.py: 32 samples a rank, a
DataLoader, SGD with momentum); deep-linear is find_unused.py's 256 small linear layers, where the cost
per module call shows (without find_unused_parameters).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "doctor_faults"))
from common import SmallCNN, synthetic_cifar  # noqa: E402

from paratrain.launch.probe import hooks  # noqa: E402
from paratrain.launch.probe.clock import Probe  # noqa: E402


def deep_linear() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 32),
        *(nn.Linear(32, 32) for _ in range(256)),
        nn.Linear(32, 10),
    )


MODELS = {"small-cnn": SmallCNN, "deep-linear": deep_linear}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="small-cnn")
    p.add_argument("--blocks", type=int, default=20, help="blocks of each arm, alternating")
    p.add_argument("--steps", type=int, default=40, help="training steps per block")
    args = p.parse_args()
    dist.init_process_group("gloo")
    dataset = TensorDataset(*synthetic_cifar(4096))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
    batches, epoch = iter(()), 0
    scratch = tempfile.mkdtemp(prefix="probe-overhead-")
    probe = Probe(os.path.join(scratch, f"rank{dist.get_rank()}.jsonl"), dist.get_rank())

    def install() -> None:
        probe.restore.clear()
        hooks.install(probe, torch)

    def remove() -> None:
        for undo in reversed(probe.restore):
            undo()
        probe.restore.clear()
        probe.flush()

    torch.manual_seed(0)
    bare = DDP(MODELS[args.model]())
    install()
    probed = DDP(MODELS[args.model]())  # built under the probe: DDP's all-reduce through its timed hook
    remove()
    arms = {"bare": bare, "probe": probed}
    optimizers = {arm: torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) for arm, model in arms.items()}

    def block(arm: str) -> list[float]:
        nonlocal batches, epoch
        model, optimizer = arms[arm], optimizers[arm]
        steps = []
        for _ in range(args.steps):
            started = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                sampler.set_epoch(epoch)
                epoch += 1
                batches = iter(loader)
                images, labels = next(batches)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            steps.append(time.perf_counter() - started)
        return steps

    for arm in arms:  # warm-up: first-call allocations, and the probe's first steps
        if arm == "probe":
            install()
        block(arm)
        if arm == "probe":
            remove()
    times: dict[str, list[list[float]]] = {arm: [] for arm in arms}
    for i in range(args.blocks):
        for arm in ("probe", "bare") if i % 2 else ("bare", "probe"):  # ABBA
            if arm == "probe":
                install()
            times[arm].append(block(arm))
            if arm == "probe":
                remove()
    if dist.get_rank() == 0:
        # The median step of each arm over all its steps (a step's own noise is large here, its median over
        # hundreds of steps is not), and the block pairs' ratios of median steps for the spread.
        with_probe = statistics.median(t for steps in times["probe"] for t in steps)
        without = statistics.median(t for steps in times["bare"] for t in steps)
        pairs = [statistics.median(a) / statistics.median(b) for a, b in zip(times["probe"], times["bare"])]
        print(
            f"{args.model}: median step with the probe {with_probe * 1e3:.2f} ms, without {without * 1e3:.2f} ms "
            f"({args.blocks} blocks of {args.steps} steps each): overhead {100 * (with_probe / without - 1):+.1f} %; "
            f"block pairs {min(pairs):.3f}-{max(pairs):.3f}, median {statistics.median(pairs):.3f}",
            flush=True,
        )
    arms.clear()
    optimizers.clear()
    del bare, probed
    gc.collect()  # DDP freed before its process group: torch 2.13 can abort at exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
