"""One rank's training run: build everything, then one loop for every strategy.

The launcher starts this module's `run_rank` once per rank. Everything a rank needs arrives as
plain data (the resolved config, the placement, the run directory), so the same entry point
serves torchrun-style launches, a notebook's spawned ranks and a single process.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.augment import BatchAugment
from paratrain.engine.batch_schedule import BatchSchedule, Speedup, largest_merge
from paratrain.engine.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from paratrain.engine.data import Batch, BatchPreparer, eval_batches, training_batches
from paratrain.engine.distributed import Placement, RankContext, bound_collectives, init_rank, shutdown
from paratrain.engine.flops import FlopCount, count_flops, cpu_peak, gpu_peak, mfu
from paratrain.engine.grad_noise import GradNoiseRecorder
from paratrain.engine.lr import LRSchedule, scaled_lr
from paratrain.engine.memory import (
    MemoryMeter,
    is_out_of_memory,
    limit_rank_memory,
    peak_memory_bytes,
    per_rank,
    release_cached_memory,
    reset_peak_memory,
)
from paratrain.engine.optim import build_optimizer
from paratrain.engine.progress import EpochProgress
from paratrain.engine.strategies import Strategy, build_strategy
from paratrain.engine.timing import Clock, StepBreakdown
from paratrain.errors import TrainingDiverged
from paratrain.forkserver import apply_environ_changes
from paratrain.runs import MetricsWriter, RunDir, steady_epoch_time, steady_epochs
from paratrain.workloads import build_model, load_data
from paratrain.workloads.datasets import default_cache_dir
from paratrain.workloads.models import checkpoint_blocks
from paratrain.workloads.objective import build_objective
from paratrain.workloads.samples import joined, rows
from paratrain.workloads.text import TokenStream

log = logging.getLogger("paratrain.rank")


def run_rank(
    config: dict[str, Any], placement: dict[str, Any], run_dir: str, environ: dict[str, str | None] | None = None
) -> dict[str, Any] | None:
    """Entry point of one rank; returns the run summary on rank 0 and None elsewhere.

    `environ`: changes to this process's environment, applied first (None: remove the variable). A
    rank forked from the CLI's fork server has the environment the server started with, and the
    launcher's may have changed since (paratrain/forkserver.py).
    """
    apply_environ_changes(environ or {})
    cfg = TrainConfig.model_validate(config)
    if cfg.memory_limit is not None:
        limit_rank_memory(cfg.memory_limit_bytes)  # launch runs such ranks in processes of their own
    ctx = init_rank(Placement(**placement))
    run = RunDir(Path(run_dir))
    handler = _log_to_file(run.rank_log(ctx.rank), ctx)
    activity = Activity()
    try:
        return Trainer(cfg, ctx, run, activity).fit()
    except BaseException as exc:
        log.exception("rank %d failed %s", ctx.rank, activity)
        failure = _explained(exc, cfg, ctx, activity)
        _record_now(failure)
        if failure is exc:
            raise
        raise failure from None
    finally:
        # The Trainer (its DDP model among it) sits in reference cycles, freed only by the collector:
        # free it now, before its process group goes, or torch 2.13 can abort at exit (SIGABRT).
        gc.collect()
        shutdown()
        release_cached_memory(ctx.device)
        logging.getLogger("paratrain").removeHandler(handler)
        handler.close()


def _explained(exc: BaseException, cfg: TrainConfig, ctx: RankContext, activity: Activity) -> BaseException:
    """What the user is told for `exc`: a memory limit or a lost peer in one sentence, else `exc` itself."""
    if cfg.memory_limit is not None and is_out_of_memory(exc):
        return MemoryLimitExceeded(
            f"rank {ctx.rank} needs more memory than --memory-limit {cfg.memory_limit} allows; shard the model "
            "over the ranks with --strategy fsdp (or split it with --strategy pipeline), or raise --memory-limit"
        )
    if ctx.distributed and _is_collective_failure(exc):
        # torch's text, without the source locations and wrappers it adds around gloo's message.
        reason = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ?", "", " ".join(str(exc).split())).split(" At: ")[0]
        reason = reason.rpartition("RuntimeError: ")[2] or type(exc).__name__
        return CollectiveFailed(
            f"rank {ctx.rank} stopped {activity}: a peer stopped answering or went away "
            f"(--timeout {cfg.timeout:g} s): {reason}"
        )
    return exc


def _record_now(failure: BaseException) -> None:
    """Write the rank's error.json now, before its teardown (gc, destroy_process_group: seconds when a
    peer is gone). When another rank ends first, the agent terminates this one, maybe mid-teardown;
    the launcher then still finds this rank's failure (launch/local.py: root_failure). torch's @record
    writes the file again, the same, when the exception leaves the process."""
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):  # only under the elastic agent
        from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

        ErrorHandler().record_exception(failure)


# A rank log's line: "2026-11-26 01:21:26,457 rank0 ERROR rank 0 failed in step 9 ...".
_FAILED_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank\d+ ERROR rank \d+ failed ")


def logged_failure_time(path: Path) -> float | None:
    """When the rank of log `path` last logged its failure (unix time), caught before its teardown
    (gc, destroy_process_group: seconds when a peer is gone); None without such a line."""
    from datetime import datetime

    times = [m[1] for line in _lines(path) if (m := _FAILED_LINE.match(line))]
    return datetime.strptime(times[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if times else None


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _log_to_file(path: Path, ctx: RankContext) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{ctx.rank} %(levelname)s %(message)s"))
    logging.getLogger("paratrain").addHandler(handler)
    logging.getLogger("paratrain").setLevel(logging.INFO)
    if not ctx.is_main:
        # Other ranks' stdout/stderr (including warnings from C++) go to their log, not the terminal.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    return handler


class CollectiveFailed(RuntimeError):
    """A collective failed or timed out because a peer died, hung or was cut off."""


# What torch's backends raise when a peer is gone: gloo's timeouts and closed connections, NCCL's
# watchdog; the shared-memory average raises TimeoutError itself.
_COLLECTIVE_ERROR = re.compile(r"gloo|nccl|timed out|timeout|connection (closed|reset)|broken pipe", re.IGNORECASE)


def _is_collective_failure(exc: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(exc, (TimeoutError, dist.DistError)) or (
        isinstance(exc, RuntimeError) and bool(_COLLECTIVE_ERROR.search(str(exc)))
    )


@dataclass
class Activity:
    """What the rank is doing, kept up to date by the Trainer, so that a collective that fails
    (a peer died or hangs) ends with an error saying where the run was."""

    phase: str = "setting up (joining the other ranks, building and wrapping the model)"
    epoch: int | None = None
    step: int | None = None  # the optimizer step under way (1-based)

    def __str__(self) -> str:
        if self.phase == "training":
            return f"in step {self.step} (epoch {self.epoch + 1}, training: forward, backward, averaging the gradients)"
        return f"while {self.phase}"

    @contextmanager
    def doing(self, phase: str) -> Iterator[None]:
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before


class MemoryLimitExceeded(RuntimeError):
    """An allocation failed under --memory-limit: the run's model, gradients, optimizer state and
    activations do not fit the limit on this rank."""


@dataclass
class EpochTally:
    """An epoch so far. Sums of loss·n, correct predictions and n over the ranks that see the loss
    (every rank, or the last stage of each pipeline) stay on the device and are read at log points
    only: `interval` since the last one, `totals` before it."""

    totals: torch.Tensor
    interval: torch.Tensor
    samples: int  # training samples counted at log points so far, all ranks
    interval_start: float  # perf_counter at the last log point
    started: float  # perf_counter at the epoch's start (earlier, for an epoch resumed in its middle)
    time_start: float  # the epoch's start on the run's clock (metrics' `time`)

    @classmethod
    def zeros(cls, device: torch.device, now: float, time_start: float) -> EpochTally:
        sums = [torch.zeros(3, dtype=torch.float64, device=device) for _ in range(2)]
        return cls(*sums, samples=0, interval_start=now, started=now, time_start=time_start)

    def add(self, loss: torch.Tensor, correct: torch.Tensor, n: int) -> None:
        self.interval[0].add_(loss, alpha=n)
        self.interval[1].add_(correct)
        self.interval[2] += n  # a Python number: no host-to-device copy

    def next_interval(self, now: float) -> None:
        self.totals += self.interval
        self.interval.zero_()
        self.interval_start = now

    def position(self, epoch: int, micro: int) -> dict[str, Any]:
        """Where a checkpoint taken now leaves the epoch: resumed, it goes on from `micro`."""
        return {
            "epoch": epoch,
            "micro": micro,
            "epoch_samples": self.samples,
            "epoch_elapsed_s": time.perf_counter() - self.started,
            "time_start": self.time_start,
        }

    def partial(self) -> dict[str, list[float]]:
        """This rank's sums so far, saved with a checkpoint taken in the epoch's middle: plain numbers, for the
        object gather that collects them (a GPU tensor would unpickle onto its sender's GPU on every rank)."""
        return {"totals": self.totals.tolist(), "interval": self.interval.tolist()}

    def resume(self, partial: dict[str, Any]) -> None:
        """The sums of `partial` (checkpoints before these were plain numbers held them as tensors: either loads)."""
        self.totals.copy_(torch.as_tensor(partial["totals"], dtype=torch.float64))
        self.interval.copy_(torch.as_tensor(partial["interval"], dtype=torch.float64))


@dataclass
class RunState:
    """Where the run is; all of it goes into the checkpoint."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    samples: int = 0  # training samples processed, all ranks
    elapsed_s: float = 0.0  # training wall time before this launch (resumed runs)
    epochs_done: list[dict[str, Any]] = field(default_factory=list)
    position: dict[str, Any] | None = None  # a checkpoint taken mid-epoch (--checkpoint-every Nsteps): where in it


class Trainer:
    def __init__(self, cfg: TrainConfig, ctx: RankContext, run: RunDir, activity: Activity | None = None):
        self.cfg, self.ctx, self.run = cfg, ctx, run
        self.activity = activity or Activity()
        self.started = time.perf_counter()
        reset_peak_memory(ctx.device)
        self.data = load_data(cfg)
        self.clock = Clock(ctx.device)
        self.breakdown = StepBreakdown(self.clock)
        self.strategy: Strategy = build_strategy(cfg, ctx, self.clock.stamp)
        # The data shard this rank reads: its own as a data-parallel replica; the stages of one
        # pipeline read the same one (the first stage takes its inputs, the last its targets).
        shard, shards = self.strategy.data_shard()
        self.data_ctx = replace(ctx, rank=shard, world_size=shards)

        self._build_model()

        augment = BatchAugment(cfg.augment, seed=cfg.seed * 1000 + ctx.rank, device=ctx.device) if cfg.augment else None
        self.augment = augment
        self.prepare = BatchPreparer(cfg.image_size, augment)
        # Loaded at the largest per-rank batch --batch-schedule may reach, cut into forwards of the one it has
        # reached (_forwards): the same samples in the same order at any per-rank batch, loaded at its best rate.
        self.batches = training_batches(
            self.data.train,
            cfg.batch_size * largest_merge(cfg),
            self.data_ctx,
            cfg.seed,
            self.prepare,
            cfg.loader_workers,
        )
        # An epoch's forwards of --batch-size: the unit of the accumulation, the schedules and checkpoint positions.
        self.micro_steps = -(-self.batches.per_rank // cfg.batch_size)
        self.steps_per_epoch = -(-self.micro_steps // cfg.grad_accum)
        self.schedule = lr_schedule(cfg, self.steps_per_epoch)
        self.batch_schedule = BatchSchedule(cfg, self.micro_steps * cfg.global_batch_size // cfg.grad_accum)
        self.grad_noise = (
            GradNoiseRecorder(
                cfg, ctx.rank, cfg.data_parallel_size, run.path, self.strategy.grad_norms, self.strategy.allreduce
            )
            if cfg.measures_grad_noise
            else None
        )

        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.autocast = (lambda: torch.autocast(ctx.device.type, dtype=half)) if half else nullcontext
        # Loss scaling guards fp16 gradients against underflow on GPUs; bf16 and fp32 need none.
        self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.precision == "fp16" and ctx.device.type == "cuda")

        self.state = RunState()
        # The elastic agents restart every rank after one dies (--max-restarts). A run that is not a
        # --resume starts in an empty directory, so events or a checkpoint found there were written
        # by this run before the restart: it resumes from the checkpoint by itself (or starts over
        # if there is none yet). Rank 0 decides; an agent restarting for another node's sake does
        # not count the restart (TORCHELASTIC_RESTART_COUNT), so that cannot tell.
        restartable = cfg.max_restarts > 0 and not cfg.resume
        self.restarts = self._earlier_restarts() + 1 if restartable and ctx.is_main and run.metrics.exists() else 0
        self.resumed_from_step: int | None = None
        self._partial: dict[str, Any] | None = None  # this rank's sums of a checkpointed partial epoch
        self.timings = DoublingTimings()
        if cfg.resume or restartable:
            self._restore()
        self.memory = MemoryMeter(
            self.state.step,
            self.steps_per_epoch * cfg.epochs,
            self.steps_per_epoch,
            epochs_end_full=self.batches.per_rank % (cfg.batch_size * cfg.grad_accum) == 0,
        )
        self.sinks = self._sinks() if ctx.is_main else []

    def _build_model(self) -> None:
        """The model, its objective and its optimizer, parallelised in torchtitan's order."""
        cfg = self.cfg
        # The peak memory counts from the start of this run (reset above): built whole, the model is
        # in it; built on meta and sharded (fsdp), only this rank's shards ever were.
        module = self.strategy.build(lambda: build_model(cfg, self.data))
        self.objective = build_objective(cfg.loss, module)
        # torchtitan's order: the layers split (tensor parallelism), then checkpointed, then wrapped.
        self.strategy.split(module)
        if cfg.checkpoint_activations:
            checkpoint_blocks(module, cfg.checkpoint_activations_every, cfg.checkpoint_activations_ops)
        self.model = self.strategy.wrap(module)
        # Built after wrapping: FSDP's parameters are shards, a pipeline stage has only its layers.
        self.optimizer = self.strategy.build_optimizer(
            self.model,
            lambda m: build_optimizer(
                cfg.optimizer, m, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
            ),
        )
        if cfg.compile:
            self.model = torch.compile(self.model)

    def _sinks(self) -> list[Any]:
        """Where rank 0 records events: metrics.jsonl always (a resumed or restarted run's rewound to
        its checkpoint's step), TensorBoard when asked."""
        rewind = self.cfg.resume or self.restarts > 0
        sinks: list[Any] = [MetricsWriter(self.run.metrics, keep_until_step=self.state.step if rewind else None)]
        if self.cfg.tensorboard is not None:
            from paratrain.runs.tensorboard import TensorBoardSink

            sinks.append(TensorBoardSink(self.cfg.tensorboard))
        return sinks

    # -- the loop --------------------------------------------------------------------------

    def fit(self) -> dict[str, Any] | None:
        cfg, ctx = self.cfg, self.ctx
        progress = EpochProgress(
            ctx.is_main and not cfg.quiet and sys.stderr.isatty(), cfg.epochs, self.steps_per_epoch
        )
        log.info(
            "training %s with %s on %d rank(s), %d steps/epoch",
            cfg.workload,
            cfg.strategy_name,
            ctx.world_size,
            self.steps_per_epoch,
        )
        # Wall-clock start of training, for launch overhead (time from launch to the first step).
        # `time` is on the clock of the step events, so a step's Unix time is unix_time + (its time - this time).
        self._event(
            "start",
            step=self.state.step,
            unix_time=time.time(),
            time=self.state.elapsed_s + time.perf_counter() - self.started,
            **({"restart": self.restarts} if self.restarts else {}),
        )
        bound_collectives(cfg.timeout)
        self.first_step = self.state.step  # bytes sent are counted from here (a resumed run's launch)
        self.checked_step = self.state.step  # the loss was last seen finite after this step
        try:
            for epoch in range(self.state.epoch, cfg.epochs):
                progress.start_epoch(epoch)
                record = self.train_epoch(epoch, progress)
                progress.end_epoch()
                record["evals"] = self.evaluate(epoch)
                self.state.epochs_done.append(record)
                self.state.epoch = epoch + 1
                if cfg.checkpoint_every_epochs and self.state.epoch % cfg.checkpoint_every_epochs == 0:
                    self._save()
                if self._steps_done():
                    break
                if cfg.early_stop and epoch - self._best_epoch() >= cfg.early_stop:
                    log.info(
                        "early stop after epoch %d: no better validation loss for %d epochs", epoch + 1, cfg.early_stop
                    )
                    break
        except TrainingDiverged as exc:
            log.error("%s", exc)
            return self._diverged_summary(str(exc))
        finally:
            progress.close()
            for sink in self.sinks:
                sink.close()
        return self._summary()

    def train_epoch(self, epoch: int, progress: EpochProgress) -> dict[str, Any]:
        cfg, model, clock, breakdown = self.cfg, self.model, self.clock, self.breakdown
        model.train()
        breakdown.reset()
        tally, first_micro = self._begin_epoch(epoch)
        self.activity.phase, self.activity.epoch, self.activity.step = "training", epoch, self.state.step + 1

        step_start = data_start = clock.stamp()
        # Micro-steps of the optimizer step under way, of `forwards` (--batch-schedule may raise it between steps).
        in_step, forwards = 0, self._step_forwards(first_micro)
        for micro, (x, y) in self._forwards(epoch, first_micro):
            data_ready = clock.stamp()
            sync = in_step + 1 == forwards
            # All micro-steps but the last accumulate locally: DDP skips the all-reduce in no_sync.
            with nullcontext() if sync else self.strategy.no_sync(model), self.memory.watch(self.state.step):
                loss, out = self.strategy.forward_backward(
                    model, self.objective, x, y, forwards, self.scaler, self.autocast
                )
            backward_end = clock.stamp()
            if self.grad_noise is not None:
                # The schedule's accumulation, not this step's forwards: an epoch's last step of fewer is not recorded.
                batches = self.batch_schedule
                self.grad_noise.micro_step(
                    model, in_step, sync, len(y), self.state.step + 1, batches.per_rank_batch, batches.accum
                )
            in_step += 1
            breakdown.span("data_s", data_start, data_ready)
            breakdown.span("forward_backward", data_ready, backward_end)
            comm_start = self.strategy.comm_started()
            if sync and comm_start is not None:
                breakdown.span("comm_s", comm_start, backward_end)
            if loss is not None:
                tally.add(loss, self.objective.correct(out, x, y), len(y))
            if sync:
                step_end = self._optimizer_step(step_start)
                progress.advance()
                self._batch_changed(self.batch_schedule.step_done(in_step))
                if self.state.step % cfg.log_every == 0:
                    self._log_point(epoch, tally, progress)
                in_step, forwards = 0, self._step_forwards(micro + 1)
                step_start = step_end
                self.activity.step = self.state.step + 1
                if cfg.checkpoint_every_steps and self.state.step % cfg.checkpoint_every_steps == 0:
                    self._save(position=tally.position(epoch, micro + 1), partial=tally.partial())
                    step_start = clock.stamp()  # the checkpoint's time is not the next step's
                if self._steps_done():
                    break
            data_start = clock.stamp()
        return self._end_epoch(epoch, tally)

    def _step_forwards(self, first: int) -> int:
        """The forwards of the step that starts at --batch-size batch `first`: the accumulation, or fewer at
        the epoch's end. Each forward's loss is divided by it, so a short last step is the mean over its
        samples, not a fraction of it."""
        left = -(-(self.micro_steps - first) // self.batch_schedule.merge)
        return min(self.batch_schedule.accum, left)

    def _forwards(self, epoch: int, first: int) -> Iterator[tuple[int, Batch]]:
        """The epoch's forwards from --batch-size batch `first` on, each of the per-rank batch the schedule has
        reached (the last may be short), with the index of the last --batch-size batch it holds. The loaded
        batches are cut, or joined where a forward spans two of them (after the per-rank batch grew)."""
        b, per_load = self.cfg.batch_size, largest_merge(self.cfg)
        skip, taken = (first % per_load) * b, first * b  # a resumed epoch starts inside a loaded batch
        pieces: list[Batch] = []
        held = 0
        for x, y in self.batches.epoch(epoch, first // per_load):
            if self.timings.last_load is None or len(y) == per_load * b:  # for timing: a full one where there is one
                self.timings.last_load = (x, y)
            at, skip = skip, 0
            while at < len(y):
                size = self.batch_schedule.per_rank_batch - held
                pieces.append((rows(x, at, at + size), y[at : at + size]))
                held += len(pieces[-1][1])
                at += size
                if held == self.batch_schedule.per_rank_batch:
                    taken += held
                    yield -(-taken // b) - 1, _joined(pieces)
                    pieces, held = [], 0
        if pieces:  # the epoch's short last forward
            taken += held
            yield -(-taken // b) - 1, _joined(pieces)

    def _begin_epoch(self, epoch: int) -> tuple[EpochTally, int]:
        """The epoch's tally, and the micro-step it starts from: 0, or where a checkpoint taken in its
        middle left it (the epoch then goes on with the sums and time of its first part; the random
        streams were restored with the rest)."""
        now = time.perf_counter()
        tally = EpochTally.zeros(self.ctx.device, now, self.state.elapsed_s + (now - self.started))
        position, self.state.position = self.state.position, None
        if position is None or position["epoch"] != epoch:
            return tally, 0
        tally.samples, tally.time_start = position["epoch_samples"], position["time_start"]
        tally.started -= position["epoch_elapsed_s"]
        if self._partial is not None:
            tally.resume(self._partial)
        return tally, position["micro"]

    def _optimizer_step(self, step_start: float) -> float:
        """The optimizer step at the LR of the schedule, timed; returns when it ended."""
        clock, breakdown, batches = self.clock, self.breakdown, self.batch_schedule
        # At a fixed batch the schedule runs on steps; a growing batch runs it on samples, scaled to the batch.
        lr = (
            self.schedule.lr_at(self.state.step)
            if batches.kind == "fixed"
            else self.schedule.lr_at(batches.lr_step()) * batches.lr_factor()
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        opt_start = clock.stamp()
        step_comm = self.strategy.optimizer_step(self.optimizer, self.scaler)
        if step_comm is not None:  # communication inside the step: exposed, so it is comm_s
            breakdown.span("optimizer_comm_s", *step_comm)
        self.memory.count(self.state.step, self.model, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        step_end = clock.stamp()
        breakdown.span("optimizer_s", opt_start, step_end)
        breakdown.span("step", step_start, step_end)
        breakdown.step_done()
        self.state.step += 1
        return step_end

    def _log_point(self, epoch: int, tally: EpochTally, progress: EpochProgress) -> None:
        """Every --log-every steps: the interval's sums read from the devices (the only sync for
        them), checked for divergence, shown and written as a `step` event."""
        now = time.perf_counter()
        loss_sum, correct, n = self.ctx.sum(tally.interval.clone()).tolist()
        self._check_finite(loss_sum)
        n = int(n)
        rate = n / (now - tally.interval_start)
        progress.show(rate, loss_sum / n)
        self.state.samples += n
        tally.samples += n
        self._event(
            "step",
            epoch=epoch,
            step=self.state.step,
            samples=self.state.samples,
            loss=loss_sum / n,
            accuracy=correct / n,
            lr=self.optimizer.param_groups[0]["lr"],  # the step just taken's
            samples_per_s=rate,
            time=self.state.elapsed_s + now - self.started,
        )
        self.timings.step_s = (now - tally.interval_start) * self.batch_schedule.global_batch / n
        tally.next_interval(now)
        # The sums above waited for the device: resolving the interval's CUDA events now costs next to no wait.
        self.breakdown.resolve()
        self.strategy.resolve_timings()
        if self.grad_noise is not None:
            self._noise_read(self.grad_noise.flush(), self._doubling_speedup)

    def _noise_read(self, measured: list[tuple[float, float, int, int]], speedup: Speedup | None) -> None:
        """--batch-schedule adaptive at a log point: the interval's squared norms, summed over the ranks."""
        ctx, batches = self.ctx, self.batch_schedule

        def total(values: list[float]) -> list[float]:
            return ctx.sum(torch.tensor(values, dtype=torch.float64, device=ctx.device)).tolist()

        measured_batches = self.grad_noise.batches(batches.per_rank_batch, batches.accum)
        grown = batches.noise_read_of_ranks(
            measured, measured_batches, self.grad_noise.ranks, total, ctx.world_size, speedup
        )
        reading = batches.take_reading()
        if reading is not None:  # every log point's, so that a batch that stays put says why
            self._event("noise", step=self.state.step, **reading)
        self._batch_changed(grown)

    def _doubling_speedup(self, merge: int, accum: int) -> float:
        """adaptive: the throughput at a per-rank batch of merge x --batch-size and `accum` forwards a step over
        the throughput now. A step is its forwards and backwards plus what does not grow with the batch (the
        all-reduce, the optimizer, the loop's own work): that rest is the step time measured over the last log
        interval less its forwards and backwards, each timed at its per-rank batch (data loading is counted in
        the rest, which makes the prediction a little optimistic where loading is slow)."""
        now = self.batch_schedule
        step_s = self.timings.step_s if self.timings.step_s is not None else 0.0
        current, following = self._timed_forward_backward(now.merge, merge)
        rest = max(0.0, step_s - now.accum * current)
        samples = merge * accum / (now.merge * now.accum)
        local = samples * (now.accum * current + rest) / (accum * following + rest)
        # Averaged over the ranks: each timed its own, and every rank must take the same decision (ranks at
        # different batches would call their collectives out of step and wait for each other forever).
        summed = self.ctx.sum(torch.tensor([local], dtype=torch.float64, device=self.ctx.device))
        return summed.item() / self.ctx.world_size

    def _timed_forward_backward(self, now: int, following: int) -> tuple[float, float]:
        """Seconds of a forward and backward on this rank at the per-rank batches now x and following x
        --batch-size: the median of TIMING_PASSES passes each, alternating (the machine's speed drifts), after
        an untimed pass each (the first at a shape allocates); once per pair, on the last loaded batch.
        Outside DDP's synchronisation, its gradients dropped and the model's buffers (batch-norm statistics) put
        back, so the training is as if it had not run."""
        pair = (now, following)
        if pair in self.timings.forward_backward_s:
            return self.timings.forward_backward_s[pair]
        model, cuda = self.model, self.ctx.device.type == "cuda"
        assert self.timings.last_load is not None  # a log point comes after a loaded batch
        x, y = self.timings.last_load
        sizes = [merge * self.cfg.batch_size for merge in dict.fromkeys(pair)]
        inputs = [(rows(x, 0, n), y[:n]) for n in sizes]
        buffers = [b.detach().clone() for b in model.buffers()]
        seconds: list[list[float]] = [[] for _ in inputs]
        with self.strategy.no_sync(model):
            for timed in (False, *[True] * TIMING_PASSES):
                for (x, y), kept in zip(inputs, seconds):
                    if cuda:
                        torch.cuda.synchronize()
                    started = time.perf_counter()
                    self.strategy.forward_backward(model, self.objective, x, y, 1, self.scaler, self.autocast)
                    if cuda:
                        torch.cuda.synchronize()
                    if timed:
                        kept.append(time.perf_counter() - started)
        self.strategy.discard_gradients(model, self.optimizer)
        with torch.no_grad():
            for kept_buffer, buffer in zip(buffers, model.buffers()):
                buffer.copy_(kept_buffer)
        medians = [statistics.median(kept) for kept in seconds]
        self.timings.forward_backward_s[pair] = (medians[0], medians[-1])
        return medians[0], medians[-1]

    def _batch_changed(self, global_batch: int | None) -> None:
        """A `batch` event in metrics.jsonl when the schedule moved the global batch."""
        if global_batch is None:
            return
        batches = self.batch_schedule
        self._event("batch", step=self.state.step, **batches.change_event())
        log.info(
            "step %d: global batch %d (%d a rank, %d micro-steps a step)",
            self.state.step,
            global_batch,
            batches.per_rank_batch,
            batches.accum,
        )

    def _end_epoch(self, epoch: int, tally: EpochTally) -> dict[str, Any]:
        """The epoch's record: its sums over the ranks, its time and its step-time breakdown."""
        ctx = self.ctx
        tally.totals += tally.interval
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - tally.started
        loss_sum, correct, n = ctx.sum(tally.totals).tolist()
        n = int(n)
        self.state.samples += n - tally.samples  # the samples since the last log point
        self._check_finite(loss_sum)
        if self.grad_noise is not None:
            self._noise_read(self.grad_noise.flush(), None)
        phases = self.breakdown.means()
        # Every tensor handed to a collective lives on the rank's device: NCCL has no CPU tensors.
        # The mean is over the ranks that train: a parameter server's loop only keeps step with them.
        trains = 1.0 if self.strategy.trains else 0.0
        means = torch.tensor([*(trains * v for v in phases.values()), trains], dtype=torch.float64, device=ctx.device)
        *sums, training_ranks = ctx.sum(means).tolist()
        phases = dict(zip(phases, (total / training_ranks for total in sums)))
        record = {
            "epoch": epoch,
            "step": self.state.step,
            "samples": self.state.samples,
            "epoch_samples": n,
            "train_loss": loss_sum / n,
            "train_accuracy": correct / n,
            "epoch_time_s": seconds,
            "samples_per_s": n / seconds,
            "lr": self.optimizer.param_groups[0]["lr"],
            "time_start": tally.time_start,
            "time_end": tally.time_start + seconds,
            "breakdown": phases,
        }
        self._event("epoch", **record)
        log.info("epoch %d: %.2fs, %.0f samples/s, loss %.4f", epoch + 1, seconds, n / seconds, loss_sum / n)
        return record

    def _check_finite(self, loss_sum: float) -> None:
        """Called where the loss is read anyway (log points, epoch ends): no extra sync per step. The loss
        is all-reduced before it is checked, so every rank sees the same value and all stop at the same step."""
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(
                f"training diverged: the loss became {loss_sum} between steps {self.checked_step + 1} and "
                f"{self.state.step}; lower --lr (the scaled LR was {self.schedule.peak_lr:.4g}) or add --warmup-epochs"
            )
        self.checked_step = self.state.step

    def _steps_done(self) -> bool:
        """--max-steps reached: the run ends after this step, in the middle of an epoch if need be."""
        return self.cfg.max_steps is not None and self.state.step >= self.cfg.max_steps

    def _best_epoch(self) -> int:
        """The epoch with the lowest validation loss so far (early stopping watches it)."""
        epochs = self.state.epochs_done
        return min(epochs, key=lambda e: e["evals"]["val"]["loss"])["epoch"]

    @torch.no_grad()
    def evaluate(self, epoch: int) -> dict[str, dict[str, float]]:
        """Loss and accuracy on each held-out split, sharded across ranks and summed."""
        self.model.eval()
        self.activity.phase = f"evaluating epoch {epoch + 1}"
        splits = {"test": self.data.test}
        if self.data.val is not None:
            splits["val"] = self.data.val
        results = {}
        for name, split in splits.items():
            totals = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
            # Text windows are large samples (seq_len tokens, 256 logits each): 4 training batches' worth.
            batch = (
                self.cfg.batch_size * 4
                if isinstance(self.data.train, TokenStream)
                else max(256, self.cfg.batch_size * 4)
            )
            for x, y in eval_batches(split, self.data_ctx, batch, self.prepare, self.cfg.loader_workers):
                loss, out = self.strategy.evaluate(self.model, self.objective, x, y, self.autocast)
                if loss is None:
                    continue
                totals[0] += loss.float() * len(y)
                totals[1] += self.objective.correct(out, x, y)
                totals[2] += len(y)  # a Python number: no host-to-device copy
            loss_sum, correct, n = self.ctx.sum(totals).tolist()
            results[name] = {"loss": loss_sum / n, "accuracy": correct / n, "samples": int(n)}
            self._event("eval", epoch=epoch, step=self.state.step, split=name, **results[name])
        return results

    # -- run directory and checkpoints ------------------------------------------------------

    def _event(self, event: str, **fields: Any) -> None:
        for sink in self.sinks:
            sink.write(event, **fields)

    def _rng_state(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state()}
        if self.augment is not None:
            state["augment"] = self.augment.state_dict()
        if self.ctx.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.ctx.device)
        return state

    def _save(self, position: dict[str, Any] | None = None, partial: dict[str, list[float]] | None = None) -> None:
        """Every rank calls it. `position` and `partial` (this rank's sums so far) for a checkpoint
        taken in the middle of an epoch."""
        with self.activity.doing(f"saving the checkpoint after step {self.state.step}"):
            rngs = self.ctx.gather_objects({**self._rng_state(), **({"partial": partial} if partial else {})})
            states = self.strategy.checkpoint_state(self.model, self.optimizer)
        if not self.ctx.is_main:
            return
        s = self.state
        save_checkpoint(
            self.run.path / CHECKPOINT_NAME,
            {
                "identity": self.cfg.identity(),
                "device": self.ctx.device.type,
                "epoch": s.epoch,
                "step": s.step,
                "samples": s.samples,
                "elapsed_s": s.elapsed_s + time.perf_counter() - self.started,
                "epochs_done": s.epochs_done,
                **states,
                "scaler": self.scaler.state_dict(),
                "batch_schedule": self.batch_schedule.state_dict(),
                "rng": rngs,
                "position": position,
            },
        )
        log.info(
            "checkpoint after step %d (epoch %d%s)",
            s.step,
            s.epoch + (position is not None),
            f", batch {position['micro']} of {self.micro_steps}" if position else "",
        )

    def _earlier_restarts(self) -> int:
        starts = [line for line in self.run.metrics.read_text().splitlines() if '"event": "start"' in line]
        return sum(1 for line in starts if '"restart"' in line)

    def _restore(self) -> None:
        """--resume, or a restart by the elastic agent (or nothing to restore). Rank 0 reads the
        checkpoint and sends it to the others, so across nodes it has to be on node 0's disk only."""
        path = self.run.path / CHECKPOINT_NAME
        with self.activity.doing("loading the checkpoint"):
            mine = load_checkpoint(path) if self.ctx.is_main and (self.cfg.resume or path.exists()) else None
            ckpt = self.ctx.broadcast_object(mine)
        if ckpt is None:
            if self.restarts:
                log.warning("restart %d: no checkpoint yet; training starts over", self.restarts)
            return
        self.strategy.load_checkpoint_state(self.model, self.optimizer, ckpt)
        if self.scaler.is_enabled():
            self.scaler.load_state_dict(ckpt["scaler"])
        if len(ckpt["rng"]) == self.ctx.world_size:
            rng = ckpt["rng"][self.ctx.rank]
            torch.set_rng_state(rng["torch"])
            if self.augment is not None:
                self.augment.load_state_dict(rng["augment"])
            if "cuda" in rng:
                torch.cuda.set_rng_state(rng["cuda"], self.ctx.device)
            self._partial = rng.get("partial")
        else:
            # Resharded (fsdp) onto another number of ranks: each rank's random stream (augmentation,
            # dropout) has no counterpart, so the streams restart from the seed.
            log.warning(
                "resumed on %d ranks from a checkpoint of %d: random streams restart from --seed",
                self.ctx.world_size,
                len(ckpt["rng"]),
            )
        self.state = RunState(
            epoch=ckpt["epoch"],
            step=ckpt["step"],
            samples=ckpt["samples"],
            elapsed_s=ckpt["elapsed_s"],
            epochs_done=list(ckpt["epochs_done"]),
            position=ckpt.get("position"),
        )
        if ckpt.get("batch_schedule"):
            self.batch_schedule.load_state_dict(ckpt["batch_schedule"])
        self.resumed_from_step = self.state.step
        log.info(
            "resumed after epoch %d (step %d)%s",
            self.state.epoch,
            self.state.step,
            f" on restart {self.restarts}" if self.restarts else "",
        )

    def _diverged_summary(self, message: str) -> dict[str, Any] | None:
        if not self.ctx.is_main:
            return None
        cfg = self.cfg
        return {
            "status": "diverged",
            "error": message,
            "workers": self.ctx.world_size,
            "strategy": cfg.strategy_name,
            "batch_size": cfg.batch_size,
            "global_batch_size": cfg.global_batch_size,
            "lr": self.schedule.peak_lr,
            "base_lr": cfg.lr,
            "epochs": cfg.epochs,
            "steps": self.state.step,
            "diverged_after_step": self.checked_step,
        }

    def model_flops(self) -> FlopCount | None:
        """FLOPs of one sample, for MFU, counted at the end of the run on the model built again on the
        meta device (shapes only; without activation checkpointing: MFU credits no recomputation).
        Counting imports torch._dynamo and sympy, which took longer than torch itself here: counted
        before training, it delayed every run's first step (docs/benchmarks.md, launch time)."""
        try:
            with torch.device("meta"):
                module = build_model(self.cfg, self.data)
        except Exception as exc:  # a user model that builds only on a real device: no FLOPs, no MFU
            log.warning(
                "cannot build the model on the meta device to count FLOPs (%s: %s); no MFU for this run",
                type(exc).__name__,
                exc,
            )
            return None
        return model_flops_per_sample(module, self.objective, self.data, self.ctx, self.cfg)

    def _summary(self) -> dict[str, Any] | None:
        self.activity.phase = "gathering the summary"
        peak = self.ctx.gather_objects(peak_memory_bytes(self.ctx.device))
        memory = per_rank(self.ctx.gather_objects(self.memory.figures()))
        strategy_fields = self.strategy.summary_fields()
        sent = self.ctx.gather_objects(self.strategy.bytes_sent())
        steps_here = max(self.state.step - self.first_step, 1)
        if not self.ctx.is_main:
            return None
        cfg, epochs = self.cfg, self.state.epochs_done
        steady = steady_epochs(epochs)
        last = epochs[-1]
        held_out = last["evals"].get("val", last["evals"]["test"])
        steady_time = sum(e["epoch_time_s"] for e in steady)
        breakdown = {k: statistics.fmean(e["breakdown"][k] for e in steady) for k in steady[0]["breakdown"]}
        return {
            "status": "completed",
            "workers": self.ctx.world_size,
            "strategy": cfg.strategy_name,
            "layout": cfg.mesh_layout,
            "allreduce": self.strategy.allreduce,
            "comm_bytes_per_step": None if None in sent else [b / steps_here for b in sent],
            "batch_size": cfg.batch_size,
            "global_batch_size": cfg.global_batch_size,
            "grad_accum": cfg.grad_accum,
            "lr": self.schedule.peak_lr,
            "base_lr": cfg.lr,
            "lr_scaling": cfg.lr_scaling,
            "epochs": cfg.epochs,
            "steps": self.state.step,
            "steps_per_epoch": self.steps_per_epoch,
            "epoch_times_s": [e["epoch_time_s"] for e in epochs],
            "epoch_time_s": steady_epoch_time([e["epoch_time_s"] for e in epochs]),
            "samples_per_s": sum(e["epoch_samples"] for e in steady) / steady_time,
            "timed_epochs": len(steady),
            "train_loss": last["train_loss"],
            "train_accuracy": last["train_accuracy"],
            "val_loss": held_out["loss"],
            "val_accuracy": held_out["accuracy"],
            "val_split": "val" if "val" in last["evals"] else "test",
            "test_loss": last["evals"]["test"]["loss"],
            "test_accuracy": last["evals"]["test"]["accuracy"],
            "train_time_s": self.state.elapsed_s + time.perf_counter() - self.started,
            "breakdown": breakdown,
            "peak_memory_bytes": peak,
            "memory": memory,
            "epochs_run": len(epochs),
            "early_stopped": len(epochs) < cfg.epochs,
            "restarts": self.restarts,
            "resumed_from_step": self.resumed_from_step,
            **({"best_epoch": self._best_epoch() + 1} if cfg.early_stop else {}),
            **model_throughput(self, sum(e["epoch_samples"] for e in steady) / steady_time, last["evals"]),
            **({"grad_noise": self.grad_noise.summary()} if self.grad_noise is not None else {}),
            **({"batch_schedule": self.batch_schedule.summary()} if cfg.batch_schedule != "fixed" else {}),
            **strategy_fields,
        }


# Forward and backward passes timed at each of the two per-rank batches a doubling compares: one pass of a
# small model scatters by tens of percent, and a single unlucky one would hold the batch back for the run.
TIMING_PASSES = 5


@dataclass
class DoublingTimings:
    """--batch-schedule adaptive's throughput measurements: the last loaded batch (full where there is one),
    forward and backward seconds at the two per-rank batches (over --batch-size) a doubling compares, and the
    step time over the last log interval."""

    last_load: Batch | None = None
    forward_backward_s: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    step_s: float | None = None


def _joined(pieces: list[Batch]) -> Batch:
    """One forward's inputs and targets from consecutive pieces (no copy for a single piece)."""
    if len(pieces) == 1:
        return pieces[0]
    return joined([x for x, _ in pieces]), joined([y for _, y in pieces])


def lr_schedule(cfg: TrainConfig, steps_per_epoch: int) -> LRSchedule:
    """The run's LR at every step: --lr scaled to the global batch by --lr-scaling, warmed up, then
    the --schedule with its parameters."""
    return LRSchedule(
        base_lr=cfg.lr,
        peak_lr=scaled_lr(cfg.lr, cfg.global_batch_size, cfg.reference_batch_size, cfg.lr_scaling),
        steps_per_epoch=steps_per_epoch,
        epochs=cfg.epochs,
        warmup_epochs=cfg.warmup_epochs,
        schedule=cfg.schedule,
        step_size=cfg.lr_step_size,
        gamma=cfg.lr_gamma,
        decay_rate=cfg.lr_decay_rate,
        power=cfg.lr_power,
        min_lr=cfg.min_lr,
        end_lr=cfg.lr_end,
        max_steps=cfg.max_steps,
    )


def model_flops_per_sample(
    module: nn.Module, objective: Any, data: Any, ctx: RankContext, cfg: TrainConfig
) -> FlopCount | None:
    """FLOPs of one sample, counted on its shapes; the sample comes from the test split, so no
    augmentation or random number is drawn and the training run is unchanged."""
    x, y = next(eval_batches(data.test, ctx, 1, BatchPreparer(cfg.image_size)))
    return count_flops(module, objective, x, y)


def model_throughput(trainer: Trainer, samples_per_s: float, evals: dict[str, Any]) -> dict[str, Any]:
    """Summary fields in the units of the workload: tokens/s and bits per byte for text; FLOPs and MFU."""
    fields: dict[str, Any] = {}
    data, ctx, cfg = trainer.data, trainer.ctx, trainer.cfg
    if isinstance(data.train, TokenStream):
        fields["seq_len"] = data.train.seq_len
        fields["tokens_per_s"] = samples_per_s * data.train.seq_len
        if trainer.objective.in_nats:  # cross-entropy in nats per byte
            fields["val_bits_per_byte"] = evals.get("val", evals["test"])["loss"] / math.log(2)
            fields["test_bits_per_byte"] = evals["test"]["loss"] / math.log(2)
    count = trainer.model_flops()
    fields["flops_per_sample"] = trainer.flops_per_sample = count.total if count is not None else None
    if ctx.device.type == "cuda":
        share = count.convolution / count.total if count is not None and count.total else 0.0
        peak = gpu_peak(torch.cuda.get_device_name(ctx.device), cfg.precision, share)
    else:
        peak = cpu_peak(cfg.precision, cfg.cache_dir or default_cache_dir())
    fields["mfu"] = mfu(trainer.flops_per_sample, samples_per_s, peak[0] if peak else None, ctx.world_size)
    fields["mfu_peak"] = (
        {"flops_per_s": peak[0] * ctx.world_size, "per_device": peak[0], "devices": ctx.world_size, "source": peak[1]}
        if peak
        else None
    )
    return fields
