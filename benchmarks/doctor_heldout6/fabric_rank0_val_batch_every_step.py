"""Lightning Fabric (ddp, cpu) CNN whose rank 0 evaluates a fixed validation batch after every optimizer step.

Mistake: for a "live" validation curve the user has rank 0 (the process that logs) run the model on a
fixed held-out batch of 128 images under torch.no_grad after every optimizer step, and log its loss and
accuracy. Only rank 0 does this extra forward pass, which costs more than the training step's own forward
on 32 images; meanwhile the other rank has already started the next step and waits for rank 0 in the next
backward's gradient all-reduce. Every step is as long as rank 0's training step plus its evaluation:
rank 1 spends that time waiting in the collective.
Source: https://github.com/horovod/horovod/issues/403 ("if we always make the same worker do
heavy-lifting, e.g. evaluating the current model ... other workers are going to complain about stalled
ops"; "make all workers do the same heavy lifting"), https://github.com/HorizonRobotics/alf/pull/1717
("rank-0 has more work to do (e.g evaluation)"), https://github.com/facebookresearch/ParlAI/pull/3379
(validation every n steps rather than on a per-batch criterion in distributed training).
Fix (--fix): evaluate every 40 steps (once per epoch's worth of steps) instead of every step, and split the
held-out batch across the ranks (64 images each), summing the loss and the correct count with one
all_reduce: the same quantity logged less often, and no rank does it alone.
Expected diagnosis: a straggler: rank 0's steps are longer than rank 1's because of an extra no-grad
forward over the validation batch (evaluate(...) on rank 0 after optimizer.step in main's loop), and rank 1
spends the difference waiting in the gradient all-reduce; spread the evaluation over ranks and/or do it
every N steps.
"""

import gc
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, SmallCNN, arguments, synthetic_cifar

VAL_SAMPLES, VAL_EVERY = 128, 40


@torch.no_grad()
def evaluate(net, images, labels) -> tuple[float, int]:
    net.eval()
    logits = net(images)
    net.train()
    return float(F.cross_entropy(logits, labels, reduction="sum")), int((logits.argmax(1) == labels).sum())


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    fabric = Fabric(
        accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    )
    fabric.launch()
    x, y = synthetic_cifar(2 * 40 * args.batch_size)
    val_x, val_y = synthetic_cifar(VAL_SAMPLES, seed=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    net = SmallCNN()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    model, optimizer = fabric.setup(net, optimizer)
    loader = fabric.setup_dataloaders(loader)
    shard = slice(
        fabric.global_rank * VAL_SAMPLES // fabric.world_size,
        (fabric.global_rank + 1) * VAL_SAMPLES // fabric.world_size,
    )
    meter, epoch, step, val_log = Meter(args), 0, 0, []
    while True:
        total_loss = steps = 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if not args.fix:
                if fabric.global_rank == 0:  # live validation curve, logged by rank 0
                    val_loss, val_correct = evaluate(net, val_x, val_y)
                    val_log.append((step, val_loss / VAL_SAMPLES, val_correct / VAL_SAMPLES))
            elif step % VAL_EVERY == 0:
                part = torch.tensor(evaluate(net, val_x[shard], val_y[shard]), dtype=torch.float64)
                part = fabric.all_reduce(part, reduce_op="sum")
                val_log.append((step, float(part[0]) / VAL_SAMPLES, float(part[1]) / VAL_SAMPLES))
            total_loss += loss.item()
            steps += 1
            if meter.step(len(yb)):
                break
        if val_log:
            last = val_log[-1]
            fabric.print(
                f"epoch {epoch} train loss {total_loss / max(steps, 1):.4f} "
                f"val@{last[0]} loss {last[1]:.4f} accuracy {last[2]:.3f}"
            )
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()


if __name__ == "__main__":
    main()
