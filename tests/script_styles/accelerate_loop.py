"""Style: a Hugging Face Accelerate loop with gradient accumulation (no paratrain import).

`Accelerator(cpu=True, gradient_accumulation_steps=2)` (on CPU only cpu=True joins the torchrun process group; a plain
Accelerator() there trains each rank alone), `accelerator.prepare(model, optimizer, loader)`, and per micro-batch
`with accelerator.accumulate(model):` ... `accelerator.backward(loss)`, `optimizer.step()`, `optimizer.zero_grad()`:
the prepared optimizer steps on every 2nd micro-batch. Accelerate shards the loader across ranks itself. Small CNN on
synthetic 3x32x32 images, 10 classes, SGD. An optimizer step is 2 micro-batches: SAMPLES_PER_STEP = 2 x batch size.

Flags:
  --steps N         optimizer steps to run (default 40), each of 2 micro-batches
  --batch-size B    samples per rank per micro-batch (default 16)
  --samples S       dataset length (default 2048)
  --fault LIST      comma-separated planted faults (default none, healthy):
                      gc          gc.collect() on every micro-batch (each turn of the loop)
                      decode      __getitem__ decodes a 256x256 PNG from memory with PIL (one of 32 random-noise PNGs
                                  encoded at start-up) and resizes it to 32x32, ~2 ms a sample, num_workers=0;
                                  healthy, it reads a tensor kept in memory
                      float64     model and inputs in float64

Prints on rank 0 at the end: `SAMPLES_PER_STEP <n>` and `STEPS <n>`.

Run:
  paratrain launch -n 2 --run-dir DIR tests/script_styles/accelerate_loop.py --steps 20 --fault gc,decode
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 tests/script_styles/accelerate_loop.py --steps 10
"""

import argparse
import gc
import io

import numpy as np
import torch
from accelerate import Accelerator
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

FAULTS = ("gc", "decode", "float64")  # no no_sampler: accelerator.prepare shards the loader
ACCUMULATION = 2
# 256, not the other styles' 192: beside float64's slower model the decoding must stay well above the doctor's
# 15 % of the step on any CPU (192 gave 15-20 % on an AVX2 one)
PNG_SIZE, PNG_POOL = 256, 32


def parse_args():
    p = argparse.ArgumentParser(description="Hugging Face Accelerate training loop")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to run")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per micro-batch")
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
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    torch.manual_seed(0)
    float64 = "float64" in args.faults

    dataset = SyntheticImages(args.samples, decode="decode" in args.faults)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = make_model()
    if float64:
        model = model.double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if len(loader) == 0:
        raise SystemExit(f"--samples {args.samples} gives no full batch of {args.batch_size} per rank")

    step = 0
    while step < args.steps:
        for x, y in loader:
            if "gc" in args.faults:
                gc.collect()
            if float64:
                x = x.double()
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:  # the optimizer stepped on this micro-batch
                step += 1
                if step >= args.steps:
                    break

    if accelerator.is_main_process:
        print(f"SAMPLES_PER_STEP {args.batch_size * ACCUMULATION}", flush=True)
        print(f"STEPS {step}", flush=True)
    accelerator.free_memory()  # drops the accelerator's own references to the prepared model and optimizer
    del model, optimizer
    gc.collect()
    accelerator.end_training()  # destroys the process group Accelerate created


if __name__ == "__main__":
    main()
