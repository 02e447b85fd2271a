"""Plain DDP prototype classifier whose squared distances are computed by broadcasting a B x K x D difference.

Mistake: the model scores each embedding against 512 learnable class prototypes with the squared Euclidean
distance, written the "obvious" NumPy way: `((z[:, None, :] - self.prototypes[None, :, :]) ** 2).sum(-1)`.
This materialises a batch x prototypes x dim tensor (128 x 512 x 128 floats, 32 MB) and its square, and the
backward pass runs several more element-wise passes over tensors of that size, all memory-bound, for what is
one small matrix product.
Source: https://github.com/SeonghwanSeo/kfold/pull/308 (review: "materializes an intermediate tensor of
shape [..., Lx, Ly, 3] via broadcasting ... a major memory/performance regression ... prefer torch.cdist"),
https://github.com/Maghoumi/pytorch-softdtw-cuda/pull/23 (pairwise distance without broadcasting x and y),
https://github.com/pytorch/pytorch/pull/50196 (the docs' pairwise-distance hint materialises the big
broadcast matrix).
Fix (--fix): the same squared distances by the expansion |z|^2 + |p|^2 - 2 z p^T (one matmul), clamped at
zero; same model, same data (equal up to float rounding).
Expected diagnosis: forward and backward dominated by memory-bound element-wise ops (sub, pow, sum and
their backward) on a B x K x D broadcast tensor in ProtoNet.sq_distances; compute the distances with a
matmul (or torch.cdist).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, EMBED, PROTOTYPES = 64, 128, 512


class ProtoNet(nn.Module):
    def __init__(self, matmul_distances: bool):
        super().__init__()
        self.matmul_distances = matmul_distances
        self.encoder = nn.Sequential(nn.Linear(FEATURES, 256), nn.GELU(), nn.Linear(256, EMBED))
        self.prototypes = nn.Parameter(torch.randn(PROTOTYPES, EMBED) * 0.1)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def sq_distances(self, z: torch.Tensor) -> torch.Tensor:
        if self.matmul_distances:
            d = z.pow(2).sum(1, keepdim=True) + self.prototypes.pow(2).sum(1) - 2.0 * z @ self.prototypes.t()
            return d.clamp_min(0.0)
        return ((z[:, None, :] - self.prototypes[None, :, :]) ** 2).sum(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(x)
        return -self.sq_distances(z) * self.log_temperature.exp()


def synthetic_points(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(PROTOTYPES, FEATURES, generator=g)
    y = torch.randint(0, PROTOTYPES, (samples,), generator=g)
    return centers[y] + 0.5 * torch.randn(samples, FEATURES, generator=g), y


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_points(2 * 24 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(ProtoNet(matmul_distances=args.fix))
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
