"""Lightning Trainer (ddp, cpu) run left with Python's tracemalloc tracing on from a memory-leak hunt.

Mistake: while chasing a host-memory leak the user added `tracemalloc.start(25)` at the top of main (to
print the top allocation sites at the end of training) and never took it out. With tracing on, every
Python memory allocation and free goes through tracemalloc's hooks, which capture a 25-frame traceback and
update its hash tables. Lightning's training loop is Python-heavy (hooks, callbacks, logging, closures,
the optimizer's per-parameter loop), so every step's host work gets several times slower, on every rank.
Source: https://github.com/huggingface/peft/pull/1126 ("Fix: TorchTracemalloc ruins Windows performance ...
the training barely even runs ... significantly speeds up the training process" once made optional),
https://github.com/Oldpan/Pytorch-Memory-Utils/issues/21 ("I forgot to close this script after debugging the
program, which caused the network training to be dozens of times slower"),
https://github.com/python/cpython/issues/150494 (tracemalloc "imposes a high cost ... in CPU (to collect the
stacktrace for every allocation)").
Fix (--fix): do not start tracemalloc (same model, same data, same Trainer).
Expected diagnosis: host-side Python time per step far above what a Lightning loop and this small model
need, spread over all Python code (allocation-heavy paths slowest), on every rank, with nothing in the
data, compute or communication to explain it; tracemalloc.start(25) is active in main (tracemalloc's
allocation hooks); stop tracemalloc.
"""

import gc
import os
import sys
import tracemalloc
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, CLASSES = 64, 128, 10


class SmallMLP(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, WIDTH),
            nn.LayerNorm(WIDTH),
            nn.GELU(),
            nn.Linear(WIDTH, WIDTH),
            nn.LayerNorm(WIDTH),
            nn.GELU(),
            nn.Linear(WIDTH, CLASSES),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)
        self.log("train_acc", (logits.argmax(1) == y).float().mean())
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


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if not args.fix:
        tracemalloc.start(25)  # TODO remove once the host-memory leak is found
    x, y = synthetic_tabular(2 * 30 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = SmallMLP()
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
    if tracemalloc.is_tracing() and trainer.global_rank == 0:
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:3]:
            print(stat, flush=True)
    del model, trainer
    gc.collect()


if __name__ == "__main__":
    main()
