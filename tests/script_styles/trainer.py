"""Style: a Lightning Trainer run (no paratrain import).

A LightningModule (small CNN on synthetic 3x32x32 images, 10 classes, SGD) fit by
`Trainer(accelerator="cpu", strategy="ddp", devices=WORLD_SIZE, num_nodes=1, max_steps=N, ...)`, the device count read
from the launcher's environment; Lightning detects the torchrun-style env, joins its process group and swaps a
DistributedSampler into the plain shuffled DataLoader.

Flags:
  --steps N         optimizer steps to run (default 40)
  --batch-size B    samples per rank per step (default 16)
  --samples S       dataset length (default 2048)
  --fault LIST      comma-separated planted faults (default none, healthy):
                      gc          gc.collect() in every training_step
                      decode      __getitem__ decodes a 256x256 PNG from memory with PIL (one of 32 random-noise PNGs
                                  encoded at start-up) and resizes it to 32x32, ~2 ms a sample, num_workers=0;
                                  healthy, it reads a tensor kept in memory
                      float64     Trainer(precision="64-true"): model and inputs in float64

Prints on rank 0 at the end: `SAMPLES_PER_STEP <n>` and `STEPS <n>`.

Run:
  paratrain launch -n 2 --run-dir DIR tests/script_styles/trainer.py --steps 20 --fault gc,decode
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 tests/script_styles/trainer.py --steps 10
"""

import argparse
import gc
import io
import os

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

FAULTS = ("gc", "decode", "float64")  # no no_sampler: the Trainer inserts a sampler
# 256, not the other styles' 192: beside float64's slower model the decoding must stay well above the doctor's
# 15 % of the step on any CPU (192 gave 15-20 % on an AVX2 one)
PNG_SIZE, PNG_POOL = 256, 32


def parse_args():
    p = argparse.ArgumentParser(description="Lightning Trainer run")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to run")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--samples", type=int, default=2048, help="dataset length")
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


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


class Classifier(L.LightningModule):
    def __init__(self, collect_garbage=False):
        super().__init__()
        self.collect_garbage = collect_garbage
        self.net = make_model()

    def training_step(self, batch, batch_idx):
        if self.collect_garbage:
            gc.collect()
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def main():
    args = parse_args()
    L.seed_everything(0, verbose=False)
    dataset = SyntheticImages(args.samples, decode="decode" in args.faults)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = Classifier(collect_garbage="gc" in args.faults)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ.get("WORLD_SIZE", "1")),
        num_nodes=1,
        precision="64-true" if "float64" in args.faults else "32-true",
        max_steps=args.steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, loader)

    if trainer.global_rank == 0:
        print(f"SAMPLES_PER_STEP {args.batch_size}", flush=True)
        print(f"STEPS {trainer.global_step}", flush=True)
    del trainer, model  # the Trainer holds the DDP-wrapped model and the optimizer
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()  # Lightning created it and leaves it for the script to end


if __name__ == "__main__":
    main()
