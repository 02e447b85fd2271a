"""Batched on-device augmentation: each transform does what it says, reproducibly."""

import time

import pytest
import torch

from paratrain.engine.augment import BatchAugment
from paratrain.errors import UsageError


def _batch(n=16, c=3, h=8, w=8):
    return torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(1))


def test_flip_flips_exactly_the_drawn_samples():
    x = _batch()
    aug = BatchAugment(["flip"], seed=3)
    mask = torch.rand(len(x), generator=torch.Generator().manual_seed(3)) < 0.5
    out = aug(x)
    assert 0 < mask.sum() < len(x)
    torch.testing.assert_close(out[mask], x[mask].flip(3))
    torch.testing.assert_close(out[~mask], x[~mask])


def test_crop_is_a_window_of_the_zero_padded_image():
    x = _batch()
    out = BatchAugment(["crop"], seed=5, crop_padding=2)(x)
    g = torch.Generator().manual_seed(5)
    dy = torch.randint(0, 5, (len(x),), generator=g)
    dx = torch.randint(0, 5, (len(x),), generator=g)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(len(x)):
        torch.testing.assert_close(out[i], padded[i, :, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8])
    assert (dy != 2).any() or (dx != 2).any(), "some sample must actually move"


def test_jitter_stays_in_range_and_changes_colours():
    x = _batch()
    out = BatchAugment(["jitter"], seed=0)(x)
    assert out.min() >= 0 and out.max() <= 1
    assert not torch.allclose(out, x)


def test_jitter_with_unit_factors_is_identity(monkeypatch):
    aug = BatchAugment(["jitter"], seed=0)
    monkeypatch.setattr(aug, "_uniform", lambda n, lo, hi: torch.ones(n))
    x = _batch()
    torch.testing.assert_close(aug(x), x)


def test_seeds_and_state_dict_reproduce_the_stream():
    x = _batch()
    a, b = BatchAugment(["flip", "crop", "jitter"], seed=7), BatchAugment(["flip", "crop", "jitter"], seed=7)
    torch.testing.assert_close(a(x), b(x))
    assert not torch.allclose(BatchAugment(["flip", "crop", "jitter"], seed=8)(x), a(x))
    state = a.state_dict()
    first = a(x)
    a.load_state_dict(state)
    torch.testing.assert_close(a(x), first)


def test_a_cifar_batch_is_cheap():
    x = torch.rand(128, 3, 32, 32)
    aug = BatchAugment(["flip", "crop", "jitter"], seed=0)
    torch.set_num_threads(1)
    aug(x)
    start = time.perf_counter()
    for _ in range(10):
        aug(x)
    assert (time.perf_counter() - start) / 10 < 0.05


def test_unknown_augmentation():
    with pytest.raises(UsageError, match="mixup"):
        BatchAugment(["mixup"], seed=0)
