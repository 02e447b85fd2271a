"""The in-memory batcher shards exactly as torch's DistributedSampler does."""

import pytest
import torch
from torch.utils.data import DistributedSampler

from paratrain.engine.data import shard_indices
from paratrain.engine.distributed import RankContext


@pytest.mark.parametrize("n, world", [(100, 2), (101, 2), (7, 3), (64, 4)])
def test_same_indices_as_distributed_sampler(n, world):
    for epoch in (0, 3):
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=11)
            sampler.set_epoch(epoch)
            ours = shard_indices(
                n, RankContext(rank, world, rank, torch.device("cpu")), seed=11, epoch=epoch, shuffle=True
            )
            assert ours.tolist() == list(sampler)


def test_epochs_reshuffle_and_ranks_partition():
    ctx = [RankContext(r, 2, r, torch.device("cpu")) for r in range(2)]
    e0 = [shard_indices(100, c, 0, 0, True) for c in ctx]
    e1 = [shard_indices(100, c, 0, 1, True) for c in ctx]
    assert sorted(torch.cat(e0).tolist()) == list(range(100))
    assert not torch.equal(e0[0], e1[0])
