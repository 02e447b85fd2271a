"""`paratrain.batch_schedule(...)`: --batch-schedule warmup or adaptive in a user's own script (#30).

The script keeps its loop and lets paratrain decide how many micro-batches make each optimizer step, the
way nanoGPT accumulates (every micro-step but the last skips the gradient synchronisation):

    schedule = paratrain.batch_schedule(model, optimizer, batch_size=32, samples_per_epoch=len(train_set))
    while training:
        for _ in schedule.micro_steps():            # schedule.accum of them; all but the last in no_sync
            x, y = next(batches)
            (loss_fn(model(x), y) / schedule.accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step_done()

`paratrain launch --batch-schedule warmup|adaptive` passes the schedule in the ranks' environment
(BATCH_SCHEDULE_ENV); without it (torchrun, python script.py) the schedule is fixed at `grad_accum` and the script
trains as it always did. The decisions are the engine's own (engine/batch_schedule.py, from a TrainConfig
made of the script's figures), so a script's schedule grows by the same rule as `paratrain train`'s:

- It grows by accumulation only: the per-rank batch is the script's loader's.
- adaptive reads the gradient noise where the run averages its gradients (engine/grad_noise.py): a comm
  hook on a DistributedDataParallel model (DDP's own all-reduce hook, wrapped), FSDP2's reduce-scatter on a
  `fully_shard`ed one (a 1-D mesh, or HSDP's 2-D mesh of replicas and shards: its parameters Replicate then
  Shard), the first micro-step against the whole step in one process. Shards of tensor-parallel pieces
  (FSDP over TP) are refused for adaptive: a rank's reduce-scatter holds its piece's gradient, not its batch's.
- Its throughput model needs no extra pass: a micro-step is timed from the moment `micro_steps()` hands it
  to the script to the moment the script asks for the next one (loading, forward, backward: all of what
  doubles when the accumulation doubles), and a step from its first micro-step to `step_done()`. The rest
  (the optimizer, the synchronisation left exposed) stays. The micro-steps timed are those that do not
  synchronise; at one micro-step a step there are none, and the whole micro-step, synchronisation
  included, stands in for them, which under-predicts the gain of the first doubling. On CUDA the clock
  waits for the device in the step before each log point only, and only that step is timed.
- The LR: at each change every parameter group's LR is multiplied by the new factor over the old
  (--lr-scaling's rule), which a scheduler that works from the current LR keeps. A script that sets its
  LR from scratch each step multiplies it by `schedule.lr_factor` itself.
- Rank 0 records each change as a `batch` event in RUN_DIR/metrics.jsonl and the schedule's state in
  RUN_DIR/batch_schedule.json, which launch puts into summary.json; the ranks' norms go to
  RUN_DIR/grad_noise/, as for built-in runs. `state_dict()` goes into the script's checkpoint.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import TrainConfig, validate
from paratrain.engine.batch_schedule import BatchSchedule
from paratrain.engine.distributed import group_device
from paratrain.engine.grad_noise import (
    BucketNorms,
    DataParallelNorms,
    GradNoiseRecorder,
    MeasuredReduceScatter,
    ShardNorms,
)
from paratrain.errors import UsageError
from paratrain.runs import MetricsWriter, write_json
from paratrain.script_client import BATCH_SCHEDULE_ENV

# Rank 0's record of the schedule, which launch puts into summary.json.
STATE_FILE = "batch_schedule.json"


def batch_schedule(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    batch_size: int,
    grad_accum: int = 1,
    samples_per_epoch: int | None = None,
    log_every: int = 10,
) -> ScriptBatchSchedule:
    """The schedule of a script's optimizer steps: `batch_size` samples a rank a micro-step, starting at
    `grad_accum` micro-steps a step; `samples_per_epoch` (all ranks) for warmup's ramp; the noise is read
    every `log_every` steps. Call it after wrapping the model (DDP or fully_shard) and before training."""
    chosen = json.loads(os.environ.get(BATCH_SCHEDULE_ENV, "{}"))
    return ScriptBatchSchedule(model, optimizer, batch_size, grad_accum, samples_per_epoch, log_every, chosen)


class ScriptBatchSchedule:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batch_size: int,
        grad_accum: int,
        samples_per_epoch: int | None,
        log_every: int,
        chosen: dict[str, Any],
    ):
        self.model, self.optimizer, self.log_every = model, optimizer, log_every
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        # how many replicas hold each FSDP shard (HSDP's); None where the noise cannot be read (module docstring)
        self.replicas = _replicas_of_shards(model) if self.sharded else 1
        strategy = "fsdp" if self.sharded else "ddp" if isinstance(model, DistributedDataParallel) else "single"
        if self.world > 1 and strategy == "single":
            raise UsageError(
                f"paratrain.batch_schedule(): the model is neither DistributedDataParallel nor fully_shard-ed, on "
                f"{self.world} ranks; wrap it first, then call batch_schedule"
            )
        kind = chosen.get("kind", "fixed")
        if kind == "warmup" and samples_per_epoch is None:
            raise UsageError(
                "paratrain.batch_schedule(): --batch-schedule warmup ramps over epochs; pass "
                "samples_per_epoch=len(your training set)"
            )
        try:
            self.cfg: TrainConfig = validate(
                TrainConfig,
                {
                    "workers": self.world,
                    "strategy": strategy,
                    "batch_size": batch_size,
                    "grad_accum": grad_accum,
                    "batch_schedule": kind,
                    **({"dp_replicate": self.replicas} if self.replicas and self.replicas > 1 else {}),
                    **{k: v for k, v in chosen.items() if k != "kind"},
                },
            )
        except UsageError as exc:  # the flags it names are launch's, or this call's arguments of the same name
            raise UsageError(f"paratrain.batch_schedule(): {exc}") from None
        self.schedule = BatchSchedule(self.cfg, samples_per_epoch or 0)
        self.lr_factor = self.schedule.lr_factor()
        run_dir = os.environ.get("PARATRAIN_RUN_DIR")
        self.run_dir = Path(run_dir) if run_dir and kind != "fixed" else None
        self.recorder = self._measure_noise(strategy) if kind == "adaptive" else None
        self.events = MetricsWriter(self.run_dir / "metrics.jsonl") if self.run_dir and self.rank == 0 else None
        self.step = 0
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.step_started: float | None = None
        self.inner_s: list[float] = []  # micro-steps that do not synchronise
        self.last_s: list[float] = []  # the synchronising one
        self.step_s: list[float] = []
        self._write_state()

    @property
    def accum(self) -> int:
        """Micro-steps in the optimizer step under way (divide each micro-step's loss by it)."""
        return self.schedule.accum

    @property
    def global_batch(self) -> int:
        return self.schedule.global_batch

    def micro_steps(self) -> Iterator[int]:
        """The indices of this optimizer step's micro-steps; each but the last runs without synchronising."""
        accum, timed = self.accum, self._timed()
        self.step_started = self._now(timed)
        for index in range(accum):
            sync = index == accum - 1
            started = self._now(timed)
            with nullcontext() if sync else self._no_sync():
                yield index
            if timed:
                (self.last_s if sync else self.inner_s).append(self._now(timed) - started)
            if self.recorder is not None:
                batch = self.cfg.batch_size
                self.recorder.micro_step(self.model, index, sync, batch, self.step + 1, batch, accum)

    def step_done(self) -> None:
        """After the optimizer step: warmup's ramp, and at every `log_every` steps adaptive's reading."""
        timed = self._timed()
        if timed and self.step_started is not None:
            self.step_s.append(self._now(timed) - self.step_started)
        self.step += 1
        self._changed(self.schedule.step_done(self.accum))
        if self.step % self.log_every or self.recorder is None:
            return
        measured = self.recorder.flush()
        batches = self.recorder.batches(self.cfg.batch_size, self.accum)
        speedup = self._doubling_speedup if self.step_s else None
        grown = self.schedule.noise_read_of_ranks(
            measured, batches, self.recorder.ranks, self._total, self.world, speedup
        )
        reading = self.schedule.take_reading()
        if reading is not None and self.events is not None:
            self.events.write("noise", step=self.step, **reading)
        self._changed(grown)
        self.inner_s, self.last_s, self.step_s = [], [], []
        self._write_state()

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back at the checkpoint's batch; the optimizer's own state holds the LR it had reached."""
        self.schedule.load_state_dict(state["schedule"])
        self.step = state["step"]
        self.lr_factor = self.schedule.lr_factor()
        self._write_state()

    def _measure_noise(self, strategy: str) -> GradNoiseRecorder:
        """Hooks the norms into the averaging the script's model does (module docstring)."""
        norms: DataParallelNorms | None = None
        if strategy == "ddp":
            norms = BucketNorms()
            try:
                self.model.register_comm_hook(state=None, hook=norms.wrap(default_hooks.allreduce_hook))
            except RuntimeError:
                raise UsageError(
                    "paratrain.batch_schedule(): the DDP model has a comm hook already; adaptive reads the "
                    "gradient noise through its own, so call batch_schedule before register_comm_hook, or drop it"
                ) from None
        elif strategy == "fsdp":
            if self.replicas is None:
                raise UsageError(
                    "paratrain.batch_schedule(): adaptive reads FSDP's gradient noise on a 1-D or HSDP (replicate, "
                    "shard) mesh, not on tensor-parallel pieces; shard over data-parallel dimensions only, or use "
                    "--batch-schedule warmup"
                )
            norms = ShardNorms(replicas=self.replicas)
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    module.set_custom_reduce_scatter(MeasuredReduceScatter(norms))
        averaging = dist.get_backend() if self.world > 1 else None
        assert self.run_dir is not None, "launch sets PARATRAIN_RUN_DIR with the schedule"
        return GradNoiseRecorder(self.cfg, self.rank, self.world, self.run_dir, norms, averaging)

    @contextmanager
    def _no_sync(self) -> Iterator[None]:
        if isinstance(self.model, DistributedDataParallel):
            with self.model.no_sync():
                yield
        elif self.sharded:
            # Each FSDP module, the root or not: a script may leave its root unsharded.
            for module in self.sharded:
                module.set_requires_gradient_sync(False, recurse=False)
            try:
                yield
            finally:
                for module in self.sharded:
                    module.set_requires_gradient_sync(True, recurse=False)
        else:
            yield

    def _timed(self) -> bool:
        """Every step on CPU; on CUDA the step before a log point, whose clock waits for the device."""
        return not self.cuda or self.step % self.log_every == self.log_every - 1

    def _now(self, timed: bool) -> float:
        if timed and self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _doubling_speedup(self, merge: int, accum: int) -> float:
        """The throughput at `accum` micro-steps a step over the throughput now, averaged over the ranks (each
        rank must decide alike): what doubles is the micro-steps, the rest of the step stays."""
        now = self.accum
        micro = statistics.median(self.inner_s or self.last_s)
        rest = max(0.0, statistics.median(self.step_s) - now * micro)
        local = (merge * accum / now) * (now * micro + rest) / (accum * micro + rest)
        return self._total([local])[0] / self.world

    def _total(self, values: list[float]) -> list[float]:
        """The values summed over the ranks."""
        if self.world == 1:
            return values
        # On the group's device, not the model's: FSDP's CPUOffloadPolicy keeps parameters in host memory under NCCL.
        summed = torch.tensor(values, dtype=torch.float64, device=group_device())
        dist.all_reduce(summed)
        return summed.tolist()

    def _changed(self, global_batch: int | None) -> None:
        if global_batch is None:
            return
        factor = self.schedule.lr_factor()
        for group in self.optimizer.param_groups:
            group["lr"] *= factor / self.lr_factor
        self.lr_factor = factor
        if self.events is not None:
            self.events.write("batch", step=self.step, **self.schedule.change_event())
        self._write_state()

    def _write_state(self) -> None:
        if self.run_dir is not None and self.rank == 0:
            write_json(self.run_dir / STATE_FILE, self.schedule.summary())


def _replicas_of_shards(model: nn.Module) -> int | None:
    """How many replicas hold each shard of a fully_shard-ed model: 1 on a 1-D mesh; on HSDP's 2-D mesh, whose
    parameters are Replicate over its first dimension and Shard over its second, the first's size; None for
    any other layout (FSDP over tensor-parallel pieces, whose second placement splits the parameter)."""
    placed = [p for p in model.parameters() if isinstance(p, DTensor)]
    if not placed or placed[0].device_mesh.ndim == 1:
        return 1
    mesh = placed[0].device_mesh
    hsdp = all(
        p.device_mesh.ndim == 2 and isinstance(p.placements[0], Replicate) and isinstance(p.placements[1], Shard)
        for p in placed
    )
    return mesh.size(0) if hsdp else None
