"""The global batch over a run (`--batch-schedule`): fixed, a warm-up ramp, or adapted to the noise.

The batch grows by doublings, first of the per-rank batch and then of the accumulation. A rank's forward
takes `merge` x --batch-size samples, up to --max-batch-size (the largest per-rank batch that fits,
find-batch's limit; by default --batch-size, so it never grows): a larger per-rank batch runs faster per
sample up to the device's knee. Past it an optimizer step runs `accum` such forwards, which costs no
memory. The loader loads batches of the largest per-rank batch from the start and the loop cuts them
into forwards (engine/loop.py), so the samples and their order do not depend on the batch reached: a
run that grows the per-rank batch trains on the same steps as one that grows the accumulation. The
global batch is merge x accum x --batch-size x the data-parallel ranks, up to `--max-global-batch`.

- warmup: the global batch doubles at evenly spaced points of the first --batch-ramp-epochs (by samples
  trained on), to the largest: the fixed ramp of batch-size warm-up (Smith et al. 2017, "Don't decay the
  learning rate, increase the batch size"; Merrill et al. 2025).
- adaptive: the batch doubles when that raises the run's goodput, its progress per second (Pollux, Qiao et
  al. OSDI 2021): the throughput at the next batch over the throughput now, times the statistical
  efficiency of the next batch over the current one, (B_noise + B) / (B_noise + 2B) (McCandlish et al.
  2018: a batch B needs 1 + B / B_noise times the fewest samples). B_noise is the gradient noise scale
  B_simple = tr(Σ) / |G|², measured in the run from the squared norms of a small and a big batch at every
  step (engine/grad_noise.py) and smoothed by an exponential moving average of its numerator and
  denominator as `paratrain noise-scale` does; it grows as the loss falls. The throughputs are the loop's
  measurements (engine/loop.py: the step time now; a forward and backward timed at the next per-rank
  batch). So the batch grows while the device still gets faster per sample at a larger batch, or the
  per-step costs (all-reduce, optimizer) still weigh, and only as far as the noise lets the extra
  samples count. It is read where the loop reads the loss anyway (its log points), so no step waits for
  the device; every rank decides on the same numbers (averaged over the ranks there).

The LR follows the global batch by --lr-scaling (as a run started at that batch would have it), and the LR
schedule runs on samples, not steps: its step is the samples trained on over the starting global batch, so
warm-up and decay end where they would at a fixed batch. The state (merge, accumulation, samples,
averages) goes into the checkpoint: a resumed run continues at the same batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from paratrain.config import TrainConfig
from paratrain.engine.lr import scaled_lr

# The moving average of the noise scale's two estimates: about this many steps' worth (noise-scale's default).
EMA_STEPS = 20
# A single step's estimate scatters by about its own size (docs/batch-size.md): the batch grows only once the
# average holds about EMA_STEPS steps (its weights sum to 1 - 1/e) and the doubling promises more goodput at two
# log points in a row.
MIN_WEIGHT = 1 - math.exp(-1)
CONFIRMATIONS = 2
# The goodput a doubling must promise: more than the timings' own scatter between two readings.
MIN_GOODPUT_GAIN = 1.05

# The throughput at a (merge, accum) over the throughput now, from the loop's measurements.
Speedup = Callable[[int, int], float]


def two_batch_estimates(small_sq: float, big_sq: float, small_batch: int, big_batch: int) -> tuple[float, float]:
    """Unbiased |G|² and tr(Σ) from squared gradient norms of a small and a big batch (McCandlish et al.
    2018, Appendix A.1)."""
    g2 = (big_batch * big_sq - small_batch * small_sq) / (big_batch - small_batch)
    trace = (small_sq - big_sq) / (1 / small_batch - 1 / big_batch)
    return g2, trace


def largest_merge(cfg: TrainConfig) -> int:
    """The largest per-rank batch over --batch-size: a power of two (the per-rank batch doubles); 1 without
    --max-batch-size (a fixed batch has none). The loader loads batches of this many times --batch-size."""
    return 2 ** int(math.log2(cfg.largest_batch_size // cfg.batch_size))


@dataclass
class BatchState:
    """What the schedule has done so far; all of it goes into the checkpoint."""

    accum: int  # forwards per optimizer step now
    merge: int = 1  # the per-rank batch over --batch-size
    samples: int = 0  # samples trained on since the start, all ranks: the schedule's clock
    ema_g2: float = 0.0
    ema_trace: float = 0.0
    ema_weight: float = 0.0  # the averages' bias correction (their weights sum to this)
    above: int = 0  # log points in a row at which the next batch promised more goodput
    # The noise scale's standard error (noise-scale's delta method, each reading one observation weighted as in
    # the averages): the sums of the squared weights times tr(Σ)², tr(Σ)|G|² and |G|⁴, and the readings folded in.
    sq_trace: float = 0.0
    sq_cross: float = 0.0
    sq_g2: float = 0.0
    readings: int = 0


class BatchSchedule:
    """The per-rank batch and the accumulation of each optimizer step, and the LR's factor and clock."""

    def __init__(self, cfg: TrainConfig, samples_per_epoch: int):
        self.kind = cfg.batch_schedule
        self.start = cfg.grad_accum
        self.batch_size = cfg.batch_size
        self.per_chunk = cfg.global_batch_size // cfg.grad_accum  # a --batch-size batch of every rank
        self.max_merge = largest_merge(cfg)
        # The largest step, in --batch-size batches of every rank (merge x accum).
        growing = self.kind != "fixed"
        self.top = max(self.start, cfg.largest_global_batch // self.per_chunk) if growing else self.start
        self.ramp_samples = cfg.batch_ramp_epochs * samples_per_epoch
        self.lr_scaling = cfg.lr_scaling
        self.state = BatchState(accum=self.start)
        self.last_gain: float | None = None  # adaptive: the goodput the next doubling promised at the last reading
        self._reading: dict[str, Any] | None = None  # the last log point's, until take_reading()

    @property
    def accum(self) -> int:
        return self.state.accum

    @property
    def merge(self) -> int:
        return self.state.merge

    @property
    def per_rank_batch(self) -> int:
        """Samples of one forward on one rank."""
        return self.state.merge * self.batch_size

    @property
    def global_batch(self) -> int:
        return self.state.merge * self.state.accum * self.per_chunk

    def lr_factor(self) -> float:
        """The LR at this batch over the LR at the starting one, by --lr-scaling."""
        return scaled_lr(1.0, self.global_batch, self.start * self.per_chunk, self.lr_scaling)

    def lr_step(self) -> int:
        """The step of the LR schedule: samples trained on over the starting global batch."""
        return self.state.samples // (self.start * self.per_chunk)

    def step_done(self, forwards: int) -> int | None:
        """After an optimizer step of `forwards` forwards: the new global batch when warmup moves it."""
        self.state.samples += forwards * self.state.merge * self.per_chunk
        if self.kind != "warmup":
            return None
        return self._grow_to(self._ramp_units())

    def noise_read(
        self, small_sq: float, big_sq: float, small_batch: int, big_batch: int, steps: int, speedup: Speedup | None
    ) -> int | None:
        """adaptive, at a log point: the mean squared norms of the small and the big batch over the `steps`
        steps measured since the last one, folded into the averages; the new global batch when the next one
        promised more goodput at two readings in a row (`speedup` is asked only once the noise scale is known:
        it may time a forward and backward; without one, at an epoch's end, the norms are only folded in)."""
        if self.kind != "adaptive":
            return None
        g2, trace = two_batch_estimates(small_sq, big_sq, small_batch, big_batch)
        keep = (1 - 1 / EMA_STEPS) ** steps  # as if each of the steps had been averaged in on its own
        s = self.state
        s.ema_g2 = keep * s.ema_g2 + (1 - keep) * g2
        s.ema_trace = keep * s.ema_trace + (1 - keep) * trace
        s.ema_weight = keep * s.ema_weight + (1 - keep)
        weight_sq, keep_sq = (1 - keep) ** 2, keep**2
        s.sq_trace = keep_sq * s.sq_trace + weight_sq * trace * trace
        s.sq_cross = keep_sq * s.sq_cross + weight_sq * trace * g2
        s.sq_g2 = keep_sq * s.sq_g2 + weight_sq * g2 * g2
        s.readings += 1
        if speedup is None:
            return None
        noise, grown = self.noise_scale(), self._next()
        self.last_gain = None if noise is None or grown is None else self.goodput_gain(*grown, speedup(*grown), noise)
        s.above = s.above + 1 if self.last_gain is not None and self.last_gain >= MIN_GOODPUT_GAIN else 0
        self._reading = self._reading_fields(grown)
        if s.ema_weight < MIN_WEIGHT or s.above < CONFIRMATIONS:
            return None
        s.above = 0
        return self._grow_to(2 * s.merge * s.accum)

    def noise_read_of_ranks(
        self,
        measured: list[tuple[float, float, int, int]],
        batches: tuple[int, int],
        ranks: int,
        total: Callable[[list[float]], list[float]],
        world_size: int,
        speedup: Speedup | None,
    ) -> int | None:
        """noise_read at a log point on every rank: this rank's (|small|², |big|², ...) measured since the last one,
        summed over the ranks by `total` (each rank measured its own small batch), so that every rank takes the same
        decision; `batches` are the (small, big) batch sizes the steps had and `ranks` the ranks each step counts."""
        if self.kind != "adaptive":
            return None
        batch = self.global_batch
        small, big, counted, batch_sum, square_sum = total(
            [sum(m[0] for m in measured), sum(m[1] for m in measured), len(measured), batch, batch * batch]
        )
        # The ranks' batches agree exactly when their squares sum to the square of their sum over the ranks
        # (exact in float64 for whole numbers this size): a divergence is named here, not left to hang.
        if square_sum * world_size != batch_sum * batch_sum:
            raise RuntimeError(f"the ranks' batch schedules diverged (this rank at {batch}); please report it")
        if not counted:
            return None
        # Every rank's steps had the same batches: the accumulation changes only here, after them.
        return self.noise_read(small / counted, big / counted, *batches, round(counted / ranks), speedup)

    def change_event(self) -> dict[str, Any]:
        """The fields of metrics.jsonl's `batch` event, after the global batch moved."""
        noise, error = self.noise_scale(), self.noise_scale_stderr()
        return {
            "samples": self.state.samples,
            "global_batch": self.global_batch,
            "per_rank_batch": self.per_rank_batch,
            "grad_accum": self.accum,
            "lr_factor": self.lr_factor(),
            **({"noise_scale": noise} if noise is not None else {}),
            **({"noise_scale_stderr": error} if error is not None else {}),
            **({"goodput_gain": self.last_gain} if self.last_gain is not None else {}),
        }

    def take_reading(self) -> dict[str, Any] | None:
        """adaptive: the fields of metrics.jsonl's `noise` event for the last log point's reading, once (None when
        no reading was taken since the last call)."""
        reading, self._reading = self._reading, None
        return reading

    def _reading_fields(self, grown: tuple[int, int] | None) -> dict[str, Any]:
        """What a reading saw, before any doubling it led to: the global batch, the smoothed noise scale with its
        standard error, and the next doubling with the goodput it promised (absent where not known, or at the
        largest batch)."""
        noise, error = self.noise_scale(), self.noise_scale_stderr()
        return {
            "samples": self.state.samples,
            "global_batch": self.global_batch,
            **({"noise_scale": noise} if noise is not None else {}),
            **({"noise_scale_stderr": error} if error is not None else {}),
            **({"next_global_batch": grown[0] * grown[1] * self.per_chunk} if grown is not None else {}),
            **({"goodput_gain": self.last_gain} if self.last_gain is not None else {}),
        }

    def goodput_gain(self, merge: int, accum: int, speedup: float, noise: float) -> float:
        """The goodput at (merge, accum) over the goodput now: the throughput's gain times the statistical
        efficiency's, (B_noise + B) / (B_noise + B') (Pollux's efficiency, McCandlish et al.'s samples)."""
        bigger = merge * accum * self.per_chunk
        return speedup * (noise + self.global_batch) / (noise + bigger)

    def noise_scale(self) -> float | None:
        """The smoothed B_simple so far (None before it is measured, or while |G|² reads as 0 or less)."""
        s = self.state
        # Nothing measured yet (0), or a gradient or a noise too small to tell apart from the estimates' own noise.
        if s.ema_g2 <= 0 or s.ema_trace <= 0:
            return None
        return s.ema_trace / s.ema_g2

    def noise_scale_stderr(self) -> float | None:
        """The smoothed noise scale's standard error by the delta method (as `paratrain noise-scale` gives it):
        var(R) ≈ Σ w² (t − R g)² / (Σ w g)² over the readings, with the averages' weights w. It is the scatter from
        one reading to the next (each the mean of its steps), so a lower bound while training moves fast; None
        with no noise scale, or from a single reading, whose scatter cannot be told."""
        noise, s = self.noise_scale(), self.state
        if noise is None or s.readings < 2:
            return None
        variance = s.sq_trace - 2 * noise * s.sq_cross + noise * noise * s.sq_g2
        return math.sqrt(max(0.0, variance)) / s.ema_g2

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = BatchState(**state)  # a checkpoint from before per-rank growth has no `merge`: 1

    def summary(self) -> dict[str, Any]:
        """summary.json's `batch_schedule`: the kind, where the global batch started, ended and could go,
        and the per-rank batch it ended at; adaptive, also the last reading (the noise scale with its error,
        the goodput the next doubling promised) and the gain a doubling must promise, which say why it stopped."""
        return {
            "kind": self.kind,
            "start_global_batch": self.start * self.per_chunk,
            "final_global_batch": self.global_batch,
            "largest_global_batch": self.top * self.per_chunk,
            "final_per_rank_batch": self.per_rank_batch,
            "largest_per_rank_batch": self.max_merge * self.batch_size,
            "noise_scale": self.noise_scale(),
            **(
                {
                    "noise_scale_stderr": self.noise_scale_stderr(),
                    "goodput_gain": self.last_gain,
                    "min_goodput_gain": MIN_GOODPUT_GAIN,
                    # A gain above the bar doubles the batch only when confirmed: so many readings in a row above
                    # it, with the average settled (holding about EMA_STEPS steps' worth).
                    "readings_above": self.state.above,
                    "readings_needed": CONFIRMATIONS,
                    "average_settled": self.state.ema_weight >= MIN_WEIGHT,
                }
                if self.kind == "adaptive"
                else {}
            ),
        }

    def _ramp_units(self) -> int:
        """warmup: the step the ramp has reached, in --batch-size batches of every rank."""
        doublings = math.ceil(math.log2(self.top / self.start))
        stage = min(doublings, int(self.state.samples / self.ramp_samples * (doublings + 1)))
        return min(self.top, self.start * 2**stage)

    def _next(self) -> tuple[int, int] | None:
        """The (merge, accum) of the next doubling, None at the largest batch."""
        s, merge, accum = self.state, self.state.merge, self.state.accum
        grown = self._grow_to(2 * merge * accum)
        following = (s.merge, s.accum)
        s.merge, s.accum = merge, accum
        return following if grown is not None else None

    def _grow_to(self, units: int) -> int | None:
        """Doubles the per-rank batch while it may grow, then the accumulation, until a step holds `units`
        --batch-size batches of every rank (or --max-global-batch's share); the new global batch, or None."""
        s = self.state
        units = min(units, self.top)
        before = s.merge * s.accum
        while s.merge * s.accum < units:
            if s.merge * 2 <= self.max_merge and s.merge * 2 * s.accum <= units:
                s.merge *= 2
            else:  # the rest by accumulation, to the largest batch where that is off the doublings
                s.accum = max(s.accum, units // s.merge)
                break
        return self.global_batch if s.merge * s.accum > before else None
