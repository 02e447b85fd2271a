"""Plain DDP classifier whose loop gathers every batch's predictions and labels on all ranks with
all_gather_object, each step, for a running confusion matrix on rank 0.

Mistake: to report a global (all-ranks) macro-F1 during training, the user gathers each step's predicted
classes and labels from every rank with `dist.all_gather_object(gathered, (preds.tolist(), labels.tolist()))`
and has rank 0 add them to a confusion matrix. all_gather_object pickles the lists, all-gathers their sizes
and then the padded byte tensors (two blocking collectives) and unpickles every rank's object, on every
step: a few milliseconds of latency-bound communication and serialisation per step in which the ranks wait
for each other, on top of DDP's gradient all-reduce, for a model whose forward/backward takes about as
long.
Source: https://github.com/NVIDIA/Model-Optimizer/pull/1111 (review: all_gather_object "serializes Python
objects with pickle ... called on every single micro-batch iteration of the training loop"; "accumulate
... locally and only gather when it's time to print"), https://github.com/huggingface/accelerate/issues/226
(predictions gathered at each step to compute a metric once per epoch),
https://github.com/huggingface/pytorch-image-models/pull/2340 ("update loss running avg every step, sync on
log").
Fix (--fix): each rank adds its predictions to its own confusion-matrix tensor (one bincount per step, no
communication) and the matrices are summed with one dist.all_reduce at the epoch end (the same matrix, the
same printed macro-F1).
Expected diagnosis: a large share of every step is spent outside forward/backward in per-step object
collectives (all_gather_object: pickling, two all-gathers, unpickling) in main's loop, ranks waiting for
each other in them; accumulate the confusion matrix locally and reduce it once per epoch.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, CLASSES = 64, 192, 10


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def macro_f1(confusion: torch.Tensor) -> float:
    tp = confusion.diag().double()
    precision = tp / confusion.sum(0).double().clamp(min=1)
    recall = tp / confusion.sum(1).double().clamp(min=1)
    return float((2 * precision * recall / (precision + recall).clamp(min=1e-12)).mean())


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = synthetic_tabular(2 * 40 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)
    )
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        confusion = torch.zeros(CLASSES, CLASSES, dtype=torch.long)
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            preds = logits.detach().argmax(1)
            if args.fix:
                confusion += torch.bincount(yb * CLASSES + preds, minlength=CLASSES * CLASSES).view(CLASSES, CLASSES)
            else:
                gathered = [None] * world
                dist.all_gather_object(gathered, (preds.tolist(), yb.tolist()))
                if rank == 0:
                    all_preds = torch.tensor([p for rank_preds, _ in gathered for p in rank_preds])
                    all_labels = torch.tensor([t for _, rank_labels in gathered for t in rank_labels])
                    confusion += torch.bincount(all_labels * CLASSES + all_preds, minlength=CLASSES * CLASSES).view(
                        CLASSES, CLASSES
                    )
            if meter.step(len(yb)):
                break
        if args.fix:
            dist.all_reduce(confusion)
        if rank == 0:
            print(f"epoch {epoch} train macro-F1 {macro_f1(confusion):.4f} samples {int(confusion.sum())}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
