"""Properties of the synchronisation schemes' bytes (#58; docs/synchronisation.md): in every shape drawn, each
scheme hands over what the docs say it does, step by step.

The DDP schemes run for real, on a gloo process group of one rank in this process: the comm hooks, torch's
post-local-SGD hook and PeriodicModelAverager, its compress wrappers and PowerSGD all run as in training, on
models of drawn widths for drawn periods, warm-ups and ranks, and their `comm_bytes_per_step` counts are checked
against the docs' formulas. A rank's count does not depend on how many ranks there are (it is the payload each
rank hands over), except --reduce ps's rank 0, which also broadcasts: the one rank here is rank 0; two ranks run
in test_synchronisation.py. The async parameter server's sharding and its servers' accounting are pure Python,
drawn over 1-64 servers and 1-8 workers.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies import STRATEGIES
from paratrain.engine.strategies.async_ps import ShardServer, shard_parameters

FEW = settings(max_examples=15, deadline=None)
widths = st.lists(st.integers(1, 24), min_size=2, max_size=4)


@pytest.fixture(scope="module")
def one_rank():
    """A real gloo process group of one rank, in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def bytes_after_each_step(layers: list[int], steps: int, **options) -> tuple[list[int], int]:
    """A DDP model of Linear layers `layers` wide, stepped `steps` times under the options: the bytes the rank has
    handed over after each step, and its gradients' bytes (float32: 4 a parameter)."""
    torch.manual_seed(0)
    strategy = STRATEGIES["ddp"](
        TrainConfig(workers=2, **options), RankContext(0, 1, 0, torch.device("cpu")), time.perf_counter
    )
    blocks = [nn.Linear(a, b) for a, b in itertools.pairwise(layers)]
    model = strategy.wrap(nn.Sequential(*blocks))
    optimizer = strategy.build_optimizer(model, lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    sent = []
    for _ in range(steps):
        model(torch.randn(3, layers[0])).pow(2).mean().backward()
        strategy.optimizer_step(optimizer, scaler)
        optimizer.zero_grad(set_to_none=True)
        sent.append(strategy.bytes_sent())
    return sent, 4 * sum(p.numel() for p in model.parameters())


@FEW
@given(layers=widths, steps=st.integers(1, 6), scheme=st.sampled_from(["ddp", "fp16", "reduce ps"]))
def test_every_step_schemes_hand_over_the_gradients_every_step(one_rank, layers, steps, scheme):
    """ddp: every gradient byte each step; fp16: half of them; --reduce ps: rank 0 its gradients to the reduce and
    the average to the broadcast, twice."""
    options = {"ddp": {}, "fp16": {"grad_compression": "fp16"}, "reduce ps": {"reduce": "ps"}}[scheme]
    sent, gradients = bytes_after_each_step(layers, steps, **options)
    per_step = {"ddp": gradients, "fp16": gradients // 2, "reduce ps": 2 * gradients}[scheme]
    assert sent == [per_step * (t + 1) for t in range(steps)]


@FEW
@given(
    layers=widths,
    period=st.integers(2, 5),
    warmup=st.integers(0, 4),
    periods=st.integers(1, 3),
    extra=st.integers(0, 4),
)
def test_local_sgd_sends_the_gradients_in_its_warm_up_then_the_parameters_every_h_steps(
    one_rank, layers, period, warmup, periods, extra
):
    """--sync-every H --sync-warmup S: the gradients at each of the first S steps, then the parameters (as many
    bytes) at step S + 1 and every H steps after it, nothing in between; over whole periods after the warm-up,
    1/H of what ddp hands over in those steps."""
    steps = warmup + periods * period + extra
    sent, gradients = bytes_after_each_step(layers, steps, sync_every=period, sync_warmup=warmup)
    averaged = [t >= warmup and (t - warmup) % period == 0 for t in range(steps)]  # step t + 1, counted from 0
    expected = [gradients * (min(t + 1, warmup) + sum(averaged[: t + 1])) for t in range(steps)]
    assert sent == expected
    every_step, _ = bytes_after_each_step(layers, warmup + periods * period)
    after_warmup = every_step[-1] - (every_step[warmup - 1] if warmup else 0)
    local = sent[warmup + periods * period - 1] - (sent[warmup - 1] if warmup else 0)
    assert local * period == after_warmup


@FEW
@given(layers=widths, rank=st.integers(1, 4), start=st.integers(2, 4), after=st.integers(1, 3))
def test_powersgd_sends_whole_gradients_until_its_start_then_its_factors(one_rank, layers, rank, start, after):
    """Bytes a step after --powersgd-start: 4 (n + m) r for each n x m weight where (n + m) r is less than half of
    n m, the whole tensor for the others and the biases; whole gradients before."""
    sent, gradients = bytes_after_each_step(
        layers, start + after, grad_compression="powersgd", powersgd_rank=rank, powersgd_start=start
    )
    compressed = 0
    for m, n in itertools.pairwise(layers):  # an n x m weight: n outputs of m inputs
        weight = (n + m) * rank if 2 * (n + m) * rank < n * m else n * m
        compressed += 4 * (weight + n)  # the weight's factors or itself, and the bias whole
    assert sent == [gradients * (t + 1) for t in range(start)] + [
        gradients * start + compressed * (t + 1) for t in range(after)
    ]


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 10**6), max_size=40), servers=st.integers(1, 64))
def test_async_ps_shards_hold_every_tensor_once_and_differ_by_at_most_the_largest(sizes, servers):
    shards = shard_parameters(sizes, servers)
    assert len(shards) == servers and all(shard == sorted(shard) for shard in shards)
    assert sorted(i for shard in shards for i in shard) == list(range(len(sizes)))
    loads = [sum(sizes[i] for i in shard) for shard in shards]
    assert max(loads) - min(loads) <= max(sizes, default=0)  # largest first to the least loaded


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    shapes=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3),
    workers=st.integers(1, 8),
    bound=st.none() | st.integers(0, 3),
    pushes=st.integers(1, 30),
)
def test_a_server_answers_every_push_with_its_shard_and_records_each_workers_lead_and_age(
    data, shapes, workers, bound, pushes
):
    """Each update sends the shard's parameters back (its bytes, every push); the staleness recorded is how far
    the pushing worker is ahead of the slowest (never above --max-staleness), the delay how many updates others
    applied since its last pull; in any order of pushes the bound admits."""
    params = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    server = ShardServer(params, torch.optim.SGD(params, lr=0.1), workers, bound)
    clock, pulled, version = [0] * workers, [0] * workers, 0
    staleness: dict[int, int] = {}
    delay: dict[int, int] = {}
    for _ in range(pushes):
        admitted = [w for w in range(workers) if bound is None or clock[w] - min(clock) <= bound]
        worker = data.draw(st.sampled_from(admitted), "worker")
        ahead = clock[worker] - min(clock)
        staleness[ahead] = staleness.get(ahead, 0) + 1
        delay[version - pulled[worker]] = delay.get(version - pulled[worker], 0) + 1
        answer = server.apply(worker, 0.1, [torch.ones(shape) for shape in shapes])
        clock[worker], version = clock[worker] + 1, version + 1
        pulled[worker] = version
        assert [tuple(t.shape) for t in answer] == shapes
    assert server.bytes_sent == pushes * 4 * sum(n * m for n, m in shapes)
    records = server.records()
    assert (records["staleness"], records["delay"]) == (staleness, delay)
    assert bound is None or max(staleness) <= bound
