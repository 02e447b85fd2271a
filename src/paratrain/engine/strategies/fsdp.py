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
- Checkpoints: `torch.distributed.checkpoint` (DCP) with `get_state_dict`/`set_state_dict`: every
  rank writes its own shards into a directory beside checkpoint.pt; loading reshards them, so a
  run saved on N ranks resumes on M (config.identity leaves the split of the global batch out for
  fsdp). checkpoint.pt names the directory and is written last, so a run killed while saving
  resumes from the previous complete one.
- BatchNorm statistics (buffers) are not sharded or averaged: each rank keeps its own, as DDP
  would with `broadcast_buffers=False`; checkpoints keep rank 0's.
"""
from __future__ import annotations

import shutil
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.base import StepResult, WholeModelStrategy
from paratrain.errors import UsageError

# Where the sharded state of a checkpoint lives: RUN_DIR/checkpoint.dcp/save-NNNNNN/.
DCP_DIR = "checkpoint.dcp"


def shard_units(model: nn.Module, class_name: Optional[str]) -> list[nn.Module]:
    """The modules wrapped as FSDP units before the root, innermost first.

    A unit whose parameters are also used outside it (weights tied across modules, such as gpt's
    embedding and output head) is left to the root, which then owns the shared parameter once.
    """
    from paratrain.workloads.models import residual_blocks

    if class_name is not None:
        units = [m for m in model.modules() if type(m).__name__ == class_name and m is not model]
        if not units and type(model).__name__ != class_name:
            found = sorted({type(m).__name__ for m in model.modules()})
            raise UsageError(f"--shard-unit {class_name}: the model has no module of that class; choose one of "
                             f"{', '.join(found)}")
    else:
        units = residual_blocks(model)
    owners: dict[int, set[int]] = {}        # parameter -> the modules that register it
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


class _StampedReduceScatter(ReduceScatter):
    """FSDP's own reduce-scatter (`dist.reduce_scatter_single`), stamping when each one starts."""

    def __init__(self, strategy: "FullyShardedDataParallel"):
        self.strategy = strategy

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> Optional[dist.Work]:
        self.strategy._last_launch = self.strategy.stamp()
        return dist.reduce_scatter_single(output_tensor, input_tensor, group=group, op=op, async_op=async_op)


class FullyShardedDataParallel(WholeModelStrategy):
    name = "fsdp"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        if not dist.is_initialized():
            # One rank has nobody to shard with, but its parameters are still DTensors on a mesh of
            # one: the same code path, and its checkpoints resume on any number of ranks.
            dist.init_process_group("nccl" if ctx.device.type == "cuda" else "gloo", store=dist.HashStore(),
                                    rank=0, world_size=1)
        self.allreduce = f"reduce-scatter ({dist.get_backend()})"
        self._last_launch: Optional[Any] = None
        self._saved: Optional[str] = None          # the DCP directory checkpoint.pt names (relative to the run)
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir is not None else Path(".")

    def wrap(self, model: nn.Module) -> nn.Module:
        cfg = self.cfg
        options: dict[str, Any] = {"reshard_after_forward": cfg.reshard_after_forward}
        if cfg.precision == "bf16":
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        for unit in shard_units(model, cfg.shard_unit):
            fully_shard(unit, **options)
        fully_shard(model, **options)
        comm = _StampedReduceScatter(self)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(comm)
        return model

    def forward_backward(self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor,
                         loss_divisor: int, scaler: torch.amp.GradScaler, autocast: Callable[[], AbstractContextManager]) -> StepResult:
        # The mixed-precision policy casts the parameters (module docstring): no autocast on top.
        return super().forward_backward(model, objective, x, y, loss_divisor, scaler, nullcontext)

    def evaluate(self, model: nn.Module, objective: Any, x: torch.Tensor, y: torch.Tensor,
                 autocast: Callable[[], AbstractContextManager]) -> StepResult:
        return super().evaluate(model, objective, x, y, nullcontext)

    @contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def comm_started(self) -> Optional[Any]:
        launched, self._last_launch = self._last_launch, None
        return launched

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Optional[dict[str, Any]]:
        """Every rank writes its shards to a new DCP directory; rank 0 returns its name for checkpoint.pt.

        Directories other than the one checkpoint.pt names now (left by a save that was
        interrupted, or superseded by the last save) are removed first, so at most two exist.
        """
        root = self.run_dir / DCP_DIR
        number = int(self._saved.rsplit("-", 1)[1]) + 1 if self._saved else 1
        name = f"{DCP_DIR}/save-{number:06d}"
        if self.ctx.is_main and root.is_dir():
            for entry in root.iterdir():
                if f"{DCP_DIR}/{entry.name}" != self._saved:
                    shutil.rmtree(entry, ignore_errors=True)
        dist.barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=self.run_dir / name)
        self._saved = name
        return {"dcp": name} if self.ctx.is_main else None

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        model_state, optim_state = get_state_dict(model, optimizer)
        loaded = {"model": model_state, "optimizer": optim_state}
        dcp.load(loaded, checkpoint_id=self.run_dir / state["dcp"])
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
        self._saved = state["dcp"]
