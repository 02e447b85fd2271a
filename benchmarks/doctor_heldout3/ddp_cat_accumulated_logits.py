"""Plain DDP classifier that grows its epoch's logits tensor with torch.cat at every step.

Mistake: to report epoch-level training metrics (top-1/top-5 accuracy, NLL) over 1,000 classes, the loop
keeps the epoch's outputs in one tensor and extends it at every step with
`all_logits = torch.cat([all_logits, logits.detach()])` (and the same for the labels). Every cat allocates
a new tensor and copies everything gathered so far, so the copying grows quadratically over the epoch:
at step k it moves k x 64 x 1000 floats (up to ~50 MB) just to append 256 KB.
Source: https://github.com/Substra/substrafl/pull/171 ("instead of copying multiple times the array
(implied work with torch.cat), it stores all outputs in a list (no copy) and then concatenates once"),
https://github.com/pytorch/audio/pull/1850 ("Avoid concatenation in loop") and
https://github.com/ulissigroup/amptorch/issues/12 (torch.cat bottleneck).
Fix (--fix): append each step's logits and labels to Python lists and torch.cat once at the epoch end; the
metrics are identical.
Expected diagnosis: host time outside forward/backward growing through each epoch (memory copies and
allocation in torch.cat of the accumulated logits in the step loop); collect in a list and concatenate once
per epoch.
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

FEATURES, CLASSES = 256, 1000


def synthetic_features(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (samples,), generator=g)
    x = centers[y] + 2.0 * torch.randn(samples, FEATURES, generator=g)
    return x, y


def epoch_metrics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    top5 = logits.topk(5, dim=1).indices
    sums = torch.stack(
        [
            (top5[:, 0] == labels).float().sum(),
            (top5 == labels[:, None]).any(1).float().sum(),
            F.cross_entropy(logits, labels, reduction="sum"),
            torch.tensor(float(len(labels))),
        ]
    )
    dist.all_reduce(sums)
    return sums


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_features(2 * 200 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, CLASSES))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        if args.fix:
            logit_list, label_list = [], []
        else:
            all_logits, all_labels = torch.empty(0, CLASSES), torch.empty(0, dtype=torch.long)
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if args.fix:
                logit_list.append(logits.detach())
                label_list.append(yb)
            else:
                all_logits = torch.cat([all_logits, logits.detach()])
                all_labels = torch.cat([all_labels, yb])
            if meter.step(len(yb)):
                break
        if args.fix:
            all_logits, all_labels = torch.cat(logit_list), torch.cat(label_list)
        top1, top5, nll, n = epoch_metrics(all_logits, all_labels).tolist()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} top1 {top1 / n:.3f} top5 {top5 / n:.3f} nll {nll / n:.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
