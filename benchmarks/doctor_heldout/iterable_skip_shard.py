"""A streaming IterableDataset sharded across ranks by skipping records after parsing them.

Mistake: the user's IterableDataset streams JSON-lines shards, parses and tokenizes every record, and only
then keeps every world_size-th one for this rank (`if i % world_size == rank`). Each rank trains on its
own half, as intended, but decodes and tokenizes the whole corpus: the input pipeline does world_size
times the work it needs to, on every rank.
Source: Hugging Face datasets' split_dataset_by_node, https://github.com/huggingface/datasets/pull/5369
("Otherwise, each node keeps 1 example out of world_size, skipping the other examples", versus assigning
whole shards "which is the most optimized"), and https://github.com/huggingface/datasets/pull/8565 (a
strategy="shards" option added so users can insist on shard-level splitting).
Fix (--fix): shard at the file level before parsing (rank r reads shards r, r+world, ...), so each rank only
parses the records it trains on; the global data per epoch and the model are unchanged.
Expected diagnosis: the input pipeline (data wait, on every rank) dominates and is world_size times larger
than needed: ShardedJsonl.__iter__ parses/tokenizes every record and discards the other ranks' (skip
sharding after decoding); shard by file before parsing.
"""

import gc
import json
import random
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

SHARDS, RECORDS_PER_SHARD, WORDS, SEQ, CLASSES = 8, 300, 4000, 512, 4
TOKEN = re.compile(r"\w+|[^\w\s]")


def make_shards():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(WORDS)]
    shards = []
    for _ in range(SHARDS):
        lines = []
        for _ in range(RECORDS_PER_SHARD):
            label = rng.randrange(CLASSES)
            words = [
                vocab[rng.randrange(WORDS // CLASSES) * CLASSES + label] if rng.random() < 0.3 else rng.choice(vocab)
                for _ in range(rng.randint(320, 640))
            ]
            lines.append(json.dumps({"text": " ".join(words) + ".", "label": label}))
        shards.append(lines)
    return shards, {w: i + 1 for i, w in enumerate(vocab)}


class ShardedJsonl(IterableDataset):
    def __init__(self, shards, vocab, rank, world, shard_by_file):
        self.shards, self.vocab, self.rank, self.world = shards, vocab, rank, world
        self.shard_by_file = shard_by_file

    def parse(self, line):
        record = json.loads(line)
        ids = [self.vocab.get(tok.lower(), 0) for tok in TOKEN.findall(record["text"])][:SEQ]
        ids += [0] * (SEQ - len(ids))
        return torch.tensor(ids), record["label"]

    def __iter__(self):
        if self.shard_by_file:
            for shard in self.shards[self.rank :: self.world]:
                for line in shard:
                    yield self.parse(line)
        else:
            for i, sample in enumerate(self.parse(line) for shard in self.shards for line in shard):
                if i % self.world == self.rank:
                    yield sample


class BagClassifier(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 64, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, CLASSES))

    def forward(self, ids):
        mask = (ids > 0).unsqueeze(-1).float()
        return self.mlp((self.emb(ids) * mask).sum(1) / mask.sum(1).clamp(min=1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shards, vocab = make_shards()
    dataset = ShardedJsonl(shards, vocab, rank, world, shard_by_file=args.fix)
    loader = DataLoader(dataset, batch_size=args.batch_size)
    torch.manual_seed(0)
    model = DDP(BagClassifier(len(vocab) + 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    meter = Meter(args)
    while True:
        for ids, labels in loader:
            loss = F.cross_entropy(model(ids), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(len(ids)):
                break
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
