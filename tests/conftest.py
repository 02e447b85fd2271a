from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Decoded datasets go to a cache shared by the session's tests, never the user's."""
    monkeypatch.setenv("PARATRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def synthetic(tmp_path: Path, **overrides):
    """A small, quick training config on the synthetic dataset (1 thread per worker)."""
    cfg = dict(workload="synthetic-cnn", synthetic_samples=512, epochs=2, batch_size=32, lr=0.01,
               threads_per_worker=1, quiet=True, run_dir=tmp_path / "run", log_every=4)
    cfg.update(overrides)
    return cfg
