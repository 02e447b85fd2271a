"""Lightning Trainer logging per-parameter gradient norms every step with sync_dist=True.

Mistake: to watch for exploding gradients the user logs Lightning's grad_norm(self, norm_type=2) (one value
per parameter plus the total) in on_before_optimizer_step, and adds sync_dist=True because Lightning
recommends it for distributed logging. Every self.log(..., sync_dist=True) with on_step=True all-reduces
its value at once: ~50 tiny all-reduces per optimizer step. After DDP's gradient all-reduce the gradients
are identical on every rank, so all these reductions return the values each rank already had.
Source: https://github.com/sb-ai-lab/RePlay/pull/100 ("logs two metrics with sync_dist=True on every step,
causing 3,902 step-time collective reductions"), https://github.com/mmcdermott/MEDS_EIC_AR/issues/48
("skips the collective on training-step logs (Lightning's recommended performance pattern)") and
https://github.com/NVIDIA-NeMo/Speech/pull/4876 (sync_dist removed from per-step logs for communication
overhead).
Fix (--fix): the same log_dict with sync_dist=False; the logged numbers are identical (the gradients are
already synchronised), model/data/optimizer unchanged.
Expected diagnosis: many tiny all-reduces every step between backward and the optimizer step, from
self.log_dict(grad_norm(...), sync_dist=True) in TinyLM.on_before_optimizer_step; drop sync_dist for
per-step values that are already identical across ranks.
"""

import os
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import grad_norm
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
    def __init__(self, sync_grad_norms: bool):
        super().__init__()
        self.sync_grad_norms = sync_grad_norms
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

    def on_before_optimizer_step(self, optimizer):
        self.log_dict(grad_norm(self, norm_type=2), sync_dist=self.sync_grad_norms)

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
        logger=CSVLogger(log_dir, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MeterCallback(args)],
    )
    trainer.fit(TinyLM(sync_grad_norms=not args.fix), loader)


if __name__ == "__main__":
    main()
