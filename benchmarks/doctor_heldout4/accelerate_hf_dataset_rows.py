"""HF Accelerate (cpu=True, prepare, accumulate) training that reads a Hugging Face `datasets.Dataset` row by row.

Mistake: the features live in an in-memory `datasets.Dataset` (built with Dataset.from_dict, 256 float
features and a label per row). A thin torch Dataset wraps it and its __getitem__ does
`row = self.ds[index]` and `torch.tensor(row["features"])`: every sample is one Arrow row look-up that
materialises the row as Python objects (a dict holding a list of 256 Python floats), formats it and then
converts the list back into a tensor, all in the main process, per sample, per step.
Source: https://github.com/huggingface/datasets/issues/7753 ("datasets massively slows data reads, even in
memory ... approximately 1000 times longer than reading the same data from a pytorch dataset"),
https://github.com/pytorch/pytorch/issues/106704 (per-item __getitem__ on in-memory data vs batched access).
Fix (--fix): convert the columns once with `ds.with_format("torch")[:]` into two tensors and index those;
same rows, same values, same order.
Expected diagnosis: the training loop waits on input produced in the main process: Arrow row access and
Python-object conversion (datasets' __getitem__ / formatting, then torch.tensor of a Python list) per
sample in ArrowRows.__getitem__; convert the columns to tensors once (more workers would only hide it).
"""

import gc
import sys
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, CLASSES = 256, 10


class ArrowRows(Dataset):
    def __init__(self, ds: datasets.Dataset, columns_once: bool):
        self.ds, self.columns_once = ds, columns_once
        if columns_once:
            columns = ds.with_format("torch")[:]
            self.x, self.y = columns["features"], columns["label"]

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, index):
        if self.columns_once:
            return self.x[index], self.y[index]
        row = self.ds[index]
        return torch.tensor(row["features"], dtype=torch.float32), row["label"]


def synthetic_dataset(rows: int, seed: int = 0) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    return datasets.Dataset.from_dict({"features": x, "label": (np.tanh(x) @ w).argmax(1)})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU())
        self.head = nn.Linear(256, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    datasets.disable_progress_bars()
    dataset = ArrowRows(synthetic_dataset(2 * 40 * args.batch_size), columns_once=args.fix)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    meter, samples, done = Meter(args), 0, False
    while not done:
        correct = total = 0
        for xb, yb in loader:
            with accelerator.accumulate(model):
                logits = model(xb)
                loss = F.cross_entropy(logits, yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            samples += len(yb)
            if accelerator.sync_gradients:
                done, samples = meter.step(samples), 0
                if done:
                    break
        accelerator.print(f"train accuracy {correct / max(total, 1):.3f}")
        done = meter.end_epoch() or done
    meter.report()
    del model, optimizer
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
