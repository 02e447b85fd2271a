"""Activation-checkpointed residual MLP trained with ZeroRedundancyOptimizer that syncs parameters one by one.

Mistake: to save memory the user combined per-block activation checkpointing with PyTorch's
ZeroRedundancyOptimizer (ZeRO-1: each rank keeps the AdamW state of its shard of the parameters). After
every step ZeRO must send each rank's freshly updated parameters to the other ranks; with the default
`parameters_as_bucket_view=False` it does so parameter by parameter, one broadcast per tensor (the model has
132 parameter tensors, most of them small LayerNorm weights and biases), so every step ends with ~130
latency-bound gloo broadcasts on top of DDP's gradient all-reduce.
Source: https://github.com/facebookresearch/fairscale/issues/117 ("[OSS] Faster broadcast in step():
Bucketize the param broadcasts, this step is a pain point empirically ... OSS takes a 30% speed hit"),
https://github.com/pytorch/pytorch/pull/52764 (ZeroRedundancyOptimizer: pack parameters in tensor views);
torch.distributed.optim.ZeroRedundancyOptimizer docs: "parameters_as_bucket_view (bool, optional): if True,
parameters are packed into buckets to speed up communication ... if False, each individual parameter is
communicated separately".
Fix (--fix): ZeroRedundancyOptimizer(..., parameters_as_bucket_view=True): the same sharded AdamW, the
same updates, one broadcast per rank's bucket.
Expected diagnosis: after backward, every step spends most of its time in ~130 small broadcast collectives
issued from ZeroRedundancyOptimizer.step (_sync_params), latency-bound, one per parameter tensor; pack the
parameters into buckets (parameters_as_bucket_view=True).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, BLOCKS, CLASSES = 64, 256, 16, 10


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.fc1 = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)
        self.norm2, self.fc2 = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)

    def inner(self, x):
        return self.fc2(F.gelu(self.norm2(self.fc1(self.norm1(x)))))

    def forward(self, x):
        return x + checkpoint(self.inner, x, use_reentrant=False)


class DeepResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_tabular(2 * 16 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(DeepResMLP())
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, parameters_as_bucket_view=args.fix
    )
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
