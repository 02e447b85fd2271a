"""Plain DDP image classifier on a sharded two-source corpus (128 px photos and 32 px thumbnails), batched by
resolution, whose shard list is split across ranks as `shards[rank::world]`.

Mistake: the corpus was written as one shard per source per chunk, `images-000-photo`, `images-000-thumb`,
`images-001-photo`, ... and the script splits the sorted shard list across the ranks with a stride, as
webdataset's `split_by_node` does: `my_shards = shards[rank::world]`. With two ranks the stride lines up with
the alternation of the sources, so rank 0 gets every photo shard and rank 1 every thumbnail shard. Both ranks
run the same resolution-bucketed batch sampler (a batch holds one resolution, so images need no resizing or
padding) and take 16 images per step through the same fully convolutional CNN (global average pooling), but
a 128 px image has 16x the pixels of a 32 px one: rank 0's forward/backward takes several times rank 1's, and
rank 1 waits for rank 0 in every gradient all-reduce. Decoding (a uint8-to-float conversion) costs
little on either rank.
Source: https://github.com/huggingface/datasets/pull/8565 (shard-level assignment of a sharded dataset to
nodes, and a strategy for "the case ... where shard-level assignment is possible but the shards are
imbalanced"), https://github.com/webdataset/webdataset/issues/434 (shards split across ranks by
`split_by_node`), https://github.com/k2-fsa/OmniVoice/issues/252 (shards that are "not very balanced in terms
of size"), https://github.com/lhotse-speech/lhotse/pull/1341 (bucket selection synchronised across DDP ranks
so that every rank picks the same bucket at a step).
Fix (--fix): every rank opens every shard; each source's images are dealt out across the ranks by its own
DistributedSampler(shuffle=True, seed=0), so each rank gets half of the photos and half of the thumbnails,
and the same bucketed sampler (with its seed shared by the ranks) then puts the same resolution on every rank
at each step. Same images per epoch in total, same batches of 16, same model.
Expected diagnosis: a straggler from the data split: rank 0's forward/backward is several times rank 1's
because all its batches are the 128 px photos, and rank 1 spends the difference waiting in the gradient
all-reduce; the cause is the strided shard split, which gives rank 0 all the large images. Deal every
source's samples out evenly across the ranks (and keep the ranks on the same bucket at each step).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

SOURCES = {"photo": 128, "thumb": 32}  # image side in pixels
CHUNKS, IMAGES_PER_SHARD, CLASSES = 8, 60, 10  # 480 images per source: 30 batches of 16 per rank and epoch


def shard_names() -> list[str]:
    return sorted(f"images-{chunk:03d}-{source}" for chunk in range(CHUNKS) for source in SOURCES)


class ImageShard(Dataset):
    """One shard of decoded uint8 RGB images of one resolution and their labels, made in memory from the
    shard's name as a stand-in for reading the shard file."""

    def __init__(self, name: str):
        chunk, source = int(name.split("-")[1]), name.split("-")[2]
        g = torch.Generator().manual_seed(100 * chunk + len(source) + SOURCES[source])
        side = SOURCES[source]
        self.side = side
        self.labels = torch.randint(0, CLASSES, (IMAGES_PER_SHARD,), generator=g)
        base = torch.rand(CLASSES, 3, 1, 1, generator=g) * 120 + 60
        noise = torch.randn(IMAGES_PER_SHARD, 3, side, side, generator=g) * 40
        self.images = (base[self.labels] + noise).clamp(0, 255).to(torch.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return (self.images[index].float() / 255.0 - 0.5) / 0.25, int(self.labels[index])


class ResolutionBuckets:
    """Batches of one resolution from this rank's samples: group them by image side, shuffle each group, cut
    batches, and shuffle the batch order, every epoch with a seed that is the same on every rank."""

    def __init__(self, sides: list[int], batch_size: int, rank_indices, seed: int = 0):
        self.sides, self.batch_size, self.rank_indices, self.seed = sides, batch_size, rank_indices, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        groups: dict[int, list[int]] = {}
        for index in self.rank_indices(self.epoch):
            groups.setdefault(self.sides[index], []).append(index)
        batches = []
        for side in sorted(groups):
            group = [groups[side][i] for i in torch.randperm(len(groups[side]), generator=g).tolist()]
            batches += [
                group[i : i + self.batch_size] for i in range(0, len(group) - self.batch_size + 1, self.batch_size)
            ]
        return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class ConvNet(nn.Module):
    """Fully convolutional: any image side works, the cost grows with the pixel count."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shards = shard_names()
    if args.fix:
        images = ConcatDataset([ImageShard(name) for name in shards])
        sides = [shard.side for shard in images.datasets for _ in range(len(shard))]
        samplers = []
        for source in SOURCES:
            members = [i for i, name in enumerate(shards) if name.endswith(source)]
            offsets = [images.cumulative_sizes[i] - len(images.datasets[i]) for i in members]
            positions = [offset + k for offset in offsets for k in range(IMAGES_PER_SHARD)]
            samplers.append((positions, DistributedSampler(positions, shuffle=True, seed=0, drop_last=True)))

        def rank_indices(epoch):
            dealt = []
            for positions, sampler in samplers:
                sampler.set_epoch(epoch)
                dealt += [positions[i] for i in sampler]
            return dealt
    else:
        my_shards = shards[rank::world]
        images = ConcatDataset([ImageShard(name) for name in my_shards])
        sides = [shard.side for shard in images.datasets for _ in range(len(shard))]

        def rank_indices(epoch):
            return list(range(len(images)))

    batches = ResolutionBuckets(sides, args.batch_size, rank_indices)
    loader = DataLoader(images, batch_sampler=batches)
    torch.manual_seed(0)
    model = DDP(ConvNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    meter, epoch = Meter(args), 0
    while True:
        batches.set_epoch(epoch)
        total = torch.zeros(3)
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(y), (logits.argmax(1) == y).sum().item(), len(y)])
            if meter.step(len(y)):
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
