"""Lightning Trainer (ddp, cpu) classifier that logs six training metrics per step with sync_dist=True.

Mistake: `training_step` computes the loss, accuracy, top-3 accuracy, mean confidence, prediction entropy
and logit norm of the batch and logs them with `self.log_dict(metrics, sync_dist=True)` (on_step, the
default in training_step, and on_epoch). Because the values are logged on_step with sync_dist, Lightning
reduces each of them across ranks right away, in every step: a barrier plus an all-reduce per metric, 12
small blocking collectives per step on top of DDP's gradient all-reduce. Each is latency-bound and makes the
ranks wait for each other; the model's own forward/backward is only a few milliseconds.
Source: https://github.com/Lightning-AI/pytorch-lightning/issues/17988 (self.log(..., sync_dist=True) in
training_step "slowing down the training extremely"), https://github.com/sb-ai-lab/RePlay/pull/100 (two
metrics logged with sync_dist=True on every step, "3,902 step-time collective reductions" per epoch;
accumulate locally and do one reduction at epoch end), https://github.com/NVIDIA-NeMo/Speech/pull/4876
(sync_dist removed from per-step logging "to prevent too much communication overhead per step").
Fix (--fix): log the same metrics with on_step=False, on_epoch=True, sync_dist=True: Lightning accumulates
them locally and reduces them once, at the epoch end (the same epoch means are printed).
Expected diagnosis: each step spends most of its time in many small blocking collectives (barrier +
all_reduce per logged metric) outside forward/backward and DDP's gradient all-reduce, issued by Lightning's
logging (self.log_dict(..., sync_dist=True) on_step in training_step); log on_epoch only, or without
sync_dist per step.
"""

import gc
import os
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, CLASSES = 64, 256, 10


class TabularClassifier(L.LightningModule):
    def __init__(self, per_step_sync: bool):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, CLASSES)
        )
        self.per_step_sync = per_step_sync

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        with torch.no_grad():
            probs = logits.softmax(1)
            metrics = {
                "loss": loss.detach(),
                "accuracy": (logits.argmax(1) == y).float().mean(),
                "top3": (logits.topk(3, dim=1).indices == y[:, None]).any(1).float().mean(),
                "confidence": probs.max(1).values.mean(),
                "entropy": -(probs * probs.clamp_min(1e-12).log()).sum(1).mean(),
                "logit_norm": logits.norm(dim=1).mean(),
            }
        if self.per_step_sync:
            self.log_dict(metrics, on_step=True, on_epoch=True, sync_dist=True)
        else:
            self.log_dict(metrics, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


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


class PrintEpochMetrics(L.Callback):
    """Prints the previous epoch's synced means (Lightning reduces epoch-level logs after the epoch-end hooks)."""

    def __init__(self):
        self.last_epoch = None

    def _print(self, trainer, epoch):
        metrics = trainer.callback_metrics
        names = ("loss", "accuracy", "top3", "entropy")
        values = [metrics.get(f"{n}_epoch", metrics.get(n)) for n in names]
        if trainer.global_rank == 0 and all(v is not None for v in values):
            text = " ".join(f"{n} {float(v):.4f}" for n, v in zip(names, values))
            print(f"epoch {epoch} {text}", flush=True)

    def on_train_epoch_start(self, trainer, pl_module):
        if self.last_epoch is not None:
            self._print(trainer, self.last_epoch)

    def on_train_epoch_end(self, trainer, pl_module):
        self.last_epoch = trainer.current_epoch

    def on_train_end(self, trainer, pl_module):
        if self.last_epoch is not None:
            self._print(trainer, self.last_epoch)


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    x, y = synthetic_tabular(2 * 40 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = TabularClassifier(per_step_sync=not args.fix)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MeterCallback(args), PrintEpochMetrics()],
    )
    trainer.fit(model, loader)
    del model, trainer
    gc.collect()


if __name__ == "__main__":
    main()
