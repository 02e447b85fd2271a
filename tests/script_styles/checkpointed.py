"""Style: activation checkpointing in a plain DDP loop (no paratrain import).

A CNN of a stem, 4 residual blocks and a head on synthetic 3x32x32 images, 10 classes; each block runs as
`torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`, so its activations are recomputed in the backward.
DataLoader + DistributedSampler, DistributedDataParallel, SGD.

Flags:
  --reentrant       checkpoint(..., use_reentrant=True) instead
  --steps N         optimizer steps to run (default 40)
  --batch-size B    samples per rank per step (default 16)
  --samples S       dataset length (default 2048)
  --fault LIST      comma-separated planted faults (default none, healthy):
                      gc          gc.collect() on every training step
                      decode      __getitem__ decodes a 192x192 PNG from memory with PIL (one of 32 random-noise PNGs
                                  encoded at start-up) and resizes it to 32x32, ~1 ms a sample, num_workers=0;
                                  healthy, it reads a tensor kept in memory
                      float64     model and inputs in float64
                      no_sampler  no DistributedSampler: every rank iterates the whole (shuffled) dataset

Prints on rank 0 at the end: `SAMPLES_PER_STEP <n>` and `STEPS <n>`.

Run:
  paratrain launch -n 2 --run-dir DIR tests/script_styles/checkpointed.py --steps 20 --fault gc,decode
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 tests/script_styles/checkpointed.py --steps 10
"""

import argparse
import gc
import io

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, DistributedSampler

FAULTS = ("gc", "decode", "float64", "no_sampler")
PNG_SIZE, PNG_POOL = 192, 32


def parse_args():
    p = argparse.ArgumentParser(description="DDP training loop with activation checkpointing")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to run")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--samples", type=int, default=2048, help="dataset length")
    p.add_argument("--reentrant", action="store_true", help="checkpoint(..., use_reentrant=True)")
    p.add_argument("--fault", default="", help="comma-separated faults: " + ", ".join(FAULTS))
    args = p.parse_args()
    args.faults = {f for f in args.fault.split(",") if f}
    if args.faults - set(FAULTS):
        p.error(f"unknown fault(s) {sorted(args.faults - set(FAULTS))}; known: {', '.join(FAULTS)}")
    return args


def encode_pngs(n, size):
    """A pool of random-noise PNGs, encoded once at start-up."""
    rng = np.random.default_rng(0)
    pngs = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    return pngs


def decode_png(png):
    img = Image.open(io.BytesIO(png)).convert("RGB").resize((32, 32), Image.BILINEAR)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div_(255)


class SyntheticImages(Dataset):
    def __init__(self, n, decode=False):
        g = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.decode = decode
        if decode:
            self.pngs = encode_pngs(PNG_POOL, PNG_SIZE)
        else:
            self.images = torch.randn(n, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = decode_png(self.pngs[i % len(self.pngs)]) if self.decode else self.images[i]
        return x, self.labels[i]


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.conv(x))


class Net(nn.Module):
    def __init__(self, use_reentrant=False, channels=32):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.blocks = nn.ModuleList(Block(channels) for _ in range(4))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.use_reentrant)
        return self.head(x)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    float64 = "float64" in args.faults

    dataset = SyntheticImages(args.samples, decode="decode" in args.faults)
    if "no_sampler" in args.faults:
        sampler = None
        loader = DataLoader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
            drop_last=True,
        )
    else:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise SystemExit(f"--samples {args.samples} gives no full batch of {args.batch_size} per rank")

    model = Net(use_reentrant=args.reentrant)
    if float64:
        model = model.double()
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    step, epoch = 0, 0
    while step < args.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            if "gc" in args.faults:
                gc.collect()
            if float64:
                x = x.double()
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step >= args.steps:
                break
        epoch += 1

    if rank == 0:
        print(f"SAMPLES_PER_STEP {args.batch_size}", flush=True)
        print(f"STEPS {step}", flush=True)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
