"""Streaming IterableDataset over .npz shards that indexes the NpzFile member for every single sample.

Mistake: the feature shards are stored as compressed .npz archives (np.savez_compressed, arrays "x" and "y").
The stream opens a shard with `shard = np.load(path)` and then yields `shard["x"][i], shard["y"][i]` for
each row. An NpzFile is lazy: every `shard["x"]` opens the zip member again, inflates and parses the
*whole* array, and returns a fresh copy, so each sample decompresses its entire 256-row shard (plus the
labels) only to keep one row.
Source: https://github.com/numpy/numpy/pull/32723 (np.load on .npz returns an NpzFile whose arrays are read
lazily: "array data is only decompressed when the array is actually accessed"),
https://github.com/bowang-lab/MedSAM/issues/30 (NpzDataset whose per-item numpy work "caused this code to run
very slowly"; fixed by loading the arrays once), https://github.com/numpy/numpy/issues/29081 (accessing
NpzFile items with [] inside a loop).
Fix (--fix): read each member once per shard (`xs, ys = shard["x"], shard["y"]`) and index the arrays;
same shards, same rows, same order.
Expected diagnosis: the training loop waits on input produced in the main process; the time is zip
inflation and .npy parsing (zipfile/zlib, numpy.lib.format.read_array) from NpzFile.__getitem__ called once
per sample in ShardStream.__iter__; load each array once per shard.
"""

import gc
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, CLASSES, ROWS_PER_SHARD = 96, 10, 256


class ShardStream(IterableDataset):
    """Yields (features, label) rows from this rank's .npz shards."""

    def __init__(self, paths: list[Path], load_once: bool):
        self.paths, self.load_once = paths, load_once

    def __iter__(self):
        for path in self.paths:
            with np.load(path) as shard:
                if self.load_once:
                    xs, ys = shard["x"], shard["y"]
                    for i in range(len(ys)):
                        yield torch.from_numpy(xs[i]), int(ys[i])
                else:
                    for i in range(ROWS_PER_SHARD):
                        yield torch.from_numpy(shard["x"][i]), int(shard["y"][i])


def write_shards(directory: Path, count: int, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    paths = []
    for k in range(count):
        x = rng.standard_normal((ROWS_PER_SHARD, FEATURES)).astype(np.float32)
        path = directory / f"shard-{k:03d}.npz"
        np.savez_compressed(path, x=x, y=(np.tanh(x) @ w).argmax(1))
        paths.append(path)
    return paths


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    workdir = Path(tempfile.mkdtemp(prefix=f"npz-shards-r{rank}-"))
    paths = write_shards(workdir, 8 * world)
    stream = ShardStream(paths[rank::world], load_once=args.fix)  # each rank streams its own shards
    loader = DataLoader(stream, batch_size=args.batch_size, drop_last=True)
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        correct = total = 0
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            if meter.step(len(yb)):
                break
        if rank == 0:
            print(f"epoch {epoch} train accuracy {correct / max(total, 1):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    shutil.rmtree(workdir, ignore_errors=True)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
