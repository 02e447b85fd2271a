"""The shared-memory gradient average between real processes (a real gloo group sets it up)."""

import os

import pytest
import torch
import torch.distributed as dist
from conftest import start_ranks

from paratrain.config import TrainConfig
from paratrain.engine import shm_allreduce
from paratrain.engine.shm_allreduce import open_shared_average, shm_supported
from paratrain.errors import UsageError
from paratrain.launch.placement import plan_placement

pytestmark = pytest.mark.skipif(not shm_supported(), reason="shared-memory all-reduce needs x86-64 Linux")

# (numel, dtype): a single element, fewer elements than ranks, several chunks with a ragged end;
# fp16 with values whose sum overflows it.
CASES = [
    (1, torch.float32),
    (2, torch.float32),
    (1000, torch.float32),
    (777, torch.bfloat16),
    (300, torch.float64),
    (500, torch.float16),
]
CHUNK_BYTES = 1024


def _data(rank: int, call: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * call + rank)
    values = torch.randn(numel, generator=g, dtype=torch.float64)
    if dtype == torch.float16:
        values = values.sign() * 40000 + values  # near fp16's largest (65,504): a sum of two overflows
    return values.to(dtype)


def _rank(rank: int, world: int, init: str, calls: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        engine = open_shared_average(rank, world, chunk_bytes=CHUNK_BYTES)
        assert engine is not None
        for call in range(calls):
            numel, dtype = CASES[call % len(CASES)]
            mine = _data(rank, call, numel, dtype)
            out = engine.average_(mine.clone())
            # The reference sums in the same order (rank 0, 1, ...) in the same dtype; fp16 in float32.
            wide = torch.float32 if dtype == torch.float16 else dtype
            expected = _data(0, call, numel, dtype).to(wide)
            for other in range(1, world):
                expected = expected + _data(other, call, numel, dtype).to(wide)
            expected = (expected / world).to(dtype)
            assert torch.isfinite(expected).all()
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            # Every rank must hold the same bytes, or the replicas drift apart.
            gathered = [torch.empty_like(out) for _ in range(world)]
            dist.all_gather(gathered, out)
            assert all(torch.equal(g, out) for g in gathered)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_the_exact_mean_in_every_chunk_and_dtype(tmp_path, world):
    """Many calls with fresh data each time: a rank overwriting a slot another still reads would show.
    World 3 has more ranks than this machine's cores: the waits must yield, not starve a peer."""
    # A rank that fails raises here, with its traceback.
    start_ranks(_rank, (world, f"file://{tmp_path / 'store'}", 40), nprocs=world)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("paratrain-allreduce-")], "segment left behind"


def test_auto_picks_shared_memory_on_cpu_and_shm_is_refused_where_it_cannot_work(monkeypatch):
    assert plan_placement(TrainConfig(workers=2, threads_per_worker=1)).allreduce == "shm"
    assert plan_placement(TrainConfig(workers=2, threads_per_worker=1, allreduce="backend")).allreduce == "backend"
    assert plan_placement(TrainConfig(workers=1)).allreduce == "backend"
    # Ranks time-slicing cores would burn each other's time polling: auto leaves them on gloo.
    assert plan_placement(TrainConfig(workers=3, threads_per_worker=1, allow_oversubscribe=True)).allreduce == "backend"
    monkeypatch.setattr(shm_allreduce.platform, "machine", lambda: "aarch64")
    assert plan_placement(TrainConfig(workers=2, threads_per_worker=1)).allreduce == "backend"
    with pytest.raises(UsageError, match="x86-64"):
        plan_placement(TrainConfig(workers=2, threads_per_worker=1, allreduce="shm"))
