"""Pipeline parallel: the model's layers cut into K stages, one per rank, micro-batches streamed through.

Built on torch.distributed.pipelining (Huang et al. 2019, GPipe; Narayanan et al. 2021, 1F1B and
interleaving): each rank holds its stage(s) as a `PipelineStage` and a schedule runs forward and
backward over the micro-batches, sending activations and gradients between neighbouring stages.
- `--pipeline-schedule gpipe`: all forwards, then all backwards (ScheduleGPipe);
  `1f1b`: one forward, one backward in the steady state, so at most K micro-batches' activations
  are alive (Schedule1F1B); `interleaved`: two stages per rank, loop-style (rank r holds stages r
  and r+K), which shortens the bubble (ScheduleInterleaved1F1B).
- The batch of each step (`--batch-size`) is cut into `--microbatches` M equal micro-batches; each
  micro-batch's loss is its mean and the schedule divides the accumulated gradients by M, so the
  step's gradient is the batch mean, as one process would compute it.
- All stages of a pipeline read the same data shard: the first stage takes the inputs, the last
  the targets; the last stage's outputs give the loss and accuracy the loop records.
- Weights tied across stages (gpt's token embedding is its output projection) are kept tied as
  Megatron-LM keeps them: each stage holding a copy trains it, and after the backward the copies'
  gradients are summed over the ranks that hold them (one all-reduce on a group of those ranks),
  so every copy takes the same step from the same gradient the tied tensor gets in one process.
  Untying them instead would train a different model from `single`'s.
- The bubble is measured, not assumed: each rank stamps the start and end of every forward,
  backward and loss computation its stages run; over one step (the schedule's run of all
  micro-batches and the tied gradients' sum), busy time / step time is how much of the step the rank computed, and
  1 − that is its bubble. Reported as the median over steps per rank, and overall (all ranks'
  busy time over all ranks' step time, median over steps), beside the theory (K−1)/(M+K−1)
  (GPipe and 1F1B; (K−1)/(2M+K−1) for the interleaved schedule's two stages per rank).
  The first step of each micro-batch shape is left out: it infers the stages' shapes.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext, device_mesh, host_group, new_group
from paratrain.engine.strategies.base import OptimizerFactory, StepResult, WholeModelStrategy
from paratrain.engine.strategies.meta_init import FullSizeCopies, build_on_meta
from paratrain.engine.strategies.pipeline_split import (
    StageModule,
    Unit,
    balanced_starts,
    measure_unit_seconds,
    model_units,
    named_starts,
    stage_slots,
    tied_parameter_names,
    units_holding,
)
from paratrain.engine.strategies.tensor import local_result, loss_context, model_plan, split_by_plan

log = logging.getLogger("paratrain.rank")

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


class BusyClock:
    """Busy spans of this rank's stages within the current step, and (busy, step) seconds per finished step: kept
    as the clock's stamps until `resolve` (CUDA events are resolved at the loop's log points, engine/timing.py)."""

    def __init__(self, stamp: Callable[[], Any]):
        self.stamp = stamp
        self.spans: list[tuple[Any, Any]] = []
        self.pending: list[tuple[Any, Any, list[tuple[Any, Any]]]] = []
        self.seconds: list[tuple[float, float]] = []

    def timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = self.stamp()
        try:
            return fn(*args, **kwargs)
        finally:
            self.spans.append((start, self.stamp()))

    def step_done(self, start: Any, end: Any, keep: bool) -> None:
        if keep:
            self.pending.append((start, end, self.spans))
        self.spans = []

    def resolve(self) -> None:
        """The finished steps' stamps turned into seconds, and the stamps (CUDA events) let go."""
        if self.pending and not isinstance(self.pending[0][0], float):
            torch.cuda.synchronize()
        for start, end, spans in self.pending:
            self.seconds.append((sum(_seconds(a, b) for a, b in spans), _seconds(start, end)))
        self.pending.clear()

    def busy_and_step_seconds(self) -> list[tuple[float, float]]:
        self.resolve()
        return self.seconds


def _seconds(start: Any, end: Any) -> float:
    return end - start if isinstance(start, float) else start.elapsed_time(end) / 1000.0


