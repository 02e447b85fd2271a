"""Style: a Lightning Fabric loop (no paratrain import).

`Fabric(accelerator="cpu", strategy="ddp", devices=WORLD_SIZE, num_nodes=1)` with the device count read from the
launcher's environment, then `fabric.launch()`: under torchrun-style env (TorchElasticEnvironment) it starts no
processes and only joins the process group, but Fabric still requires it (without it fabric.setup raises "To use
Fabric with more than one device, you must call `.launch()`"). `fabric.setup(model, optimizer)`,
`fabric.setup_dataloaders(loader)` (which swaps in a DistributedSampler and sets its epoch), `fabric.backward(loss)`.
Small CNN on synthetic 3x32x32 images, 10 classes, SGD.

Flags:
  --steps N         optimizer steps to run (default 40)
  --batch-size B    samples per rank per step (default 16)
  --samples S       dataset length (default 2048)
  --fault LIST      comma-separated planted faults (default none, healthy):
                      gc          gc.collect() on every training step
                      decode      __getitem__ decodes a 192x192 PNG from memory with PIL (one of 32 random-noise PNGs
                                  encoded at start-up) and resizes it to 32x32, ~1 ms a sample, num_workers=0;
                                  healthy, it reads a tensor kept in memory
                      float64     Fabric(precision="64-true"): model and inputs in float64

Prints on rank 0 at the end: `SAMPLES_PER_STEP <n>` and `STEPS <n>`.

Run:
  paratrain launch -n 2 --run-dir DIR tests/script_styles/fabric_loop.py --steps 20 --fault gc,decode
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 tests/script_styles/fabric_loop.py --steps 10
"""

import argparse
import gc
import io
import os

import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

FAULTS = ("gc", "decode", "float64")  # no no_sampler: fabric.setup_dataloaders inserts a sampler
PNG_SIZE, PNG_POOL = 192, 32


def parse_args():
    p = argparse.ArgumentParser(description="Lightning Fabric training loop")
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


def main():
    args = parse_args()
    fabric = Fabric(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ.get("WORLD_SIZE", "1")),
        num_nodes=1,
        precision="64-true" if "float64" in args.faults else "32-true",
    )
    fabric.launch()
    fabric.seed_everything(0, verbose=False)

    dataset = SyntheticImages(args.samples, decode="decode" in args.faults)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    if len(loader) == 0:
        raise SystemExit(f"--samples {args.samples} gives no full batch of {args.batch_size} per rank")

    step = 0
    while step < args.steps:
        for x, y in loader:
            if "gc" in args.faults:
                gc.collect()
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)  # 64-true: Fabric casts the inputs to float64
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if step >= args.steps:
                break

    if fabric.global_rank == 0:
        print(f"SAMPLES_PER_STEP {args.batch_size}", flush=True)
        print(f"STEPS {step}", flush=True)
    del model, optimizer
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()  # Fabric created it and leaves it for the script to end


if __name__ == "__main__":
    main()
