"""Lightning Trainer with detect_anomaly=True left on after debugging a NaN.

Mistake: the Trainer was created with detect_anomaly=True to track down a NaN loss, and the flag stayed.
Lightning then runs every training step under torch.autograd.set_detect_anomaly(True): each forward op
records its Python traceback and every backward function's outputs are checked for NaN/inf, which on a
model made of many small operators multiplies the step time.
Source: https://github.com/Lightning-AI/pytorch-lightning/issues/12344 ("Trainer detect_anomaly may
considerably slowdown performance", 3x) and https://github.com/Lightning-AI/pytorch-lightning/issues/17359
("Sometimes after debugging, user forget setting detect_anomaly to False ... the train speed when
detect_anomaly is turned off is 2.5x when it is turned on").
Fix (--fix): Trainer(detect_anomaly=False) (the default); model, data and strategy unchanged.
Expected diagnosis: forward and backward dominated by autograd anomaly-detection overhead (per-op
traceback capture and NaN checks), not by the model's arithmetic: Trainer(detect_anomaly=True) in main();
turn it off.
"""

import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
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
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

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
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1000,
        detect_anomaly=not args.fix,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MeterCallback(args)],
    )
    trainer.fit(TinyLM(), loader)


if __name__ == "__main__":
    main()
