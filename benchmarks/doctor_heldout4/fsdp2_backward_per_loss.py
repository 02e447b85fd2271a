"""FSDP2 (fully_shard, gloo CPU mesh) multi-task model that calls backward once per task loss.

Mistake: the model has a shared residual-MLP trunk and three task heads (classification, regression,
an auxiliary reconstruction). Instead of summing the three losses and calling backward once, the loop does
`loss.backward(retain_graph=True)` for each task loss in turn. Every one of the three backward passes runs
through the whole shared trunk, and because each backward is a complete FSDP2 backward, every pass again
all-gathers the resharded block parameters and reduce-scatters all gradients: three times the trunk's
backward compute and three times the backward communication, for the same summed gradient.
Source: https://github.com/mosaicml/composer/pull/1240 ("the backwards pass is called on each individual
loss ... In practice, most people sum multiple losses, then call backwards on the summed losses"),
https://github.com/filipradenovic/cnnimageretrieval-pytorch/issues/20 (several loss.backward() per
mini-batch; "both implementations would yield the same result ... a trade-off between performance and
memory usage").
Fix (--fix): (loss_cls + loss_reg + loss_aux).backward(): one backward, the same accumulated gradients.
Expected diagnosis: backward takes about three times what one backward of this model needs: three backward
passes per step through the shared trunk, each with its own FSDP2 all-gathers and reduce-scatters, from
the per-task loss.backward(retain_graph=True) loop in main; sum the losses and call backward once.
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

FEATURES, WIDTH, BLOCKS, CLASSES = 64, 384, 6, 10


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class MultiTaskNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList([ResidualBlock() for _ in range(BLOCKS)])
        self.cls_head = nn.Linear(WIDTH, CLASSES)
        self.reg_head = nn.Linear(WIDTH, 1)
        self.aux_head = nn.Linear(WIDTH, FEATURES)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.cls_head(h), self.reg_head(h).squeeze(1), self.aux_head(h)


def synthetic_multitask(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    hidden = torch.tanh(x @ w1)
    return x, (hidden @ w2).argmax(1), hidden.sum(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x, y_cls, y_reg = synthetic_multitask(2 * 8 * args.batch_size)
    dataset = TensorDataset(x, y_cls, y_reg)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = MultiTaskNet()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        correct = total = 0
        for xb, yb_cls, yb_reg in loader:
            logits, reg, recon = model(xb)
            losses = [F.cross_entropy(logits, yb_cls), F.mse_loss(reg, yb_reg), F.mse_loss(recon, xb)]
            optimizer.zero_grad(set_to_none=True)
            if args.fix:
                sum(losses).backward()
            else:
                for i, loss in enumerate(losses):
                    loss.backward(retain_graph=i < len(losses) - 1)
            optimizer.step()
            correct += int((logits.argmax(1) == yb_cls).sum())
            total += len(yb_cls)
            if meter.step(len(yb_cls)):
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
