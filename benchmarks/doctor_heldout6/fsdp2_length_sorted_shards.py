"""FSDP2 (fully_shard, gloo CPU mesh) transformer text classifier whose length-bucketing sampler gives each rank
a contiguous slice of the length-sorted dataset.

Mistake: to cut padding, the user's `LengthBucketSampler` sorts the documents by length and forms batches
of neighbouring lengths (the batch order is shuffled with the same seed on every rank). To shard it, each
rank takes a contiguous slice of the sorted order, `order[rank * n:(rank + 1) * n]`: rank 0 gets all the
short documents, rank 1 all the long ones. Sequence lengths are skewed (log-normal, median 64 tokens,
sigma 1.2, clipped to 16-512), so rank 1's batches cost several times rank 0's (attention is quadratic in
length). FSDP2 synchronises the ranks in every layer's all-gather and reduce-scatter, so every step runs
at rank 1's pace and rank 0 waits in the collectives for most of it.
Source: https://github.com/microsoft/onnxruntime/pull/10163 ("straggler problems observed in distributed
training tasks where different workers work on data samples with varying complexity"; sort by complexity,
then deal the sorted samples out to the workers in turn), https://github.com/lightseekorg/TorchSpec/issues/13
("some DP ranks end up with disproportionately more compute, causing faster ranks to idle at all-reduce
barriers"), https://github.com/huggingface/transformers/pull/7056 (a distributed sortish sampler: shard
like DistributedSampler first, then group by length).
Fix (--fix): deal the length-sorted order out round-robin, `order[rank::world]`: each rank still gets
batches of neighbouring lengths (same padding), and because the batch order is shuffled with the same seed
on every rank, the ranks' k-th batches have nearly the same length, so they finish each layer together.
The same documents are seen per epoch.
Expected diagnosis: a straggler from imbalanced data: rank 1's forward/backward compute per step is several
times rank 0's (longer sequences), and rank 0 spends the difference waiting in FSDP2's all-gathers and
reduce-scatters; the cause is the contiguous slice of the length-sorted order in LengthBucketSampler
(order[rank * n:(rank + 1) * n]); shard the sorted order round-robin (or balance tokens per rank).
"""

import gc
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS, CLASSES, MIN_LEN, MAX_LEN = 2000, 96, 4, 2, 4, 16, 512


def synthetic_documents(docs: int, seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Token-id documents of log-normal length; the class is the most frequent of four token groups."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(math.log(64) + 1.2 * torch.randn(docs, generator=g)).long().clamp(MIN_LEN, MAX_LEN)
    texts, labels = [], torch.randint(0, CLASSES, (docs,), generator=g)
    for length, label in zip(lengths.tolist(), labels.tolist()):
        tokens = torch.randint(1, VOCAB, (length,), generator=g)
        topical = torch.rand(length, generator=g) < 0.2
        texts.append(torch.where(topical, 1 + label * 50 + tokens % 50, tokens))
    return texts, labels


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of neighbouring lengths from this rank's share of the length-sorted documents; the batch order is
    shuffled each epoch with the same seed on every rank."""

    def __init__(self, lengths, batch_size, rank, world, round_robin: bool, seed: int = 0):
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        per_rank = len(order) // world
        if round_robin:
            mine = order[rank::world][:per_rank]
        else:
            mine = order[rank * per_rank : (rank + 1) * per_rank]
        self.batches = [mine[i : i + batch_size] for i in range(0, per_rank - batch_size + 1, batch_size)]
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter([self.batches[i] for i in torch.randperm(len(self.batches), generator=g).tolist()])

    def __len__(self):
        return len(self.batches)


class Documents(torch.utils.data.Dataset):
    def __init__(self, texts, labels):
        self.texts, self.labels = texts, labels

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        return self.texts[index], self.labels[index]


def pad_batch(items):
    texts, labels = zip(*items)
    tokens = nn.utils.rnn.pad_sequence(list(texts), batch_first=True)  # pad id 0
    return tokens, torch.stack(list(labels))


class TextTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.position = nn.Embedding(MAX_LEN, DIM)
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(DIM, HEADS, dim_feedforward=4 * DIM, dropout=0.0, batch_first=True)
                for _ in range(LAYERS)
            ]
        )
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        padding = tokens == 0
        h = self.embedding(tokens) + self.position(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            h = layer(h, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    texts, labels = synthetic_documents(world * 40 * args.batch_size)
    sampler = LengthBucketSampler([len(t) for t in texts], args.batch_size, rank, world, round_robin=args.fix)
    loader = DataLoader(Documents(texts, labels), batch_sampler=sampler, collate_fn=pad_batch)
    torch.manual_seed(0)
    model = TextTransformer()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total_loss = torch.zeros(2)
        for tokens, yb in loader:
            loss = F.cross_entropy(model(tokens), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += torch.tensor([loss.item() * len(yb), len(yb)])
            if meter.step(len(yb)):
                break
        dist.all_reduce(total_loss)
        if rank == 0:
            print(f"epoch {epoch} train loss {float(total_loss[0] / total_loss[1]):.4f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
