"""Linear probing on a "pretrained" backbone whose parameters were never frozen.

Mistake: the user trains only the new classifier head (the optimizer is given `model.head.parameters()`)
but leaves `requires_grad=True` on the backbone. Autograd still computes every backbone weight gradient,
and DDP registers the backbone's parameters for gradient sync, so each step pays the full backward and an
all-reduce of gradients that the optimizer then ignores.
Source: https://github.com/JDAI-CV/fast-reid/issues/178 (layers meant to be frozen kept requires_grad=True)
and https://discuss.pytorch.org/t/freezing-the-updates-without-freezing-the-gradients/7358 ("give the
optimizer only the ones you want ... it is still a good idea to set requires_grad to False though, so
that they don't needlessly accumulate grads").
Fix (--fix): `model.backbone.requires_grad_(False)` before wrapping in DDP; the optimizer, the head and
the (unchanged) backbone are the same, so training is identical.
Expected diagnosis: backward (and gradient all-reduce) far larger than the trainable part needs: gradients
are computed and synchronised for the backbone parameters that the optimizer never updates; freeze them
(requires_grad_(False) on `backbone`, where the model is built in main()).
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
from common import Meter, arguments, synthetic_cifar


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class Classifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.backbone = nn.Sequential(
            conv_block(3, 32),
            nn.MaxPool2d(2),
            conv_block(32, 64),
            nn.MaxPool2d(2),
            conv_block(64, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Classifier()  # stands for torchvision/timm weights loaded from disk
    if args.fix:
        model.backbone.requires_grad_(False)
    model = DDP(model)
    optimizer = torch.optim.SGD(model.module.head.parameters(), lr=0.05, momentum=0.9)

    images, labels = synthetic_cifar(2048)
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(len(x)):
                break
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
