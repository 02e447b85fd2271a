"""Drawing each batch with next(iter(loader)): a new DataLoader iterator, and worker process, every step.

Mistake: the training loop is written step-based and takes its batch with `next(iter(train_loader))`.
Every call builds a fresh multiprocessing iterator: a worker process is started (through the forkserver
context the user chose because plain fork hung under DDP), receives the dataset, loads prefetch_factor
batches (of which one is used) and is shut down again, so each step pays a worker start-up, a join and
twice the augmentation work before the model even runs.
Source: https://discuss.pytorch.org/t/distributed-data-parallel-repeated-pickling/104098 (DDP "very slow":
"workers ... were created repeatedly each time a new iter was created") and
https://github.com/pytorch/pytorch/issues/22133 (new worker processes created again and again; "you are
creating DataLoader instance inside the loop").
Fix (--fix): create the iterator once per epoch (`for x, y in train_loader`), so the worker stays up and
prefetches while the model trains; same dataset, sampler and augmentation.
Expected diagnosis: the step waits on data (time spent getting the batch, dominated by DataLoader worker
start-up/shutdown), caused by `next(iter(train_loader))` inside the step loop in main(); iterate the
loader once per epoch (or use persistent workers).
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, SmallCNN, arguments, synthetic_cifar


class AugmentedCifar(Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = F.pad(self.images[i], (4, 4, 4, 4), mode="reflect")
        dx, dy = torch.randint(0, 9, (2,)).tolist()
        img = img[:, dy : dy + 32, dx : dx + 32]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img, self.labels[i]


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = AugmentedCifar(*synthetic_cifar(2048))
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = Subset(dataset, range(rank, len(dataset), world))
    train_loader = DataLoader(
        shard,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=1,
        multiprocessing_context="forkserver",  # plain fork can hang with gloo's threads alive
        drop_last=True,
    )
    steps_per_epoch = len(train_loader)
    meter = Meter(args)
    while True:
        batches = iter(train_loader) if args.fix else None
        for _ in range(steps_per_epoch):
            x, y = next(batches) if args.fix else next(iter(train_loader))
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(len(x)):
                break
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
