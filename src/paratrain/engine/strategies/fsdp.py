"""Fully sharded data parallel: parameters, gradients and optimizer state split across the ranks.

PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`; Zhao et al. 2023, ZeRO stage 3 of
Rajbhandari et al. 2020). Each rank keeps 1/N of every parameter as a DTensor shard, so the
optimizer built over the shards holds 1/N of the state too. Wrapping follows torchtitan: one FSDP
unit per block (each transformer block of `gpt`, each residual block of the ResNets, the
`--shard-unit` class of a user's model, else each child of the model that has parameters), then
the root, which takes what is left (embeddings, head, tied weights). Before a unit's forward its
parameters are all-gathered; after its backward its gradients are reduce-scattered, each rank
keeping the averaged gradient of its own shard.

- `--reshard-after-forward true` frees the gathered parameters after each unit's forward and
  gathers them again in backward (ZeRO-3); `false` keeps them from forward to backward (one
  all-gather per step instead of two, more memory: ZeRO-2-like).
- `--precision bf16`: FSDP's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, which
  casts the gathered parameters to bf16 and reduces gradients in fp32, instead of the loop's
  autocast: the forward then runs entirely in bf16 (autocast would keep some ops in fp32), and the
  all-gathers move half the bytes. The loop's autocast context is ignored for this strategy.
- `--cpu-offload`: `CPUOffloadPolicy`, shards and optimizer state in host memory, for GPU ranks
  (on CPU ranks everything is in host memory already; launch refuses the flag there).
- Gradient accumulation: micro-steps before the last run under
  `set_requires_gradient_sync(False)`, which keeps unsharded gradients locally (memory of a
  whole model's gradients) and reduce-scatters once, on the last micro-step.
- Checkpoints: `torch.distributed.checkpoint` (DCP, engine/strategies/sharded_checkpoint.py): every
  rank writes its own shards; loading reshards them, so a run saved on N ranks resumes on M
  (config.identity leaves the split of the global batch out for fsdp).
- BatchNorm statistics (buffers) are not sharded or averaged: each rank keeps its own, as DDP
  would with `broadcast_buffers=False`; checkpoints keep rank 0's.
- The device mesh is explicit, on the rank's own device type: without one, `fully_shard` builds
  its mesh on torch's compile-time accelerator (`torch._C._get_accelerator()`), which is cuda in
  any CUDA build of torch, and moves CPU ranks' parameters to a GPU.
- `--dp-replicate R` (HSDP, hybrid sharded data parallel): FSDP2 given an (R, workers/R) mesh
  shards each parameter within a replica of workers/R ranks and all-reduces the reduce-scattered
  gradients across the R replicas: memory per rank as fsdp on workers/R ranks, and the gathers stay
  within a replica (on a cluster: within a node).
- `--tp T` (FSDP x TP): the ranks form a (workers/T, T) mesh; each layer is split over a row of T
  ranks first (engine/strategies/tensor.py), then FSDP shards the splits over the column.
- No rank holds the whole model (torchtitan's idiom, engine/strategies/meta_init.py): the model is
  built on the meta device, split and sharded, materialised with `to_empty` on the rank's device,
  then initialised: each module's own `reset_parameters` on a full-size host copy of that module,
  the rank keeping its shard, so a model whose constructor initialises its layers that way gets the
  ordinary build's weights for the same seed. A model with an initialisation of its own over the
  whole model defines `init_weights()` (torchtitan's name; the ResNets do), which then runs on
  the shards: the same distributions, other draws (where the shards are in host memory, on CPU
  meshes or offloaded by --cpu-offload, DTensor's sharded random generator does not apply: each
  shard draws from a stream of its own so that the shards differ, and HSDP's replicas of one shard
  draw the same). With --tp such a model is built whole on the host before it is split, so every
  layout starts from the weights one process draws; so is a model that creates parameters or
  buffers no `reset_parameters` initialises, and the rank log says so.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._random import is_rng_supported_mesh

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext, device_mesh, join_group_of_one
from paratrain.engine.grad_noise import MeasuredReduceScatter, ShardNorms
from paratrain.engine.strategies.base import StepResult, WholeModelStrategy
from paratrain.engine.strategies.meta_init import FullSizeCopies, build_on_meta
from paratrain.engine.strategies.sharded_checkpoint import ShardedCheckpoints
from paratrain.engine.strategies.tensor import apply_tensor_parallel, loss_context, reported
from paratrain.errors import UsageError

log = logging.getLogger("paratrain.rank")


def shard_units(model: nn.Module, class_name: str | None) -> list[nn.Module]:
    """The modules wrapped as FSDP units before the root, innermost first.

    A unit whose parameters are also used outside it (weights tied across modules, such as gpt's
    embedding and output head) is left to the root, which then owns the shared parameter once.
    """
    from paratrain.workloads.models import residual_blocks

    if class_name is not None:
        units = [m for m in model.modules() if type(m).__name__ == class_name and m is not model]
        if not units and type(model).__name__ != class_name:
            found = sorted({type(m).__name__ for m in model.modules()})
            raise UsageError(
                f"--shard-unit {class_name}: the model has no module of that class; choose one of {', '.join(found)}"
            )
    else:
        units = residual_blocks(model)
    owners: dict[int, set[int]] = {}  # parameter -> the modules that register it
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), set()).add(id(module))
    kept = []
    for unit in units:
        inside = {id(m) for m in unit.modules()}
        params = list(unit.parameters())
        if params and all(owners[id(p)] <= inside for p in params):
            kept.append(unit)
    # Innermost first: fully_shard wraps nested units bottom-up.
    depth = {id(m): name.count(".") + 1 for name, m in model.named_modules() if name}
    return sorted(kept, key=lambda m: -depth[id(m)])


def shard_in_units(model: nn.Module, cfg: TrainConfig, mesh: DeviceMesh) -> None:
    """fully_shard over `mesh`, unit by unit (shard_units) and then the root, with the run's resharding,
    mixed-precision and offload policies (module docstring); in place. Also a hybrid pipeline's stages."""
    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": cfg.reshard_after_forward}
    if cfg.precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for unit in shard_units(model, cfg.shard_unit):
        fully_shard(unit, **options)
    fully_shard(model, **options)


