"""Asynchronous SGD through parameter servers (Dean et al. 2012; Li et al. 2014), optionally
stale-synchronous (Ho et al. 2013), over torch.distributed.rpc.

The last `--ps-ranks` ranks are servers; the others are workers. Each server holds a shard of the
parameters (whole tensors, dealt largest first to the least-loaded server) and its own optimizer
over that shard. After its backward a worker pushes each shard's gradients to its server in one
RPC, which applies them at once with the run's optimizer and answers with the shard's fresh
parameters: a worker never waits for another worker, only for the servers' answers. With
`--max-staleness S` a server holds back a worker that has pushed more than S updates beyond the
slowest worker until that one catches up (SSP's clock bound); without it nothing waits.

Each update is recorded at the server: its *staleness* (how many updates the pushing worker is
ahead of the slowest, the quantity the bound limits) and its *delay* (how many updates other
workers applied between this worker's last pull and this push: the age of the parameters its
gradient was computed on, Dean et al.'s staleness).

Servers do not train, but they run the one loop with the workers: their forward and backward do
nothing and their optimizer step is empty, while the RPC agent's threads serve the pushes. The loop
meets the workers only where it reads the loss anyway (log points, epoch ends, evaluation), so
between those points no rank waits for another. Workers evaluate with the parameters they pulled
last. CPU ranks only.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.base import OptimizerFactory, StepResult, WholeModelStrategy
from paratrain.errors import UsageError

# The shard this process serves (None on workers): RPC calls arrive as module-level functions.
_SERVER: ShardServer | None = None


class AsyncParameterServer(WholeModelStrategy):
    name = "async-ps"
    allreduce = "rpc"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        self.workers = ctx.world_size - cfg.ps_ranks
        self.is_server = ctx.rank >= self.workers
        self.trains = not self.is_server
        self._shards: list[list[int]] = []  # parameter indices held by each server
        self._params: list[nn.Parameter] = []
        self._bytes = 0

    def data_shard(self) -> tuple[int, int]:
        # A server walks worker 0's shard so that its loop has as many steps as the workers' loops.
        return (0 if self.is_server else self.ctx.rank), self.workers

    def wrap(self, model: nn.Module) -> nn.Module:
        # One initial model for every rank: rank 0's, as DDP does.
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        self._params = list(model.parameters())
        self._shards = shard_parameters([p.numel() for p in self._params], self.cfg.ps_ranks)
        options = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=max(16, 2 * self.workers + 4), rpc_timeout=self.cfg.timeout
        )
        rpc.init_rpc(
            _name(self.ctx.rank), rank=self.ctx.rank, world_size=self.ctx.world_size, rpc_backend_options=options
        )
        return model

    def build_optimizer(self, model: nn.Module, make: OptimizerFactory) -> torch.optim.Optimizer:
        global _SERVER
        if self.is_server:
            # The server updates its own copy: the loop's zero_grad on the rank's model (which
            # it keeps stepping in time with the workers) cannot touch the gradients being applied.
            served = copy.deepcopy(model)
            params = list(served.parameters())
            shard = [params[i] for i in self._shards[self.ctx.rank - self.workers]]
            _SERVER = ShardServer(shard, make(served), self.workers, self.cfg.max_staleness)
        dist.barrier()  # every server is ready before any worker pushes
        # The loop sets this optimizer's LR each step; workers send it with their pushes. It never steps.
        return make(model)

    def forward_backward(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_divisor: int,
        scaler: torch.amp.GradScaler,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        if self.is_server:
            return None, None
        return super().forward_backward(model, objective, x, y, loss_divisor, scaler, autocast)

    def evaluate(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        if self.is_server:
            return None, None
        return super().evaluate(model, objective, x, y, autocast)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> tuple[Any, Any] | None:
        if self.is_server:
            return None
        start = self.stamp()
        lr = optimizer.param_groups[0]["lr"]
        pending = []
        for server, indices in enumerate(self._shards):
            grads = [
                self._params[i].grad if self._params[i].grad is not None else torch.zeros_like(self._params[i])
                for i in indices
            ]
            self._bytes += sum(g.numel() * g.element_size() for g in grads)
            pending.append(rpc.rpc_async(_name(self.workers + server), _push_and_pull, args=(self.ctx.rank, lr, grads)))
        with torch.no_grad():
            for indices, answer in zip(self._shards, pending):
                for i, fresh in zip(indices, answer.wait()):
                    self._params[i].copy_(fresh)
        return start, self.stamp()

    def bytes_sent(self) -> int | None:
        return _SERVER.bytes_sent if self.is_server else self._bytes

    def summary_fields(self) -> dict[str, Any]:
        records = self.ctx.gather_objects(_SERVER.records() if self.is_server else None)
        # Graceful: waits until every rank's outstanding calls are answered, then stops the agents.
        rpc.shutdown()
        if not self.ctx.is_main:
            return {}
        servers = [r for r in records if r is not None]
        staleness, delay = Counter(), Counter()
        for r in servers:
            staleness.update(r["staleness"])
            delay.update(r["delay"])
        updates = sum(staleness.values())
        return {
            "ps": {
                "servers": self.cfg.ps_ranks,
                "workers": self.workers,
                "max_staleness": self.cfg.max_staleness,
                "parameters_per_server": [r["parameters"] for r in servers],
                "updates": updates,  # per server: each worker's step is one update on every server
                "staleness": _distribution(staleness, updates),
                "delay": _distribution(delay, updates),
            }
        }


class ShardServer:
    """One server's shard: applies pushed gradients one at a time and answers with the parameters."""

    def __init__(
        self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer, workers: int, max_staleness: int | None
    ):
        self.params, self.optimizer, self.max_staleness = params, optimizer, max_staleness
        self.changed = threading.Condition()
        self.clock = [0] * workers  # updates applied from each worker
        self.version = 0  # updates applied in all
        self.pulled = [0] * workers  # the version each worker last received
        self.staleness: Counter = Counter()
        self.delay: Counter = Counter()
        self.bytes_sent = 0

    def apply(self, worker: int, lr: float, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        with self.changed:
            if self.max_staleness is not None:
                self.changed.wait_for(lambda: self.clock[worker] - min(self.clock) <= self.max_staleness)
            self.staleness[self.clock[worker] - min(self.clock)] += 1
            self.delay[self.version - self.pulled[worker]] += 1
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            for param, grad in zip(self.params, grads):
                param.grad = grad
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.clock[worker] += 1
            self.version += 1
            self.pulled[worker] = self.version
            self.changed.notify_all()
            fresh = [p.detach().clone() for p in self.params]
            self.bytes_sent += sum(t.numel() * t.element_size() for t in fresh)
            return fresh

    def records(self) -> dict[str, Any]:
        with self.changed:
            return {
                "staleness": dict(self.staleness),
                "delay": dict(self.delay),
                "parameters": sum(p.numel() for p in self.params),
            }


def _push_and_pull(worker: int, lr: float, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    assert _SERVER is not None, "a push reached a rank that serves no shard"
    return _SERVER.apply(worker, lr, grads)


def _name(rank: int) -> str:
    return f"rank{rank}"


def shard_parameters(sizes: list[int], servers: int) -> list[list[int]]:
    """Parameter indices per server: whole tensors, largest first to the least-loaded server."""
    shards: list[list[int]] = [[] for _ in range(servers)]
    loads = [0] * servers
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        target = loads.index(min(loads))
        shards[target].append(index)
        loads[target] += sizes[index]
    return [sorted(shard) for shard in shards]


def _distribution(counts: Counter, total: int) -> dict[str, Any]:
    return {
        "max": max(counts) if counts else None,
        "mean": sum(k * n for k, n in counts.items()) / total if total else None,
        "counts": {str(k): counts[k] for k in sorted(counts)},
    }


def check_async_ps(cfg: TrainConfig, device_type: str) -> None:
    """Before anything is written: the servers exchange CPU tensors over RPC."""
    if cfg.strategy_name == "async-ps" and device_type != "cpu":
        raise UsageError("--strategy async-ps runs on CPU ranks (its RPC carries CPU tensors); add --device cpu")
