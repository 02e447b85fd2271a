"""Plain DDP transformer classifier on a length-sorted token dataset that is split across the ranks in
contiguous chunks (as `split_dataset_by_node` splits a map-style dataset), with length-grouped batches.

Mistake: the preprocessing sorted the dataset by length (to batch similar lengths together and pad little),
and the training script then gives each rank a contiguous chunk of it, `range(rank * per_rank, (rank + 1) *
per_rank)`, before grouping its own samples by length into batches. Each rank draws 8 sequences per step and
pads each batch to its longest sequence, but rank 0's chunk is the shorter half of the dataset (16-89
tokens, ~41 on average) and rank 1's the longer half (89-511 tokens, ~245): rank 1's forward/backward
through the same encoder (attention quadratic in the length) takes several times rank 0's, and rank 0 waits
for it in every gradient all-reduce. Tokens are ready-made tensors: loading costs the same on both ranks.
Source: https://github.com/pytorch/torchtitan/pull/3131 ("split_dataset_by_node can give highly-imbalanced
examples to different nodes, due to the default behavior where it splits map-style datasets sequentially
... if shorter examples tend to be early in the dataset"), https://github.com/lightseekorg/TorchSpec/issues/13
("some DP ranks end up with disproportionately more compute, causing faster ranks to idle at all-reduce
barriers"), https://github.com/lhotse-speech/lhotse/pull/1309 (similar batch durations across ranks, "around
2x faster on 8xGPU").
Fix (--fix): DistributedSampler(dataset, shuffle=True, seed=0) picks each rank's samples (a random half of
the whole dataset, re-drawn every epoch); the same per-rank length grouping (sort the rank's samples, cut
consecutive batches, shuffle the batch order with a seed shared by the ranks) then makes the ranks' k-th
batches about equally long. Same samples, same padding scheme, same model and batch size.
Expected diagnosis: a straggler from the data split: rank 1's forward/backward is several times rank 0's
because its batches are the long sequences, and rank 0 spends the difference waiting in the gradient
all-reduce; the cause is the contiguous per-rank chunk of a length-sorted dataset. Shuffle before splitting
(DistributedSampler with shuffle) or balance tokens per rank.
"""

import gc
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, CLASSES, DIM, HEADS, LAYERS, FF = 2000, 4, 64, 4, 2, 128
MIN_LEN, MAX_LEN = 16, 512
SAMPLES = 2 * 40 * 8  # 40 batches of 8 per rank and epoch


def sorted_token_dataset(samples: int, seed: int = 0):
    """Token sequences of log-uniformly spread lengths (16 to 512 tokens) whose tokens lean towards a class's
    band of the vocabulary, stored sorted by length, shortest first (as the preprocessing left them)."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.rand(samples, generator=g) * math.log(MAX_LEN / MIN_LEN)
    lengths = (MIN_LEN * torch.exp(spread)).long().clamp(MIN_LEN, MAX_LEN).sort().values.tolist()
    labels = torch.randint(0, CLASSES, (samples,), generator=g).tolist()
    sequences = []
    for length, label in zip(lengths, labels):
        band = torch.randint(1 + label * (VOCAB // CLASSES), (label + 1) * (VOCAB // CLASSES), (length,), generator=g)
        noise = torch.randint(1, VOCAB, (length,), generator=g)
        sequences.append(torch.where(torch.rand(length, generator=g) < 0.3, band, noise))
    return sequences, labels


class TokenDataset(Dataset):
    def __init__(self, sequences: list[torch.Tensor], labels: list[int]):
        self.sequences, self.labels = sequences, labels

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int):
        return self.sequences[index], self.labels[index]


class LengthGroupedBatches:
    """Batches of similar length from this rank's samples: sort them by length, cut consecutive batches, and
    shuffle the batch order every epoch with a seed that is the same on every rank."""

    def __init__(self, lengths: list[int], batch_size: int, rank_indices, seed: int = 0):
        self.lengths, self.batch_size, self.rank_indices, self.seed = lengths, batch_size, rank_indices, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        mine = sorted(self.rank_indices(self.epoch), key=self.lengths.__getitem__)
        batches = [mine[i : i + self.batch_size] for i in range(0, len(mine) - self.batch_size + 1, self.batch_size)]
        order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter([batches[i] for i in order.tolist()])

    def __len__(self) -> int:
        return len(self.rank_indices(0)) // self.batch_size


def pad_collate(batch):
    longest = max(len(s) for s, _ in batch)
    tokens = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, (sequence, _) in enumerate(batch):
        tokens[row, : len(sequence)] = sequence
    return tokens, torch.tensor([label for _, label in batch])


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.position = nn.Parameter(torch.randn(MAX_LEN, DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, FF, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        pad = tokens == 0
        h = self.encoder(self.embed(tokens) + self.position[: tokens.shape[1]], src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sequences, labels = sorted_token_dataset(SAMPLES)
    dataset = TokenDataset(sequences, labels)
    lengths = [len(s) for s in sequences]
    if args.fix:
        spread = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)

        def rank_indices(epoch):
            spread.set_epoch(epoch)
            return list(spread)
    else:
        per_rank = len(dataset) // world

        def rank_indices(epoch):
            return list(range(rank * per_rank, (rank + 1) * per_rank))

    batches = LengthGroupedBatches(lengths, args.batch_size, rank_indices)
    loader = DataLoader(dataset, batch_sampler=batches, collate_fn=pad_collate)
    torch.manual_seed(0)
    model = DDP(Encoder())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        batches.set_epoch(epoch)
        total = torch.zeros(3)
        for tokens, target in loader:
            logits = model(tokens)
            loss = F.cross_entropy(logits, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(target), (logits.argmax(1) == target).sum().item(), len(target)])
            if meter.step(len(target)):
                break
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total[0] / total[2]:.4f} accuracy {total[1] / total[2]:.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
