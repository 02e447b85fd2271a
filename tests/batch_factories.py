"""Workloads with known answers for the batch-size tools (tests/test_batch.py).

- Linear regression y = x·w* + ε with x ~ N(0, I), |w*| = 1 and noise σ: at w = 0 (the model's
  weights start at zero) the per-sample gradient of ½(x·w − y)² is −x·y, so the gradient noise scale
  B_simple = tr(Σ)/|G|² of the data set is computed exactly from the samples (`exact_b_simple`).
- A planted memory limit: a model whose training forward reserves PLANTED_GIB_PER_SAMPLE GiB per
  sample (address space only, never touched): under --memory-limit (RLIMIT_DATA) the probe of any
  batch past the limit really fails to allocate, at a batch the test knows exactly.
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset

DIM, SAMPLES, NOISE = 32, 8192, 1.0
GIB = 2**30


def regression_tensors():
    g = torch.Generator().manual_seed(0)
    w_star = torch.randn(DIM, generator=g)
    w_star /= w_star.norm()
    x = torch.randn(SAMPLES, DIM, generator=g)
    y = x @ w_star + NOISE * torch.randn(SAMPLES, generator=g)
    return x, y


def regression_data():
    """(train, test) of C,H,W = 1,1,DIM samples with float targets."""
    x, y = regression_tensors()
    samples = x.view(SAMPLES, 1, 1, DIM)
    return TensorDataset(samples, y), TensorDataset(samples[:256], y[:256])


def exact_b_simple() -> float:
    x, y = regression_tensors()
    per_sample = -x * y[:, None]  # gradients at w = 0
    mean = per_sample.mean(0)
    trace = (per_sample - mean).pow(2).sum(1).mean()
    return float(trace / mean.pow(2).sum())


class ZeroLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(DIM))

    def forward(self, x):
        return x.flatten(1) @ self.weight


def zero_linear() -> nn.Module:
    return ZeroLinear()


def half_squared_error(output, target):
    return 0.5 * (output - target).pow(2).mean()


PLANTED_GIB_PER_SAMPLE = 1


class PlantedMemory(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * 4 * 4, num_classes)

    def forward(self, x):
        if self.training:
            # Reserved and dropped at once: RLIMIT_DATA counts it, the machine's memory never holds it.
            torch.empty(len(x) * PLANTED_GIB_PER_SAMPLE * GIB, dtype=torch.uint8)
        return self.fc(x.flatten(1))


def planted_memory(num_classes: int = 10) -> nn.Module:
    return PlantedMemory(num_classes)


MLP_SAMPLES, MLP_FEATURES = 4096, 16


def mlp_vectors():
    """(train, test) for a small MLP (user_factories:mlp): 16-float vectors of class 1 when a fixed
    linear function of them exceeds a threshold (about one in nine do). The samples' gradients at the
    start mostly agree, so the noise scale is small and sure (about 10 ± 1.5), below 2 workers x any
    knee from 8 up, as for the MLP of issue #27 (a noise scale of 5)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(MLP_SAMPLES + 512, MLP_FEATURES, generator=g)
    y = (x @ torch.randn(MLP_FEATURES, generator=g) > 4.0).long()
    return TensorDataset(x[:MLP_SAMPLES], y[:MLP_SAMPLES]), TensorDataset(x[MLP_SAMPLES:], y[MLP_SAMPLES:])