class FullyShardedDataParallel(WholeModelStrategy):
    name = "fsdp"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        # One rank has nobody to shard with, but its parameters are still DTensors on a mesh of one.
        join_group_of_one(ctx.device)
        # Every fully_shard call gets this mesh: the default one would be on the compile-time accelerator.
        # With --tp T the ranks form a (data, tensor) mesh, torchtitan's 2-D layout: T consecutive ranks split
        # each layer, and FSDP shards over the ranks holding the same split.
        # With --dp-replicate R, FSDP shards within each of R replicas and all-reduces across them (HSDP).
        if cfg.tp > 1 or cfg.dp_replicate > 1:
            shards = dist.get_world_size() // (cfg.dp_replicate * cfg.tp)
            grid = device_mesh(ctx, (cfg.dp_replicate, shards, cfg.tp), ("dp_replicate", "dp_shard", "tp"), cfg.seed)
            self.mesh = grid["dp_replicate", "dp_shard"] if cfg.dp_replicate > 1 else grid["dp_shard"]
            self.tp_mesh = grid["tp"]
            self.shard_index = grid["dp_shard"].get_local_rank()
        else:
            self.mesh = device_mesh(ctx, (dist.get_world_size(),), None, cfg.seed)
            self.shard_index = self.mesh.get_local_rank()
        replicas = f" + all-reduce over {cfg.dp_replicate} replicas" if cfg.dp_replicate > 1 else ""
        self.allreduce = f"reduce-scatter{replicas} ({dist.get_backend()})"
        self._last_launch: Any | None = None
        if cfg.measures_grad_noise and dist.get_world_size() > 1:
            self.grad_norms: ShardNorms | None = ShardNorms(cfg.dp_replicate)
        self.checkpoints = ShardedCheckpoints(ctx, cfg.run_dir)
        self.copies = FullSizeCopies()  # build's, for wrap to materialise

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """The model on the meta device, for `wrap` to shard and materialise (engine/strategies/meta_init.py), with
        full-size copies of its self-initialising modules taken before --tp splits it; built whole on the host
        where that would leave something uninitialised, and with --tp where init_weights() runs over the whole
        model (every layout starts from one process's weights)."""
        model = build_on_meta(make, super().build, piecewise_init=self.cfg.tp == 1)
        self.copies = FullSizeCopies(model)
        return model

    def split(self, model: nn.Module) -> None:
        """With --tp, tensor parallelism first; FSDP then shards the splits (wrap)."""
        if self.cfg.tp > 1:
            apply_tensor_parallel(model, self.tp_mesh, self.cfg)

    def wrap(self, model: nn.Module) -> nn.Module:
        shard_in_units(model, self.cfg, self.mesh)
        if self.copies.materialise(model, self.ctx.device, self.cfg.seed):
            self._init_weights(model)
        comm = MeasuredReduceScatter(self.grad_norms, started=self._stamp_launch)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(comm)
        return model

    @torch.no_grad()
    def _init_weights(self, model: nn.Module) -> None:
        """A model's own initialisation over the whole model (init_weights()), run on the materialised shards."""
        init_weights = getattr(model, "init_weights", None)
        if not callable(init_weights):
            return
        # Shards in host memory (a CPU mesh, or --cpu-offload's GPU mesh) draw from the host's generator, which
        # DTensor's tracker does not govern and which every rank seeded alike: each shard of a weight would be the same.
        on_host = any(p.to_local().device.type == "cpu" for p in model.parameters() if isinstance(p, DTensor))
        with warnings.catch_warnings():
            # DTensor warns at each random op on a CPU mesh; the separate streams below are the answer.
            warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
            if not on_host and is_rng_supported_mesh(self.mesh):
                init_weights()  # DTensor's own generator gives each shard its part of one stream
            else:
                # By shard, not by rank: HSDP's replicas of a shard must draw the same values.
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.cfg.seed * 1000 + self.shard_index)
                    init_weights()

    def data_shard(self) -> tuple[int, int]:
        """One shard per data-parallel index: the ranks of a tensor-parallel group read the same one."""
        return self.ctx.rank // self.cfg.tp, self.ctx.world_size // self.cfg.tp

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
        # The mixed-precision policy casts the parameters (module docstring): no autocast on top.
        with loss_context(self.cfg):
            result = super().forward_backward(model, objective, x, y, loss_divisor, scaler, nullcontext)
        return self._reported(result)

    def evaluate(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        with loss_context(self.cfg):
            result = super().evaluate(model, objective, x, y, nullcontext)
        return self._reported(result)

    def _reported(self, result: StepResult) -> StepResult:
        return reported(result, self.tp_mesh) if self.cfg.tp > 1 else result

    @contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def _stamp_launch(self) -> None:
        self._last_launch = self.stamp()

    def comm_started(self) -> Any | None:
        launched, self._last_launch = self._last_launch, None
        return launched

    def discard_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The shards' gradients, and the unsharded ones that micro-steps under no_sync left with FSDP: its
        next reduce-scatter would add them in, and FSDP2 has no public call that drops them (its parameter
        groups' state is private; torch is pinned, and tests/test_strategies_sharded.py checks this)."""
        optimizer.zero_grad(set_to_none=True)
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            state = module._get_fsdp_state()
            for group in state._fsdp_param_groups:
                for param in group.fsdp_params:
                    param.unsharded_accumulated_grad = None
                    if hasattr(param, "_unsharded_param"):
                        param._unsharded_param.grad = None

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        return self.checkpoints.save(model, optimizer)

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self.checkpoints.load(model, optimizer, state)
