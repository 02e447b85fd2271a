"""torch.compile'd tabular MLP whose Dataset reads every sample out of a pandas DataFrame with .iloc.

Mistake: the training table (64 numeric features and a label) is kept as a pandas DataFrame and the Dataset's
__getitem__ does `row = self.frame.iloc[index]` and then `row[self.feature_columns].to_numpy(...)` and
`row["label"]` for every sample. Each .iloc row access builds a new Series (index objects, dtype resolution,
block manager look-ups), and the label/feature indexing builds more of them: hundreds of microseconds of
pandas machinery per sample, in the main process, on every step. The model itself is small and compiled,
so the step waits on the loader.
Source: https://github.com/braindecode/braindecode/pull/89 ("I noticed there is a substantial slowdown
through `windows.metadata.iloc[index]` call ... I store the targets and crop indices as numpy arrays on
window dataset creation. Overall speedup ... more than factor 7"),
https://github.com/WorldCereal/presto-worldcereal/pull/9 (profile dominated by pandas Series.__getitem__ in
the dataset's __getitem__).
Fix (--fix): convert the feature columns and labels to tensors once in __init__ and index those in
__getitem__; same rows, same values, same order.
Expected diagnosis: the training loop waits on input produced in the main process; the time is pandas
row indexing (DataFrame.iloc / Series.__getitem__) in TabularFrame.__getitem__; convert the frame to
arrays/tensors once (more workers would only hide it).
"""

import gc
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, CLASSES = 64, 8


class TabularFrame(Dataset):
    def __init__(self, frame: pd.DataFrame, as_arrays: bool):
        self.frame, self.as_arrays = frame, as_arrays
        self.feature_columns = [c for c in frame.columns if c.startswith("f")]
        if as_arrays:
            self.x = torch.from_numpy(frame[self.feature_columns].to_numpy(dtype=np.float32))
            self.y = torch.from_numpy(frame["label"].to_numpy(dtype=np.int64))

    def __len__(self):
        return len(self.frame)

    def __getitem__(self, index):
        if self.as_arrays:
            return self.x[index], self.y[index]
        row = self.frame.iloc[index]
        features = torch.from_numpy(row[self.feature_columns].to_numpy(dtype=np.float32))
        return features, int(row["label"])


def synthetic_frame(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(FEATURES)])
    frame["label"] = (np.tanh(x) @ w).argmax(1)
    return frame


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    dataset = TabularFrame(synthetic_frame(2 * 30 * args.batch_size), as_arrays=args.fix)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(FEATURES, 256), nn.SiLU(), nn.LayerNorm(256), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, CLASSES)
    )
    model = torch.compile(DDP(net))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
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
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train accuracy {correct / max(total, 1):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
