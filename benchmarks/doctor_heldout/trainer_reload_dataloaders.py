"""Lightning Trainer reloading dataloaders every epoch, with the whole corpus re-tokenized in train_dataloader().

Mistake: the user wants fresh random training windows every epoch, so the Trainer has
reload_dataloaders_every_n_epochs=1; but the LightningModule's train_dataloader() also reads and tokenizes
the raw corpus (regex word split and vocabulary lookup in Python). Lightning calls train_dataloader() at
the start of every epoch on every rank, so each epoch begins with seconds of re-tokenizing text whose
tokens never change, while the model waits.
Source: https://github.com/pytorch/pytorch/issues/40413 ("every time a new epoch begins, the data file will
be loaded from disk again and loading this file takes a lot of time"),
https://github.com/kohya-ss/sd-scripts/pull/120 ("Load train data outside of epochs loop": a long gap
between epochs) and https://github.com/Lightning-AI/pytorch-lightning/issues/1181 (reloading every epoch
wastes computation for people who build the data in train_dataloader).
Fix (--fix): tokenize once in setup() and let train_dataloader() only draw the new random windows; the
reload every epoch, the windows, the model and the Trainer are otherwise unchanged.
Expected diagnosis: a stall at the start of every epoch (data preparation outside the steps, on every
rank) caused by TinyLM.train_dataloader() re-tokenizing the corpus each time
reload_dataloaders_every_n_epochs=1 calls it; move the tokenization to setup()/__init__.
"""

import random
import re
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

WORDS, DIM, HEADS, LAYERS, SEQ = 2000, 128, 4, 2, 64
TOKEN = re.compile(r"\w+|[^\w\s]")


def raw_corpus(n_words=1_000_000):
    rng = random.Random(0)
    vocab = [f"word{i}" for i in range(WORDS)]
    return " ".join(rng.choice(vocab) + ("." if rng.random() < 0.05 else "") for _ in range(n_words))


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
    def __init__(self, text, batch_size, tokenize_once):
        super().__init__()
        self.text, self.batch_size, self.tokenize_once = text, batch_size, tokenize_once
        self.vocab = {w: i + 2 for i, w in enumerate(f"word{i}" for i in range(WORDS))}
        self.vocab["."] = 1
        self.tokens = None
        self.emb = nn.Embedding(WORDS + 2, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, WORDS + 2)

    def tokenize(self):
        return torch.tensor([self.vocab.get(t.lower(), 0) for t in TOKEN.findall(self.text)])

    def setup(self, stage):
        if self.tokenize_once:
            self.tokens = self.tokenize()

    def train_dataloader(self):
        tokens = self.tokens if self.tokenize_once else self.tokenize()
        g = torch.Generator().manual_seed(self.current_epoch)
        starts = torch.randint(0, len(tokens) - SEQ - 1, (384, 1), generator=g)
        windows = tokens[starts + torch.arange(SEQ + 1)]
        return DataLoader(TensorDataset(windows), batch_size=self.batch_size, shuffle=True, drop_last=True)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))

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
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=1000,
        reload_dataloaders_every_n_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MeterCallback(args)],
    )
    trainer.fit(TinyLM(raw_corpus(), args.batch_size, tokenize_once=args.fix))


if __name__ == "__main__":
    main()
