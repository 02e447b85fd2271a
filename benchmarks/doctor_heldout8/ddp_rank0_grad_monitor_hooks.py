"""Plain DDP toy diffusion model (an MLP noise predictor on 32-dimensional data) with a gradient-health
monitor, tensor hooks on every parameter that record each gradient's statistics, registered on rank 0 only.

Mistake: to catch exploding or non-finite gradients, the user registers a hook on every parameter
(`p.register_hook(...)`) that records the gradient's norm, max |g|, count of non-finite entries and a 64-bin
histogram, and registers it on rank 0 only, since only rank 0 logs (`if rank == 0: monitor =
GradientMonitor(net)`); the log prints every 20 steps. The hooks run inside every backward pass on rank 0, as
each parameter's gradient is produced (several passes over 3.3 M gradient values, with `.item()` on each
statistic), so rank 0's backward takes longer than rank 1's, and rank 1 waits for rank 0's gradient buckets
in DDP's all-reduce at the end of its backward; 19 of every 20 results are overwritten before they are
printed.
Source: https://github.com/pyro-ppl/pyro/pull/907 (`value.register_hook(lambda g, name=name:
gradient_norms[name].append(g.norm().item()))` for every parameter), https://github.com/marin-community/marin/pull/925
(logging gradient "norms, histograms, means, variances, maxes, mins ... adds some amount of overhead to
training (pretty big for small models ...)"), https://github.com/Lightning-AI/pytorch-lightning/issues/14299
(gradient norms logged every `log_every_n_steps`), https://github.com/traceopt-ai/traceml/issues/252 (a
straggler that originates in one rank's backward is hidden by the all-reduce wait in every rank's backward).
Fix (--fix): the hooks return at once except on the steps whose statistics are printed (every 20th step,
still on rank 0 only): the same printed statistics, computed for 1 step in 20. Training is unchanged.
Expected diagnosis: a straggler: rank 0's backward is longer than rank 1's by the gradient statistics its
parameter hooks compute (`GradientMonitor.observe`, registered on rank 0 only), and rank 1 spends the
difference waiting in the gradient all-reduce inside its own backward; compute them only on logging steps
(or after backward, once, on the reduced gradients).
"""

import functools
import gc
import math
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

DATA_DIM, TIME_DIM, WIDTH, DEPTH, STEPS_T = 32, 64, 1024, 4, 1000
LOG_EVERY, BINS = 20, 64


def mixture_data(samples: int, seed: int = 0) -> torch.Tensor:
    """Points from a mixture of eight Gaussians in 32 dimensions."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(8, DATA_DIM, generator=g) * 2.0
    which = torch.randint(0, 8, (samples,), generator=g)
    return centres[which] + 0.3 * torch.randn(samples, DATA_DIM, generator=g)


def time_embedding(t: torch.Tensor) -> torch.Tensor:
    freqs = torch.exp(-math.log(10000.0) * torch.arange(TIME_DIM // 2) / (TIME_DIM // 2))
    angles = t.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class NoisePredictor(nn.Module):
    def __init__(self):
        super().__init__()
        layers, width = [], DATA_DIM + TIME_DIM
        for _ in range(DEPTH):
            layers += [nn.Linear(width, WIDTH), nn.SiLU()]
            width = WIDTH
        self.net = nn.Sequential(*layers, nn.Linear(WIDTH, DATA_DIM))

    def forward(self, x, t):
        return self.net(torch.cat([x, time_embedding(t)], dim=1))


ALPHAS_BAR = torch.cumprod(1.0 - torch.linspace(1e-4, 0.02, STEPS_T), dim=0)


def diffusion_loss(model, x0: torch.Tensor) -> torch.Tensor:
    t = torch.randint(0, STEPS_T, (len(x0),))
    noise = torch.randn(x0.shape)
    a = ALPHAS_BAR[t][:, None]
    return F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)


class GradientMonitor:
    """Statistics of every parameter's gradient, recorded by tensor hooks as backward produces them."""

    def __init__(self, model: nn.Module):
        self.active = True
        self.stats: dict[str, dict] = {}
        for name, parameter in model.named_parameters():
            parameter.register_hook(functools.partial(self.observe, name))

    @torch.no_grad()
    def observe(self, name: str, grad: torch.Tensor) -> None:
        if not self.active:
            return
        g = grad.detach().flatten()
        bound = 4.0 * g.std().item() + 1e-12
        self.stats[name] = {
            "norm": g.norm().item(),
            "absmax": g.abs().max().item(),
            "nonfinite": int((~torch.isfinite(g)).sum().item()),
            "histogram": torch.histc(g.clamp(-bound, bound), bins=BINS, min=-bound, max=bound),
        }

    def summary(self) -> str:
        total = math.sqrt(sum(s["norm"] ** 2 for s in self.stats.values()))
        largest = max(self.stats.items(), key=lambda item: item[1]["absmax"])
        bad = sum(s["nonfinite"] for s in self.stats.values())
        return f"grad norm {total:.4f} max |g| {largest[1]['absmax']:.4f} ({largest[0]}) non-finite {bad}"


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = TensorDataset(mixture_data(2 * 40 * args.batch_size))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = NoisePredictor()
    monitor = GradientMonitor(net) if rank == 0 else None
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    torch.manual_seed(1 + rank)  # per-rank diffusion times and noise
    meter, epoch, step = Meter(args), 0, 0
    while True:
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for (x0,) in loader:
            step += 1
            if monitor is not None and args.fix:
                monitor.active = step % LOG_EVERY == 0
            loss = diffusion_loss(model, x0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(x0), len(x0)])
            if monitor is not None and step % LOG_EVERY == 0:
                print(f"step {step} loss {loss.item():.4f} {monitor.summary()}", flush=True)
            if meter.step(len(x0)):
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