class TimedStage(PipelineStage):
    """A PipelineStage that stamps the compute it does for the schedule (forward, backward, weight gradients)."""

    def __init__(self, *args: Any, busy: BusyClock, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.busy = busy

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self.busy.timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self.busy.timed(super().backward_one_chunk, *args, **kwargs)

    def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self.busy.timed(super().backward_weight_one_chunk, *args, **kwargs)

    def _compute_outputs(self, *args: Any, module: nn.Module, **kwargs: Any) -> Any:
        # The shape-inference forward of the first step calls the module directly. Under DDP (hybrid)
        # that forward would arm DDP's gradient hooks for a backward that never comes, and the next
        # backward would record every parameter twice (a reducer assertion at step 2). Micro-batch
        # forwards run under no_sync too (stage.py, forward_maybe_with_nosync).
        if isinstance(module, DistributedDataParallel):
            with module.no_sync():
                return module(*args, **kwargs)
        return module(*args, **kwargs)


class StageModules(nn.Module):
    """This rank's stages (one, or two with the interleaved schedule), as the loop's model.

    Its own state_dict would prefix `stages.<i>.`; checkpoints use each stage's, keyed as the whole model's."""

    def __init__(self, stages: list[nn.Module]):
        super().__init__()
        self.stages = nn.ModuleList(stages)


class PipelineParallel(WholeModelStrategy):
    name = "pipeline"
    allreduce: str | None = None

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        self.pp = cfg.pipeline_stages
        self.dp = cfg.data_parallel_size
        self.schedule_name = cfg.pipeline_schedule
        self.microbatches = cfg.microbatches
        self.slots = stage_slots(cfg)
        # Ranks laid out (replicas, shards, pp, tp), row-major: the T ranks splitting a stage's layers are
        # consecutive, then the K stages of one pipeline; hybrid's D = replicas x shards pipelines read D data
        # shards (shards: 1 unless its stages are sharded; tp: 1 unless their layers are split).
        self.shards, self.tp = cfg.dp_shard or 1, cfg.tp
        shape = (self.dp // self.shards, self.shards, self.pp, self.tp)
        self.mesh = device_mesh(ctx, shape, ("dp_replicate", "dp_shard", "pp", "tp"), cfg.seed)
        self.dp_rank = self.mesh.get_local_rank("dp_replicate") * self.shards + self.mesh.get_local_rank("dp_shard")
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.tp_rank = self.mesh.get_local_rank("tp")
        if self.tp > 1:
            self.allreduce = f"all-reduce in each split layer pair ({dist.get_backend()})"
        self.pp_group = self.mesh.get_group("pp")
        # Checkpoints gather each stage's state as pickled bytes: over a host (gloo) group, never
        # NCCL, whose object gather would hold world size x the largest stage's state on rank 0's GPU.
        self.object_group = host_group(ctx) if ctx.distributed else None
        self.busy = BusyClock(stamp)
        self.schedules: dict[tuple[bool, int], tuple[Any, int]] = {}  # (train, batch size) -> (schedule, M)
        self.shaped: set[int] = set()  # batch sizes whose training schedule has inferred the stages' shapes
        self.local_slots = [s for s in range(self.slots) if s % self.pp == self.pp_rank]
        self.layout: dict[str, Any] = {}
        self.copies = FullSizeCopies()  # build's, for wrap to materialise

    def data_shard(self) -> tuple[int, int]:
        return self.dp_rank, self.dp

    # -- building the stages ------------------------------------------------------------------

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """On the meta device: `wrap` cuts it into stages, splits and shards this rank's, and materialises only
        those (engine/strategies/meta_init.py), so no rank holds more than its stages. Built whole where that
        would change the initial weights (an init_weights() over the whole model, which a stage cannot run)."""
        model = build_on_meta(make, super().build, piecewise_init=False)
        self.copies = FullSizeCopies(model)
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        # A model that does not declare its units may need its forward graph read, on inputs like the batches'.
        chained = callable(getattr(model, "pipeline_units", None)) or isinstance(model, nn.Sequential)
        example = None if chained else self._sample_microbatch().to(next(model.parameters()).device)
        units = model_units(model, example)
        starts, split_by, seconds = self._plan(model, units)
        bounds = list(zip(starts, [*starts[1:], len(units)]))
        self.layout = {
            "stages": self.pp,
            "stage_slots": self.slots,
            "dp": self.dp,
            **({"dp_shard": self.shards} if self.shards > 1 else {}),
            **({"tp": self.tp} if self.tp > 1 else {}),
            "schedule": self.schedule_name,
            "microbatches": self.microbatches,
            "split_by": split_by,
            "split": [[u.name for u in units[a:b]] for a, b in bounds],
            **({"unit_seconds": dict(zip((u.name for u in units), seconds))} if seconds else {}),
        }
        log.info("pipeline split (%s): %s", split_by, " | ".join(",".join(s) for s in self.layout["split"]))
        # The whole model's tensor-parallel plan, for its stages (which declare none).
        self.tp_plan = model_plan(model, self.cfg) if self.tp > 1 else None
        self.stage_modules = [StageModule(model, units[bounds[s][0] : bounds[s][1]]) for s in self.local_slots]
        for module in self.stage_modules:
            self._partition(module)
        self.copies.materialise(self.stage_modules, self.ctx.device, self.cfg.seed)
        stages = StageModules([self._replicate(m) for m in self.stage_modules])
        # After replicating: sharding replaces the stages' parameters, and the ties hold the ones that train.
        self._tie_weights(model, units, bounds)
        return stages

    def _plan(self, model: nn.Module, units: list[Unit]) -> tuple[list[int], str, list[float]]:
        """Where the stages start. Chosen on rank 0 and broadcast: measured times differ between ranks
        and every rank must cut the same way."""
        if self.cfg.split != "auto":
            return named_starts(units, self.cfg.split, self.slots), "--split", []
        plan: list[Any] = [None]
        if self.ctx.is_main:
            try:
                seconds = measure_unit_seconds(model, units, self._sample_microbatch())
                plan[0] = (balanced_starts(seconds, self.slots), "measured forward+backward time", seconds)
            except (RuntimeError, MemoryError) as exc:  # out of memory: a unit does not run here
                log.warning("could not time the blocks (%s); balancing the stages by parameters", exc)
                counts = [
                    float(sum(p.numel() for path in u.modules for p in model.get_submodule(path).parameters()))
                    for u in units
                ]
                plan[0] = (balanced_starts(counts, self.slots), "parameters", [])
        if self.ctx.distributed:
            dist.broadcast_object_list(plan, src=0)
        return plan[0]

    def _sample_microbatch(self) -> torch.Tensor:
        """One micro-batch of held-out inputs, to time the blocks on."""
        from paratrain.engine.data import BatchPreparer, eval_batches
        from paratrain.workloads import load_data

        one = RankContext(rank=0, world_size=1, local_rank=0, device=self.ctx.device)
        size = max(1, self.cfg.batch_size // self.microbatches)
        x, _ = next(eval_batches(load_data(self.cfg).test, one, size, BatchPreparer(self.cfg.image_size)))
        return x

    def _tie_weights(self, model: nn.Module, units: list[Unit], bounds: list[tuple[int, int]]) -> None:
        """Groups of ranks (one per pipeline) that sum the gradients of a tied weight's copies."""
        self.ties: list[tuple[list[nn.Parameter], dist.ProcessGroup | None]] = []
        slot_of_unit = {u: s for s, (a, b) in enumerate(bounds) for u in range(a, b)}
        for names in tied_parameter_names(model):
            holders = sorted({slot_of_unit[u] % self.pp for n in names for u in units_holding(n, units)})
            group = None
            if len(holders) > 1:
                # Every rank creates every group, in the same order, as new_group requires.
                by_pipeline = self.mesh.mesh.reshape(self.dp, self.pp, self.tp)
                for d in range(self.dp):
                    for t in range(self.tp):
                        ranks = [int(by_pipeline[d, r, t]) for r in holders]
                        created = new_group(self.ctx, ranks)
                        if (d, t) == (self.dp_rank, self.tp_rank):
                            group = created
            copies: dict[int, nn.Parameter] = {}
            for module in self.stage_modules:
                for name, p in module.named_parameters(remove_duplicate=False):
                    if name in names:
                        copies[id(p)] = p
            if copies and (group is not None or len(copies) > 1):
                self.ties.append((list(copies.values()), group if self.pp_rank in holders else None))

    def _partition(self, module: nn.Module) -> None:
        """A stage's layers split over the tensor-parallel ranks (--tp), in place, on the meta device where the
        model was built there; sharded too in `hybrid` with --dp-shard."""
        if self.tp_plan is not None:
            split_by_plan(module, self.mesh["tp"], self.tp_plan)

    def _replicate(self, module: nn.Module) -> nn.Module:
        """A materialised stage as it trains: as it is; data-parallel replicas of it in `hybrid`."""
        return module

    def build_optimizer(self, model: nn.Module, make: OptimizerFactory) -> torch.optim.Optimizer:
        return make(self.unwrap(model))

    def unwrap(self, model: nn.Module) -> nn.Module:
        return StageModules(self.stage_modules)

    # -- one step ------------------------------------------------------------------------------

    def _microbatches_for(self, n: int) -> int:
        """M for a full batch; for a smaller last batch the largest count up to M that cuts it evenly
        (and that the interleaved schedule accepts), so every micro-batch has the same size."""
        for m in range(min(self.microbatches, n), 0, -1):
            rounds = max(1, m // self.pp)
            if n % m == 0 and (self.schedule_name != "interleaved" or m % rounds == 0):
                return m
        return 1

    def _schedule(self, model: nn.Module, objective: Any, n: int, train: bool) -> tuple[Any, int]:
        """One schedule per (train or eval, batch size): a PipelineStage sizes its buffers on its first batch."""
        key = (train, n)
        if key not in self.schedules:
            stages = [
                TimedStage(module, slot, self.slots, self.ctx.device, group=self.pp_group, busy=self.busy)
                for module, slot in zip(model.stages, self.local_slots)
            ]

            def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return self.busy.timed(objective.loss_of, out, y)

            m = self._microbatches_for(n)
            if self.schedule_name == "interleaved":
                schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
            else:
                # Forward-only, 1F1B is GPipe; and 1F1B needs M >= K, which a short last batch may not give.
                kind = SCHEDULES[self.schedule_name] if train and m >= self.pp else ScheduleGPipe
                schedule = kind(stages[0], m, loss_fn=loss_fn)
            self.schedules[key] = (schedule, m)
        return self.schedules[key]

    @property
    def _first(self) -> bool:
        return 0 in self.local_slots

    @property
    def _last(self) -> bool:
        return self.slots - 1 in self.local_slots

    @property
    def _reports(self) -> bool:
        """The last stage's loss, from the first of the ranks splitting it (each computed the same; the loop sums
        them over the ranks)."""
        return self._last and self.tp_rank == 0

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
        schedule, m = self._schedule(model, objective, len(y), train=True)
        losses: list[torch.Tensor] = []
        start = self.stamp()
        with autocast(), loss_context(self.cfg):
            out = schedule.step(
                *((x,) if self._first else ()), target=objective.labels(x, y) if self._last else None, losses=losses
            )
        # Inside the step: a rank that finished its backward early waits here for the other end of
        # the pipeline, and that wait is bubble (left outside, it would hide behind the next step).
        self._sum_tied_gradients()
        end = self.stamp()
        # The first step of a schedule infers the stages' shapes; steps of a short last batch run fewer micro-batches.
        self.busy.step_done(start, end, keep=len(y) in self.shaped and m == self.microbatches)
        self.shaped.add(len(y))
        return self._reported(losses, out)

    def _reported(self, losses: list[torch.Tensor], out: Any) -> StepResult:
        """The last stage's mean loss and output, on the first of its tensor-parallel ranks (all of them help
        reduce logits split by --loss-parallel to the classes they predict)."""
        if not self._last:
            return None, None
        loss, out = local_result(torch.stack([local_result(loss, None)[0] for loss in losses]).mean().detach(), out)
        return (loss, out) if self._reports else (None, None)

    def _sum_tied_gradients(self) -> None:
        """In place, into each copy's gradient: a sharded stage's gradients are views of FSDP's reduce-scatter
        output, which a new tensor would leave held beside the sum. Sharded stages (hybrid with --dp-shard) hold a
        tied weight's copies sharded alike over their replicas: each rank sums its own shards of them."""
        for copies, group in self.ties:
            for p in copies:
                # a weight split by vocabulary (--loss-parallel) may get its gradient laid out otherwise (an
                # embedding's is replicated): laid out as the weight, each rank sums its own piece
                if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
            grads = [_local(p.grad) for p in copies if p.grad is not None]
            if len(grads) == 1:
                total = grads[0]
            else:
                total = torch.stack(grads).sum(0) if grads else torch.zeros_like(_local(copies[0]))
            if group is not None:
                dist.all_reduce(total, group=group)
            for p in copies:
                if p.grad is None:
                    mine = total.clone()
                    p.grad = DTensor.from_local(mine, p.device_mesh, p.placements) if isinstance(p, DTensor) else mine
                elif _local(p.grad) is not total:
                    _local(p.grad).copy_(total)

    def resolve_timings(self) -> None:
        self.busy.resolve()

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        objective: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        autocast: Callable[[], AbstractContextManager],
    ) -> StepResult:
        schedule, _ = self._schedule(model, objective, len(y), train=False)
        losses: list[torch.Tensor] = []
        with autocast(), loss_context(self.cfg):
            out = schedule.eval(
                *((x,) if self._first else ()), target=objective.labels(x, y) if self._last else None, losses=losses
            )
        self.busy.spans = []  # evaluation is not part of any training step's busy time
        return self._reported(losses, out)

    # -- checkpoints: gathered on rank 0, keyed by the whole model's names ----------------------

    def _parameter_names(self) -> dict[int, str]:
        return {id(p): name for module in self.stage_modules for name, p in module.named_parameters()}

    def checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        mine = None
        # Data-parallel replicas hold the same state: one pipeline's is enough. Sharded stages gather their
        # shards whole first, which every rank holding a shard takes part in.
        if self.dp_rank == 0 or self.shards > 1 or self.tp > 1:
            names = self._parameter_names()
            order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
            state = optimizer.state_dict()["state"]
            # DTensor warns (on the launcher's terminal) that gathering a tensor split one way and sharded
            # another takes two all-gathers; for a checkpoint that is what it takes.
            redistribute = logging.getLogger("torch.distributed.tensor._redistribute")
            level = redistribute.level
            redistribute.setLevel(logging.ERROR)
            try:
                whole = {
                    "model": _to_cpu({k: v for module in self.stage_modules for k, v in module.state_dict().items()}),
                    "optimizer": _to_cpu({order[i]: s for i, s in state.items()}),
                }
            finally:
                redistribute.setLevel(level)
            mine = whole if self.dp_rank == 0 and self.tp_rank == 0 else None
        gathered: list[Any] | None = [None] * self.ctx.world_size if self.ctx.is_main else None
        if self.ctx.distributed:
            dist.gather_object(mine, gathered, dst=0, group=self.object_group)
        else:
            gathered = [mine]
        if not self.ctx.is_main:
            return None
        model_state: dict[str, Any] = {}
        optimizer_state: dict[str, Any] = {}
        for part in gathered:
            if part is not None:
                model_state.update(part["model"])
                optimizer_state.update(part["optimizer"])
        # "model" loads into the whole model (a single process can evaluate it); the optimizer's
        # state is keyed by parameter name, so it finds its parameters whatever the split.
        return {"model": model_state, "optimizer": {"state_by_name": optimizer_state}, "pipeline": self.layout}

    def load_checkpoint_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Every rank has the whole state; sharded stages keep their shards of it."""
        for module in self.stage_modules:
            module.load_state_dict({k: _like(state["model"][k], v) for k, v in module.state_dict().items()})
        params = [p for group in optimizer.param_groups for p in group["params"]]
        names = self._parameter_names()
        saved = state["optimizer"]["state_by_name"]
        optimizer.load_state_dict(
            {
                "state": {
                    i: {key: _like(value, p) for key, value in saved[names[id(p)]].items()}
                    for i, p in enumerate(params)
                    if names[id(p)] in saved
                },
                "param_groups": optimizer.state_dict()["param_groups"],
            }
        )

    # -- the bubble ------------------------------------------------------------------------------

    def theory(self) -> float:
        k, m = self.pp, self.microbatches
        chunks = m * (self.slots // self.pp)
        return (k - 1) / (chunks + k - 1)

    def summary_fields(self) -> dict[str, Any]:
        per_rank = self.ctx.gather_objects(self.busy.busy_and_step_seconds())
        steps = min(len(r) for r in per_rank)
        measured = None
        by_rank: list[float | None] = [None] * len(per_rank)
        if steps:
            by_rank = [statistics.median(1 - busy / span for busy, span in r[:steps]) for r in per_rank]
            measured = statistics.median(
                1 - sum(r[i][0] for r in per_rank) / sum(r[i][1] for r in per_rank) for i in range(steps)
            )
        return {
            "pipeline": {**self.layout, "timed_steps": steps},
            "bubble_fraction": measured,
            "bubble_fraction_per_rank": by_rank,
            "bubble_fraction_theory": self.theory(),
        }


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _like(value: Any, reference: Any) -> Any:
    """A whole tensor as `reference` holds it: this rank's shard where it is a sharded DTensor of that shape (its
    parameter, or a parameter's optimizer state), else unchanged."""
    if isinstance(reference, DTensor) and isinstance(value, torch.Tensor) and value.shape == reference.shape:
        return distribute_tensor(
            value.to(reference.device), reference.device_mesh, reference.placements, src_data_rank=None
        )
    return value


def _to_cpu(tree: Any) -> Any:
    """On the host, sharded tensors gathered whole (a collective over their mesh: every rank holding one calls it)."""
    if isinstance(tree, DTensor):
        return tree.full_tensor().detach().cpu()
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_cpu(v) for v in tree)
    return tree
