"""Plain DDP image classifier whose rank 0 re-predicts every training batch with the inference helper.

Mistake: the user wants the training-accuracy curve to be comparable with the validation numbers, which are
produced by the project's inference helper `predict()`: eval mode (dropout off) and horizontal-flip test-time
augmentation, i.e. two no-grad forward passes. So after every optimizer step the logging rank (rank 0)
calls `predict(net, images)` on the step's batch to update a running "clean" training accuracy. The
training step already computed logits for that batch; rank 0 now runs two more forwards of the CNN per step
that rank 1 does not, and rank 1 waits for it in the next backward's gradient all-reduce.
Fix (--fix): take the running training accuracy from the training forward's own logits (`logits.argmax`),
on every rank, no extra forward; validation keeps using `predict()` (not part of this benchmark).
Expected diagnosis: a straggler, slow rank 0: rank 0's steps include an extra inference (two eval-mode
no-grad forwards in `predict`, called under `if rank == 0` after `optimizer.step()` in main's loop) that
rank 1's do not, and rank 1 spends that time waiting in the gradient all-reduce; compute the metric from the
training logits (or rarely, or split over ranks).
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
from common import Meter, arguments, synthetic_cifar


class DropoutCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 48, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(48, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.3),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(128, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@torch.no_grad()
def predict(net: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The project's inference helper: class probabilities, eval mode, averaged over a horizontal flip."""
    was_training = net.training
    net.eval()
    probs = (net(images).softmax(1) + net(images.flip(3)).softmax(1)) / 2
    net.train(was_training)
    return probs


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = synthetic_cifar(2 * 40 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = DropoutCNN()
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total_loss = correct = seen = steps = 0
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if args.fix:
                correct += int((logits.detach().argmax(1) == yb).sum())
                seen += len(yb)
            elif rank == 0:  # running training accuracy, measured like the validation accuracy
                correct += int((predict(net, xb).argmax(1) == yb).sum())
                seen += len(yb)
            total_loss += loss.item()
            steps += 1
            if meter.step(len(yb)):
                break
        if rank == 0:
            print(
                f"epoch {epoch} loss {total_loss / max(steps, 1):.4f} train accuracy {correct / max(seen, 1):.3f}",
                flush=True,
            )
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
