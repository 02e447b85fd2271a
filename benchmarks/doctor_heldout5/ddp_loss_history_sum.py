"""Plain DDP MLP whose loop keeps every step's loss tensor and re-sums the whole list for a running mean.

Mistake: to print a smooth "average loss (and accuracy) so far" the user appends each step's `loss` and
batch-accuracy tensors to Python lists and computes `sum(loss_history) / len(loss_history)` (and the same
for accuracy) after every step. The list holds live loss
tensors (not `.item()` floats, not even detached), so every step's autograd graph and its saved
activations stay alive, and the running mean is recomputed from scratch each step: `sum()` over n tensors
is n autograd-tracked scalar additions (each a small op plus a graph node), so step k does O(k) extra
work and the run gets slower step after step (memory grows too).
Source: https://github.com/tier4/Diffusion-Planner/pull/372 ("Convert each per-batch loss value to a
detached Python scalar before appending it ... Prevent loss tensors and their autograd graphs from being
retained"), https://github.com/jostmey/NakedAttention/issues/1 ("building a computational graph that gets
bigger every time you run e_train += e_batch"), https://github.com/kohya-ss/sd-scripts/pull/189 (moving
average of the loss recomputed with sum() over the list; "I removed the call of sum()").
Fix (--fix): append `loss.item()` / `accuracy.item()` and keep running totals: the same printed average, O(1)
per step, no retained graphs.
Expected diagnosis: host time per step grows linearly with the step count (many tiny add ops, a growing
number of live tensors and autograd nodes) outside forward/backward, from the running-mean computation
sum(loss_history) over a list of all past loss tensors in main's loop; store floats and keep a running sum.
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

FEATURES, WIDTH, CLASSES = 64, 128, 10


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_tabular(2 * 40 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)
    )
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_history, acc_history, totals, running, running_acc = [], [], [0.0, 0.0], 0.0, 0.0
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            accuracy = (logits.argmax(1) == yb).float().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if args.fix:
                loss_history.append(loss.item())
                acc_history.append(accuracy.item())
                totals[0] += loss_history[-1]
                totals[1] += acc_history[-1]
                running, running_acc = totals[0] / len(loss_history), totals[1] / len(acc_history)
            else:
                loss_history.append(loss)
                acc_history.append(accuracy)
                running = sum(loss_history) / len(loss_history)
                running_acc = sum(acc_history) / len(acc_history)
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(
                f"epoch {epoch} steps {len(loss_history)} average loss so far {float(running):.4f} "
                f"accuracy {float(running_acc):.3f}",
                flush=True,
            )
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer, loss_history, acc_history
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
