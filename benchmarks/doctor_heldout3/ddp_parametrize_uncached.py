"""Plain DDP: an orthogonal RNN whose parametrized recurrent matrix is recomputed at every time step.

Mistake: the user keeps the recurrent matrix of a hand-written RNN orthogonal (for long-range memory) with
torch.nn.utils.parametrizations.orthogonal (the default "matrix_exp" map). A parametrized tensor is
recomputed on *every* attribute access, and the cell reads self.recurrent.weight once per time step, so each
forward evaluates matrix_exp of the 128x128 matrix 32 times (and autograd differentiates all 32 copies,
each through a 256x256 matrix exponential in backward), although the matrix is the same at every step.
Source: https://github.com/pytorch/pytorch/issues/7313 (the parametrization design discussion: "you could
go with a finer grain and simply wrap the loop of your RNN" in the cached() context), the PyTorch
parametrizations tutorial added in https://github.com/pytorch/tutorials/pull/1444 ("Caching the value of a
parametrization") and https://github.com/lezcano/geotorch/issues/46 (most of the computation goes to the
orthogonalization).
Fix (--fix): run the forward inside torch.nn.utils.parametrize.cached(), so the orthogonal matrix is computed
once per forward; same model, same data, same gradients.
Expected diagnosis: forward and backward dominated by matrix_exp (and its backward) of the recurrent weight,
recomputed at every time step of OrthoRNN.forward because the parametrization is not cached; wrap the
forward in parametrize.cached().
"""

import contextlib
import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import orthogonal
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, HIDDEN, STEPS, CLASSES = 32, 128, 32, 10


class OrthoRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.recurrent = orthogonal(nn.Linear(HIDDEN, HIDDEN, bias=False))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):  # x: (batch, time, features)
        drive = self.inp(x)
        h = torch.zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[1]):
            h = torch.tanh(drive[:, t] + self.recurrent(h))
        return self.head(h)


def synthetic_sequences(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, STEPS, FEATURES, generator=g)
    probe = torch.randn(FEATURES, CLASSES, generator=g)
    weights = torch.linspace(0.2, 1.0, STEPS).view(1, STEPS, 1)
    y = ((x * weights).sum(1) @ probe).argmax(1)
    return x, y


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_sequences(3072)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(OrthoRNN())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    cache = parametrize.cached if args.fix else contextlib.nullcontext
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total = correct = 0
        for xb, yb in loader:
            with cache():
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
