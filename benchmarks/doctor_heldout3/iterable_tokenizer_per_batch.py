"""Streaming IterableDataset that loads its Hugging Face tokenizer from disk again for every batch.

Mistake: the text stream is tokenized inside the IterableDataset. To keep the dataset picklable (for
DataLoader workers) the user stores only the tokenizer's directory and calls
`AutoTokenizer.from_pretrained(self.tokenizer_dir)` in the helper that encodes a batch of documents, i.e.
once per batch: each batch re-reads tokenizer_config.json and the 30,000-entry tokenizer.json, rebuilds the
Rust tokenizer and the Python wrapper, then encodes 16 short documents with it.
Source: https://github.com/nyu-mll/jiant/pull/935 ("Speed up retokenization": "Instead of loading
get_tokenizer every time you call align_{tokenizer_name} function, change to loading the tokenizer before
the aligner function") and https://github.com/huggingface/transformers/issues/14428 (tokenization inside
the data pipeline dominating the loader).
Fix (--fix): load the tokenizer once per iterator (at the start of __iter__) and reuse it for every batch;
the token ids are identical.
Expected diagnosis: the training loop waits on input; the time goes to tokenizer construction
(AutoTokenizer.from_pretrained: file reads, JSON parsing, vocabulary building) inside
TopicStream.encode, called for every batch from TopicStream.__iter__; load the tokenizer once.
"""

import gc
import random
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset
from transformers import AutoTokenizer, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

WORDS, TOPICS, DIM, MAX_LEN = 30_000, 8, 64, 64


def make_words(n: int, seed: int = 0) -> list[str]:
    rng, syllables = random.Random(seed), [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def save_tokenizer(words: list[str], directory: str) -> None:
    """Stands for the project's own trained tokenizer, saved next to the data."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]")
    fast.save_pretrained(directory)


class TopicStream(IterableDataset):
    """An endless stream of short documents; each rank reads its own part (its own random stream)."""

    def __init__(self, words, tokenizer_dir, batch_size, batches_per_epoch, rank, load_once):
        self.words, self.tokenizer_dir = words, tokenizer_dir
        self.batch_size, self.batches_per_epoch, self.rank = batch_size, batches_per_epoch, rank
        self.load_once, self.epoch = load_once, 0
        topic_rng = random.Random(1)
        self.topic_words = [topic_rng.sample(range(len(words)), 400) for _ in range(TOPICS)]

    def set_epoch(self, epoch):
        self.epoch = epoch

    def document(self, rng):
        topic = rng.randrange(TOPICS)
        ids = [
            rng.choice(self.topic_words[topic]) if rng.random() < 0.5 else rng.randrange(len(self.words))
            for _ in range(rng.randint(24, MAX_LEN - 1))
        ]
        return " ".join(self.words[i] for i in ids), topic

    def encode(self, texts, tokenizer=None):
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return tokenizer(texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")

    def __iter__(self):
        rng = random.Random(f"{self.rank}-{self.epoch}")
        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir) if self.load_once else None
        for _ in range(self.batches_per_epoch):
            texts, topics = zip(*(self.document(rng) for _ in range(self.batch_size)))
            enc = self.encode(list(texts), tokenizer)
            yield enc["input_ids"], enc["attention_mask"], torch.tensor(topics)


class TopicClassifier(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, DIM, padding_idx=0)
        self.pos = nn.Parameter(0.02 * torch.randn(MAX_LEN, DIM))
        layer = nn.TransformerEncoderLayer(DIM, 4, dim_feedforward=2 * DIM, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, TOPICS)

    def forward(self, ids, mask):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        x = self.encoder(x, src_key_padding_mask=mask == 0)
        m = mask.unsqueeze(-1).float()
        return self.head((x * m).sum(1) / m.sum(1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    words = make_words(WORDS)
    tokenizer_dir = tempfile.mkdtemp(prefix=f"tok-rank{rank}-")
    save_tokenizer(words, tokenizer_dir)
    stream = TopicStream(words, tokenizer_dir, args.batch_size, 30, rank, load_once=args.fix)
    loader = DataLoader(stream, batch_size=None)
    torch.manual_seed(0)
    model = DDP(TopicClassifier(len(words) + 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    meter, epoch = Meter(args), 0
    while True:
        stream.set_epoch(epoch)
        correct = total = 0
        for ids, mask, topics in loader:
            logits = model(ids, mask)
            loss = F.cross_entropy(logits, topics)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == topics).sum())
            total += len(topics)
            if meter.step(len(topics)):
                break
        if rank == 0:
            print(f"epoch {epoch} train accuracy {correct / max(total, 1):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    shutil.rmtree(tokenizer_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
