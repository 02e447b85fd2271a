"""FSDP2 (fully_shard, gloo CPU mesh) weight-shared model whose shared block is re-gathered at every call.

Mistake: the encoder applies one shared residual block 8 times (cross-layer parameter sharing) and the
user shards it like every block of an ordinary stack, as its own FSDP unit, `fully_shard(model.shared)`,
with the default reshard_after_forward=True. FSDP2 then frees the block's unsharded parameters after *each*
of its 8 calls and all-gathers them again before the next one, and does the same for each of the 8 uses in
backward (with a reduce-scatter after each): ~16 all-gathers of the same 9.4 MB of parameters per step
instead of one.
Source: https://github.com/Robbyant/lingbot-world/pull/52 ("With FULL_SHARD, FSDP shards params after each
forward and re-gathers on the next call. Across the 35 forwards ... that re-gather fires repeatedly ...
the per-forward re-gather disappears" once the parameters are kept unsharded),
https://github.com/AI-Hypercomputer/maxtext/pull/1228 ("all gather and reduce scattering the weights every
microbatch ... a factor of num_pipeline_microbatches less communication").
Fix (--fix): no separate FSDP unit for the shared block: it stays in the root unit (fully_shard(model)),
which is gathered once per step and reduce-scattered once after backward; same model, same parameters
sharded, same updates.
Expected diagnosis: communication-bound: far more all-gathers (and reduce-scatters) per step than FSDP
units, the shared block's parameters all-gathered again at every one of its 8 calls in forward and in
backward, because the repeatedly-called block is its own FSDP unit resharded after each call
(fully_shard(model.shared) with the default reshard_after_forward=True in main); keep it unsharded for the
step (fold it into the root unit, or reshard_after_forward=False).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, DEPTH, CLASSES = 64, 768, 8, 10


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class SharedDepthNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.shared = ResidualBlock()  # applied DEPTH times
        self.head = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES))

    def forward(self, x):
        h = self.stem(x)
        for _ in range(DEPTH):
            h = self.shared(h)
        return self.head(h)


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x, y = synthetic_tabular(2 * 12 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = SharedDepthNet()
    if not args.fix:
        fully_shard(model.shared, mesh=mesh)  # one FSDP unit per block, as for an unshared stack
    fully_shard(model, mesh=mesh)
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
