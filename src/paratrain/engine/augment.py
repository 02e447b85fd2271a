"""Data augmentation as batched tensor operations on the device.

One call transforms a whole batch: no per-sample Python, no PIL, no worker processes. Randomness
comes from a generator owned by the object (seeded with seed + rank by the engine), so runs are
reproducible and a checkpoint restores the exact stream. The generator and the constants live on
the batch's device: random numbers drawn on the host and copied over would cost a blocking
host-to-device copy per batch on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paratrain.errors import UsageError

AUGMENTATIONS: tuple[str, ...] = ("flip", "crop", "jitter")
GREY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601 luma weights, as torchvision uses


class BatchAugment:
    def __init__(self, names: Sequence[str], seed: int, device: torch.device | str = "cpu", crop_padding: int = 4):
        unknown = [n for n in names if n not in AUGMENTATIONS]
        if unknown:
            raise UsageError(f"unknown augmentation {unknown[0]!r}; choose from {','.join(AUGMENTATIONS)}")
        self.names = tuple(names)
        self.padding = crop_padding
        self.device = torch.device(device)
        # The generator's state is device-specific, so a checkpoint resumes only on the same kind of
        # device (launch refuses a CPU checkpoint on GPUs and vice versa).
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.grey_weights = torch.tensor(GREY_WEIGHTS, device=self.device)[None, :, None, None]

    def _uniform(self, n: int, low: float, high: float) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, device=self.device) * (high - low) + low

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            x = getattr(self, f"_{name}")(x)
        return x

    def _flip(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.rand(x.shape[0], generator=self.generator, device=self.device) < 0.5
        return torch.where(mask[:, None, None, None], x.flip(3), x)

    def _crop(self, x: torch.Tensor) -> torch.Tensor:
        """Zero-pad by `padding` and cut a random H x W window per sample, in one gather."""
        b, c, h, w = x.shape
        p = self.padding
        padded = torch.nn.functional.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (b,), generator=self.generator, device=self.device)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=self.generator, device=self.device)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        batch = torch.arange(b, device=x.device)[:, None, None, None]
        chan = torch.arange(c, device=x.device)[None, :, None, None]
        return padded[batch, chan, rows, cols]

    def _jitter(self, x: torch.Tensor) -> torch.Tensor:
        """Brightness, contrast, saturation each by a factor in [0.6, 1.4] (ColorJitter(0.4) semantics)."""
        b = x.shape[0]
        brightness, contrast, saturation = (self._uniform(b, 0.6, 1.4)[:, None, None, None] for _ in range(3))
        x = (x * brightness).clamp_(0, 1)
        grey = self._grey(x)
        mean = grey.mean(dim=(1, 2, 3), keepdim=True)
        x = (contrast * x + (1 - contrast) * mean).clamp_(0, 1)
        grey = self._grey(x)
        return (saturation * x + (1 - saturation) * grey).clamp_(0, 1)

    def _grey(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 3:
            return x.mean(dim=1, keepdim=True)
        return (x * self.grey_weights.to(x.dtype)).sum(dim=1, keepdim=True)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
