"""Lightning Trainer (ddp, cpu) module that all-reduces every gradient by hand although DDP already has.

Mistake: the LightningModule was ported from a hand-rolled distributed script and kept its
`average_gradients` helper (the one from PyTorch's "Writing Distributed Applications" tutorial): in
on_after_backward it calls dist.all_reduce on every parameter's gradient and divides by the world size.
Under strategy="ddp" the gradients have already been averaged by DDP's bucketed all-reduce during
backward, so this is a second, un-bucketed all-reduce of all 22 MB of gradients at every step, issued
parameter by parameter after backward (nothing overlaps it), and it changes nothing (the average of equal
tensors).
Source: https://github.com/kubeflow/pytorch-operator/issues/122 ("Double gradient reduction in examples?":
DistributedDataParallel plus a DIY average_gradients), https://github.com/pytorch/tutorials/issues/2305
("If using DistributedDataParallel as model, does we need to the step of average_gradients(model)?").
Fix (--fix): drop the manual averaging (on_after_backward does nothing); the gradients are identical.
Expected diagnosis: after backward, every step spends a long time in per-parameter all_reduce calls
outside DDP's gradient synchronisation (ManualSyncMLP.on_after_backward / average_gradients), a redundant
second gradient all-reduce; remove it.
"""

import gc
import os
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, CLASSES = 512, 1536, 10


def average_gradients(model: nn.Module) -> None:
    size = float(dist.get_world_size())
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
            param.grad.data /= size


class ManualSyncMLP(L.LightningModule):
    def __init__(self, manual_sync: bool):
        super().__init__()
        self.manual_sync = manual_sync
        self.net = nn.Sequential(
            nn.Linear(FEATURES, WIDTH),
            nn.GELU(),
            nn.Linear(WIDTH, WIDTH),
            nn.GELU(),
            nn.Linear(WIDTH, WIDTH),
            nn.GELU(),
            nn.Linear(WIDTH, CLASSES),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def on_after_backward(self):
        if self.manual_sync:
            average_gradients(self)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


class MeterCallback(L.Callback):
    def __init__(self, args):
        self.args, self.meter = args, None

    def on_train_start(self, trainer, pl_module):
        self.meter = Meter(self.args)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.meter.step(len(batch[1])):
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module):
        if self.meter.end_epoch():
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        self.meter.report()


def synthetic_features(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    return x, (x @ w).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    x, y = synthetic_features(2 * 40 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = ManualSyncMLP(manual_sync=not args.fix)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MeterCallback(args)],
    )
    trainer.fit(model, loader)
    del model, trainer
    gc.collect()


if __name__ == "__main__":
    main()
