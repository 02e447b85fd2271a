"""Plain DDP CNN on CIFAR-shaped images whose forward, on rank 0, records activation statistics of every
stage (mean, std, max |a|, 1/50/99th percentiles, dead-channel fraction) for a training-health log.

Mistake: to watch the activations during training, the user gave the model a `track_activations` switch,
checked in `forward`, and turned it on for rank 0 only (`net.track_activations = rank == 0`), since only
rank 0 prints; the log prints the latest statistics every 20 steps. But the statistics are computed in every
training forward on rank 0: for each of the three stages, `torch.quantile` over the whole activation tensor
(a full sort of ~33k-131k values), plus mean/std/max and the per-channel dead fraction, with `.item()` on
each. Rank 0's forward takes far longer than rank 1's, and rank 1 waits for rank 0 in the gradient
all-reduce of every step; 19 of every 20 results are overwritten before they are printed.
Source: https://github.com/NVIDIA/Megatron-LM/pull/5492 (activation statistics by hooks in the forward and
backward passes: "This incurs a nontrivial cost, I measured up to 30% of the step time. Consider setting
`--activation-log-interval` to 100 steps"), https://github.com/allenai/OLMo/pull/330 (activation logging:
"For larger models we can increase the logging interval if it slows training down too much"),
https://github.com/marin-community/levanter/pull/641 (activation histograms "incredibly inefficient ...
roughly 4x as long as the rest of the forward pass").
Fix (--fix): turn `track_activations` on only for the forward of the steps whose statistics are printed
(every 20th step, still on rank 0 only). Same printed statistics at the same steps; training is unchanged.
Expected diagnosis: a straggler: rank 0's forward is longer than rank 1's by the activation statistics
computed in `ActivationLoggedCNN.forward` → `record` (quantile sorts) on rank 0 only, and rank 1 spends the
difference waiting in the gradient all-reduce; compute them only on the logging steps.
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

LOG_EVERY = 20
PERCENTILES = torch.tensor([0.01, 0.5, 0.99])


class ActivationLoggedCNN(nn.Module):
    def __init__(self, widths=(16, 32, 64), classes: int = 10):
        super().__init__()
        stages, channels = [], 3
        for width in widths:
            stages.append(nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()))
            channels = width
        self.stages = nn.ModuleList(stages)
        self.pool = nn.MaxPool2d(2)
        self.classifier = nn.Linear(channels * 4 * 4, classes)
        self.track_activations = False
        self.activation_stats: dict[str, dict[str, float]] = {}

    def forward(self, x):
        for index, stage in enumerate(self.stages):
            x = self.pool(stage(x))
            if self.training and self.track_activations:
                self.record(f"stage{index}", x)
        return self.classifier(x.flatten(1))

    @torch.no_grad()
    def record(self, name: str, activation: torch.Tensor) -> None:
        a = activation.detach().float()
        flat = a.flatten()
        low, median, high = torch.quantile(flat, PERCENTILES).tolist()
        self.activation_stats[name] = {
            "mean": flat.mean().item(),
            "std": flat.std().item(),
            "absmax": flat.abs().max().item(),
            "p01": low,
            "p50": median,
            "p99": high,
            "dead": (a.amax(dim=(0, 2, 3)) <= 0).float().mean().item(),
        }


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    images, labels = synthetic_cifar(2 * 40 * args.batch_size)
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = ActivationLoggedCNN()
    net.track_activations = rank == 0
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    meter, epoch, step = Meter(args), 0, 0
    while True:
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            step += 1
            if args.fix:
                net.track_activations = rank == 0 and step % LOG_EVERY == 0
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(y), len(y)])
            if rank == 0 and step % LOG_EVERY == 0:
                stats = " ".join(
                    f"{name}[mean {s['mean']:.3f} p99 {s['p99']:.3f} dead {s['dead']:.2f}]"
                    for name, s in net.activation_stats.items()
                )
                print(f"step {step} loss {loss.item():.4f} {stats}", flush=True)
            if meter.step(len(y)):
                break
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} train loss {total[0] / total[1]:.4f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
