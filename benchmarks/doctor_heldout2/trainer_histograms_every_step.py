"""Lightning Trainer writing TensorBoard histograms of every weight and gradient at every step.

Mistake: to watch weight and gradient distributions the user's LightningModule calls
`self.logger.experiment.add_histogram(...)` for every parameter and every gradient in
on_after_backward, unconditionally. Each call copies the tensor to numpy, bins it and writes a summary
event, on every optimizer step, on rank 0 (Lightning's experiment is a no-op on the other ranks, which
then wait for rank 0 at the next gradient all-reduce).
Source: https://github.com/pytorch/pytorch/issues/43328 (add_histogram time per epoch "rendering
training impossible"), https://github.com/marin-community/marin/pull/925 (histogram logging "adds some
amount of overhead to training (pretty big for small models)") and
https://github.com/sherjilozair/char-rnn-tensorflow/issues/112 ("remove the summary tensor make training
10x times faster").
Fix (--fix): write the histograms only on logging steps (every trainer.log_every_n_steps = 50 steps, as
Lightning does for scalars); model, data and optimizer unchanged.
Expected diagnosis: rank 0 spends most of each step outside forward/backward in host work (TensorBoard
add_histogram of all weights and gradients in TinyLM.on_after_backward), and rank 1 waits for it in the
gradient all-reduce; log histograms every N steps.
"""

import os
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS = 512, 128, 4, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.out(att)
        return x + self.mlp(self.ln2(x))


class TinyLM(L.LightningModule):
    def __init__(self, histograms_every_step: bool):
        super().__init__()
        self.histograms_every_step = histograms_every_step
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        logits = self(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.log("train_loss", loss)
        return loss

    def on_after_backward(self):
        step = self.trainer.global_step
        if not self.histograms_every_step and step % self.trainer.log_every_n_steps:
            return
        writer = self.logger.experiment
        for name, param in self.named_parameters():
            writer.add_histogram(f"weights/{name}", param, step)
            writer.add_histogram(f"grads/{name}", param.grad, step)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


class MeterCallback(L.Callback):
    """The benchmark's bookkeeping (common.Meter) as a callback; no collectives per step."""

    def __init__(self, args):
        self.args, self.meter = args, None

    def on_train_start(self, trainer, pl_module):
        self.meter = Meter(self.args)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.meter.step(len(batch[0])):
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module):
        if self.meter.end_epoch():
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        self.meter.report()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))
    starts = torch.randint(0, len(corpus) - args.seq_len - 1, (320, 1), generator=torch.Generator().manual_seed(2))
    windows = corpus[starts + torch.arange(args.seq_len + 1)]
    loader = DataLoader(TensorDataset(windows), batch_size=args.batch_size, shuffle=True, drop_last=True)
    log_dir = os.environ.get("PARATRAIN_RUN_DIR", tempfile.gettempdir())
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1000,
        logger=TensorBoardLogger(log_dir, name="tb"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MeterCallback(args)],
    )
    trainer.fit(TinyLM(histograms_every_step=not args.fix), loader)


if __name__ == "__main__":
    main()
