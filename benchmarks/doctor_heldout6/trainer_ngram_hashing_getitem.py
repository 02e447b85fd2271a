"""Lightning Trainer (ddp, cpu) fastText-style classifier with a 25 MB hashed n-gram embedding whose Dataset
hashes every document's character n-grams again each time it is read.

Mistake (a look-alike of the communication faults: the model has a large gradient all-reduce, but that is not
what makes the step slow): the model is an nn.EmbeddingBag over 2^17 hashed subword buckets x 48
dimensions, so DDP all-reduces a dense 25 MB gradient every step. The time, however, goes to the data:
the Dataset keeps the raw text and its `__getitem__` splits the document into words and, for every word,
computes the FNV-1a hash of each of its character 3- to 5-grams in pure Python (fastText's subword
scheme), on every read of every sample, in the main process (num_workers=0), before the step can start.
Source: https://github.com/piskvorky/gensim/pull/1916 (fastText training "pre-generates the ngram buckets
for each word to avoid calling compute_ngrams and ft_hash in the training loop", about 2x faster),
https://github.com/lucidrains/reformer-pytorch/issues/143 ("tokenization is done in the training loop and it
takes quite some time"; pre-tokenize), https://github.com/marin-community/marin/pull/900 ("pre-tokenizing
the dataset up-front, vs. storing the text and tokenizing in the collator"),
https://github.com/Lightning-AI/pytorch-lightning/issues/1216 (per-sample work in __getitem__ starving the
training step).
Fix (--fix): hash each distinct word's n-grams once (a word -> bucket-ids cache, as fastText does for its
vocabulary) and turn every document into its id tensor once in the Dataset's __init__; __getitem__ returns
the stored tensor (identical ids, identical training). The gradient all-reduce is unchanged.
Expected diagnosis: input-bound, not communication-bound: most of each step is host-side Python in the
main process producing the batch (HashedNgramDocuments.__getitem__ -> subword_ids -> fnv1a, hashing every
character n-gram in pure Python on every read); the 25 MB gradient all-reduce is visible but a minor part.
Precompute the ids (or cache per word); gradient accumulation or a bigger batch would not help much.
"""

import gc
import os
import random
import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

BUCKETS, DIM, CLASSES, WORDS_PER_DOC, VOCAB_WORDS = 2**17, 48, 4, 96, 4000
FNV_OFFSET, FNV_PRIME, MASK32 = 2166136261, 16777619, 0xFFFFFFFF


def fnv1a(text: str) -> int:
    h = FNV_OFFSET
    for byte in text.encode():
        h = ((h ^ byte) * FNV_PRIME) & MASK32
    return h


def subword_ids(word: str) -> list[int]:
    """The word's own bucket and those of its character 3- to 5-grams (with boundary markers), as in fastText."""
    marked = f"<{word}>"
    ngrams = [marked[i : i + n] for n in (3, 4, 5) for i in range(len(marked) - n + 1)]
    return [fnv1a(marked) % BUCKETS] + [fnv1a(g) % BUCKETS for g in ngrams]


def synthetic_corpus(docs: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """Documents of made-up words; each class draws a quarter of its words from its own 100-word topic list."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(VOCAB_WORDS)]
    texts, labels = [], []
    for _ in range(docs):
        label = rng.randrange(CLASSES)
        words = [
            vocabulary[label * 100 + rng.randrange(100)] if rng.random() < 0.25 else rng.choice(vocabulary)
            for _ in range(WORDS_PER_DOC)
        ]
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


class HashedNgramDocuments(Dataset):
    def __init__(self, texts: list[str], labels: list[int], precompute: bool):
        self.texts, self.labels, self.ids = texts, labels, None
        if precompute:
            cache: dict[str, list[int]] = {}
            self.ids = []
            for text in texts:
                ids = []
                for word in text.split():
                    if word not in cache:
                        cache[word] = subword_ids(word)
                    ids.extend(cache[word])
                self.ids.append(torch.tensor(ids))

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        if self.ids is not None:
            return self.ids[index], self.labels[index]
        ids = [i for word in self.texts[index].split() for i in subword_ids(word)]
        return torch.tensor(ids), self.labels[index]


def bag_collate(items):
    ids, labels = zip(*items)
    offsets = torch.tensor([0] + [len(t) for t in ids[:-1]]).cumsum(0)
    return torch.cat(ids), offsets, torch.tensor(labels)


class FastTextClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(BUCKETS, DIM, mode="mean")
        self.classifier = nn.Linear(DIM, CLASSES)
        self.epoch_loss = []

    def training_step(self, batch, batch_idx):
        ids, offsets, labels = batch
        loss = F.cross_entropy(self.classifier(self.embedding(ids, offsets)), labels)
        self.epoch_loss.append(loss.item())
        return loss

    def on_train_epoch_end(self):
        if self.trainer.global_rank == 0:
            mean = sum(self.epoch_loss) / max(len(self.epoch_loss), 1)
            print(f"epoch {self.current_epoch} train loss (rank 0) {mean:.4f}", flush=True)
        self.epoch_loss = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=2.0)


class MeterCallback(L.Callback):
    def __init__(self, args):
        self.args, self.meter = args, None

    def on_train_start(self, trainer, pl_module):
        self.meter = Meter(self.args)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.meter.step(len(batch[2])):
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module):
        if self.meter.end_epoch():
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        self.meter.report()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    texts, labels = synthetic_corpus(2 * 40 * args.batch_size)
    dataset = HashedNgramDocuments(texts, labels, precompute=args.fix)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, collate_fn=bag_collate)
    torch.manual_seed(0)
    model = FastTextClassifier()
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
