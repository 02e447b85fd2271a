"""Plain DDP fastText-style topic classifier trained on two corpora joined with ConcatDataset (short
headlines, long abstracts), split between the ranks by hand as the two contiguous halves of the join.

Mistake: the user concatenates the two corpora, `corpus = ConcatDataset([headlines, abstracts])`, and gives
each rank "its half" with `Subset(corpus, range(rank * half, (rank + 1) * half))` and a DataLoader with
`shuffle=True`. The two corpora have the same number of documents, so the halves are the corpora: rank 0
trains on every headline (~10 words), rank 1 on every abstract (~260 words). Both ranks run the same code on
32 documents per step, but the documents are tokenized in `Dataset.__getitem__` (a pure-Python greedy
WordPiece over the subword vocabulary, plus hashed subword bigrams, in the main process: num_workers=0), and
an abstract has ~26x the words of a headline, so producing rank 1's batch takes far longer than rank 0's
forward/backward and rank 0 waits for rank 1 in every gradient all-reduce. The model (EmbeddingBag + MLP)
costs about the same on both ranks.
Source: https://github.com/pytorch/torchtitan/pull/3131 (split_dataset_by_node splits a map-style dataset
into contiguous chunks, "highly-imbalanced examples to different nodes ... if shorter examples tend to be
early in the dataset"), https://github.com/huggingface/datasets/pull/5369 ("rank 0 is given the first chunk
of the dataset"), https://github.com/microsoft/onnxruntime/pull/10163 ("workers work on data samples with
varying complexity resulting in stragglers").
Fix (--fix): one DistributedSampler(corpus, shuffle=True, seed=0) over the whole concatenation (set_epoch
every epoch): each rank gets a random half of the joined corpus, about half of each source. Same documents
per epoch in total, same tokenizer, same model, same batch size.
Expected diagnosis: a straggler from the data split: rank 1's steps are longer because its input pipeline
(`__getitem__` tokenizing long abstracts) takes much longer than rank 0's; rank 0 spends the difference
waiting in the gradient all-reduce. Deal the samples out evenly across ranks (DistributedSampler with
shuffle over the concatenation).
"""

import gc
import itertools
import random
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

TOPICS, DIM, BIGRAM_BUCKETS = 4, 32, 2048
DOCS_PER_SOURCE = 1280  # 40 batches of 32 per rank and epoch
HEADLINE_WORDS, ABSTRACT_WORDS = (6, 14), (220, 300)
CONSONANTS, VOWELS = "bcdfghklmnprstvz", "aeiou"
WORD_RE = re.compile(r"[a-z]+")


def make_lexicon(rng: random.Random):
    """Syllables (the tokenizer's pieces) and 6,000 words of 2-4 syllables each."""
    syllables = sorted(
        {c + v + (rng.choice(CONSONANTS) if rng.random() < 0.4 else "") for c in CONSONANTS for v in VOWELS}
    )
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(6000)})
    return syllables, words


def make_documents(rng: random.Random, words: list[str], count: int, length: tuple[int, int]):
    """Documents of a topic-skewed word distribution (label = topic), as raw text with capitals and punctuation."""
    texts, labels = [], []
    for _ in range(count):
        topic = rng.randrange(TOPICS)
        band = words[topic * len(words) // TOPICS : (topic + 1) * len(words) // TOPICS]
        picked = [rng.choice(band) if rng.random() < 0.6 else rng.choice(words) for _ in range(rng.randint(*length))]
        sentences = [" ".join(picked[i : i + 12]).capitalize() + "." for i in range(0, len(picked), 12)]
        texts.append(" ".join(sentences))
        labels.append(topic)
    return texts, labels


class WordPiece:
    """A greedy longest-match-first subword tokenizer (BERT's algorithm) with hashed piece bigrams."""

    def __init__(self, syllables: list[str]):
        pieces = ["[UNK]", *syllables, *("##" + s for s in syllables)]
        self.vocab = {p: i for i, p in enumerate(pieces)}
        self.size = len(pieces) + BIGRAM_BUCKETS

    def word(self, word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [0]
            start = end
        return ids

    def encode(self, text: str) -> list[int]:
        ids = [i for w in WORD_RE.findall(text.lower()) for i in self.word(w)]
        base = len(self.vocab)
        return ids + [base + (a * 7919 + b) % BIGRAM_BUCKETS for a, b in itertools.pairwise(ids)]


class TextDataset(Dataset):
    def __init__(self, texts: list[str], labels: list[int], tokenizer: WordPiece):
        self.texts, self.labels, self.tokenizer = texts, labels, tokenizer

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int):
        return torch.tensor(self.tokenizer.encode(self.texts[index])), self.labels[index]


def collate(batch):
    ids = [b[0] for b in batch]
    offsets = torch.tensor([0] + [len(t) for t in ids[:-1]]).cumsum(0)
    return torch.cat(ids), offsets, torch.tensor([b[1] for b in batch])


class BagClassifier(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, DIM, mode="mean")
        self.head = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, TOPICS))

    def forward(self, ids, offsets):
        return self.head(self.bag(ids, offsets))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(0)
    syllables, words = make_lexicon(rng)
    tokenizer = WordPiece(syllables)
    headlines = TextDataset(*make_documents(rng, words, DOCS_PER_SOURCE, HEADLINE_WORDS), tokenizer)
    abstracts = TextDataset(*make_documents(rng, words, DOCS_PER_SOURCE, ABSTRACT_WORDS), tokenizer)
    corpus = ConcatDataset([headlines, abstracts])
    if args.fix:
        sampler = DistributedSampler(corpus, shuffle=True, seed=0, drop_last=True)
        loader = DataLoader(corpus, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, drop_last=True)
    else:
        sampler = None
        half = len(corpus) // world
        shard = Subset(corpus, range(rank * half, (rank + 1) * half))
        loader = DataLoader(
            shard,
            batch_size=args.batch_size,
            shuffle=True,
            collate_fn=collate,
            drop_last=True,
            generator=torch.Generator().manual_seed(rank),
        )
    torch.manual_seed(0)
    model = DDP(BagClassifier(tokenizer.size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    meter, epoch = Meter(args), 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        total = torch.zeros(3)
        for ids, offsets, labels in loader:
            logits = model(ids, offsets)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(labels), (logits.argmax(1) == labels).sum().item(), len(labels)])
            if meter.step(len(labels)):
                break
        if rank == 0:
            print(f"epoch {epoch} rank-0 loss {total[0] / total[2]:.4f} accuracy {total[1] / total[2]:.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
