"""Lightning Trainer (ddp, cpu) binary classifier that recomputes a hand-written AUROC over all past samples at
every step.

Mistake: the LightningModule keeps its own AUROC metric (the user's small replacement for torchmetrics):
`update()` extends two Python lists with every sample's score and label, and `compute()` sorts all the
(score, label) pairs seen so far and does a Mann-Whitney rank sum. `training_step` calls `update()` and
then `compute()` so that the progress bar shows a "live" AUROC: after k steps every step sorts and scans
64 k pairs, so the host work per step grows linearly with the number of steps (and the lists never
shrink).
Source: https://github.com/Lightning-AI/torchmetrics/issues/1461 ("AUROC stores all states that are
entered into it ... runs into memory issues" when used in a training loop),
https://github.com/Lightning-AI/pytorch-lightning/issues/2210 ("compute the metric over epoch instead of
single batch"; update in the step, compute at the epoch end).
Fix (--fix): update the metric every step but compute (and log) it once per epoch, in
on_train_epoch_end; the printed epoch AUROC is the same value.
Expected diagnosis: step time grows steadily with the step count, all of it host-side Python outside
forward/backward/optimizer: sorting and scanning an ever-growing list of past scores in the metric's
compute() (RunningAUROC.compute) called from training_step on every step; compute the metric at the
epoch end (or over a bounded window).
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

FEATURES, WIDTH = 64, 128


class RunningAUROC:
    """Binary AUROC over every (score, label) seen since construction (Mann-Whitney U)."""

    def __init__(self):
        self.scores: list[float] = []
        self.labels: list[int] = []

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        self.scores.extend(scores.detach().tolist())
        self.labels.extend(labels.tolist())

    def compute(self) -> float:
        pairs = sorted(zip(self.scores, self.labels))
        rank_sum, positives = 0.0, 0
        for rank, (_, label) in enumerate(pairs, start=1):
            if label:
                rank_sum += rank
                positives += 1
        negatives = len(pairs) - positives
        if positives == 0 or negatives == 0:
            return 0.5
        return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


class BinaryMLP(L.LightningModule):
    def __init__(self, live_metric: bool):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, 1)
        )
        self.auroc, self.live_metric, self.last_auroc = RunningAUROC(), live_metric, 0.5

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, y.float())
        self.log("train_loss", loss, prog_bar=True)
        self.auroc.update(logits, y)
        if self.live_metric:
            self.last_auroc = self.auroc.compute()
            self.log("train_auroc", self.last_auroc, prog_bar=True)
        return loss

    def on_train_epoch_end(self):
        if not self.live_metric:
            self.last_auroc = self.auroc.compute()
            self.log("train_auroc", self.last_auroc)
        if self.trainer.global_rank == 0:
            print(f"epoch {self.current_epoch} train AUROC so far {self.last_auroc:.4f}", flush=True)

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


def synthetic_binary(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, generator=g)
    noise = 2.0 * torch.randn(samples, generator=g)
    return x, (torch.tanh(x) @ w + noise > 0).long()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    x, y = synthetic_binary(2 * 40 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = BinaryMLP(live_metric=not args.fix)
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
