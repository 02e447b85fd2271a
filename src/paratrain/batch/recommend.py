"""`paratrain recommend --workers N`: batch, LR, warmup, schedule and optimizer for N workers, from measurements.

The three measurements run in this order (each reused from OUT when the same flags made it):
1. find-batch on one worker: the largest per-worker batch that fits (less the safety margin) and the
   throughput knee. The per-worker batch stays within [knee, largest] (a knee above the largest is the
   largest). The search stops at the batch that leaves the N workers at least 20 optimizer steps an
   epoch: a larger batch would train a few steps an epoch (warmup and the schedule would have nothing
   to act on), whatever its speed; it is the one bound that also rules the knee out.
2. noise-scale on the N workers at the knee batch: B_simple, which stands in for the critical batch
   (McCandlish et al. 2018); with the HPC rule of thumb of a global batch under √(training samples),
   it caps the global batch: beyond the cap more batch buys few fewer steps and may generalise worse
   (Keskar et al. 2016; Shallue et al. 2018 measured the diminishing returns). Of the options (the
   knee, the largest batch under each cap) the bounds allow, the per-worker batch is the one with the
   shortest predicted time to the same loss: McCandlish et al.'s steps S = S_min (1 + B_noise/B)
   times a step's time at find-batch's measured samples/s.
3. lr-find on one worker at the chosen per-worker batch: the base LR for that batch, scaled to the
   global batch by the optimizer's rule (linear for SGD/LARS, Goyal et al. 2017; square root for the
   Adam family, You et al. 2019), with Goyal et al.'s gradual warmup when the LR is scaled up.
An optimizer hint (LARS for SGD, LAMB for Adam) is given when the global batch is more than 32x the
LR's base batch: the largest ratio Goyal et al. trained with linear scaling and warmup alone
(8192 / 256); You et al. needed layer-wise adaptation beyond it. The command keeps the optimizer
lr-find measured. The schedule is cosine decay after the warmup unless --schedule is given.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from paratrain.batch import check_out, check_train_flags, read_result, run_config, train_samples, write_result
from paratrain.batch import find_batch as find_batch_module
from paratrain.batch import lr_find as lr_find_module
from paratrain.batch import noise_scale as noise_scale_module
from paratrain.errors import UsageError

RESULT_FILE = "recommend.json"
CHOSEN = ("batch_size", "lr", "lr_scaling", "base_batch_size", "warmup_epochs", "workers", "max_batch_size")
# The recommended run's own options, which the measurement runs (at fixed batches and their own LRs) leave out.
FOR_THE_RUN = ("schedule", "batch_schedule", "max_global_batch", "batch_ramp_epochs")
# How the run's ranks share the model, which the one-worker measurements (find-batch, lr-find) have no ranks for:
# one worker holds the whole model (so its largest batch is a lower bound of a sharded rank's).
MESH_ONLY = ("dp_replicate", "dp_shard")
# The fewest optimizer steps an epoch recommend leaves: on 5,000 samples and 2 workers it once chose a batch
# of 2,048 a worker, one step an epoch. With fewer, a run is a handful of updates whatever the batch's speed.
MIN_STEPS_PER_EPOCH = 20
GOYAL_MAX_RATIO = 32  # 8192 / 256: the largest batch ratio of Goyal et al. 2017
GOYAL_WARMUP_FRACTION = 5 / 90  # 5 warmup epochs of their 90


def recommend(
    train: dict[str, Any],
    workers: int,
    out: Path,
    noise_steps: int = 200,
    lr_steps: int = 100,
    max_batch: int | None = None,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> dict[str, Any]:
    """Measure (or reuse) find-batch, noise-scale and lr-find; write OUT/recommend.json and return it."""
    chosen = [k for k in train if k in CHOSEN]
    if chosen:
        raise UsageError(f"paratrain recommend chooses --{chosen[0].replace('_', '-')} itself; drop it")
    out = Path(out)
    # A --schedule or a --batch-schedule given is for the recommended run; the measurement runs set their own.
    for_the_run = {k: v for k, v in train.items() if k in FOR_THE_RUN}
    train = {k: v for k, v in train.items() if k not in FOR_THE_RUN}
    _check(train, workers, out, noise_steps, lr_steps)  # first: the flags are the run's, on its --workers
    run_config({**train, **for_the_run, "workers": workers})  # the recommended run's layout and growth, validated
    one = {**{k: v for k, v in train.items() if k not in MESH_ONLY}, "workers": 1}
    cfg = run_config(one)
    samples = train_samples(cfg)
    bound = steps_bound(samples, workers, cfg.grad_accum)
    search_max, reason = (max_batch, "--max-batch") if max_batch is not None and max_batch <= bound.batch else bound

    on_stage("find-batch")
    batches = read_result(
        out / find_batch_module.RESULT_FILE, one, max_batch=search_max
    ) or find_batch_module.find_batch(one, out, max_batch=search_max, max_batch_reason=reason)

    on_stage("noise-scale")
    noise_train = {**train, "workers": workers, "batch_size": usable_knee(batches)}
    noise = read_result(
        out / noise_scale_module.RESULT_FILE, noise_train, steps=noise_steps
    ) or noise_scale_module.measure_noise_scale(noise_train, out, noise_steps)
    choice = BatchChoice.measured(batches, noise, workers, samples)
    if batches["limited_by"] == bound.reason:
        choice.notes.insert(0, bound.note(samples, workers, cfg.grad_accum))

    on_stage("lr-find")
    lr_train = {**one, "batch_size": choice.per_worker}
    lrs = read_result(
        out / lr_find_module.RESULT_FILE, lr_train, steps=lr_steps, rule=lr_find_module.RULE
    ) or lr_find_module.find_lr(lr_train, out, steps=lr_steps, target_batch=choice.global_batch)

    result = {
        "train": json.loads(json.dumps(train, default=str)),
        "workers": workers,
        **choice.fields(batches["margin"]),
        **_lr_fields(lrs, choice.global_batch, cfg.optimizer, cfg.epochs),
        "schedule": _schedule_field(for_the_run.get("schedule")),
        "batch_schedule": _batch_schedule_field(for_the_run, choice),
        "notes": choice.notes,
        "measurements": {
            "find_batch": str(out / find_batch_module.RESULT_FILE),
            "noise_scale": str(out / noise_scale_module.RESULT_FILE),
            "lr_find": str(out / lr_find_module.RESULT_FILE),
        },
    }
    # The growth options against the batch chosen (checked at a default batch before measuring).
    run_config({**train, **for_the_run, "workers": workers, "batch_size": choice.per_worker})
    result["command"] = train_command({**train, **for_the_run}, result)
    write_result(out / RESULT_FILE, result)
    return result


def _check(train: dict[str, Any], workers: int, out: Path, noise_steps: int, lr_steps: int) -> None:
    """Everything that would stop a later stage, checked before the first measurement runs."""
    for flag, steps, least in (
        ("--noise-steps", noise_steps, noise_scale_module.MIN_STEPS),
        ("--lr-steps", lr_steps, lr_find_module.MIN_STEPS),
    ):
        if steps < least:
            raise UsageError(
                f"{flag} {steps} is too few: the measurement needs at least {least} optimizer steps; "
                f"use {flag} {least} or more"
            )
    for stage in ("find-batch", "noise-scale", "lr-find"):
        check_train_flags(train, stage)
    try:
        run_config({**train, "workers": workers}, grad_noise=True)  # the noise-scale run's layout, validated
    except UsageError as exc:
        raise UsageError(f"recommend reads the gradient noise of the run's own layout: {exc}") from None
    check_out(out)


def usable_knee(batches: dict[str, Any]) -> int:
    """find-batch's knee, at most its batch to use: a knee probed above the largest batch less the margin barely
    fitted in the search, which is what the margin keeps a run away from."""
    return min(batches["knee_batch"], batches["safe_batch"])


class StepsBound(NamedTuple):
    """The largest per-worker batch that leaves MIN_STEPS_PER_EPOCH optimizer steps an epoch, and why."""

    batch: int
    reason: str

    def note(self, samples: int, workers: int, accum: int) -> str:
        steps = -(-samples // (workers * accum * self.batch))
        if steps < MIN_STEPS_PER_EPOCH:
            return (
                f"{samples:,} training samples give {workers} workers only {steps} optimizer steps an epoch even at "
                f"batch 1: fewer than {MIN_STEPS_PER_EPOCH}; more data, or fewer workers, would give the schedule "
                "room"
            )
        return (
            f"find-batch searched up to {self.batch:,} a worker: a larger batch would leave {workers} worker(s) fewer "
            f"than {MIN_STEPS_PER_EPOCH} optimizer steps an epoch on {samples:,} training samples"
        )


def steps_bound(samples: int, workers: int, accum: int) -> StepsBound:
    batch = max(1, samples // (MIN_STEPS_PER_EPOCH * workers * accum))
    return StepsBound(batch, f"at least {MIN_STEPS_PER_EPOCH} optimizer steps an epoch")


@dataclass
class BatchChoice:
    """The per-worker batch chosen from find-batch's and noise-scale's measurements, with the options
    weighed, why each was kept or ruled out, and the notes a user reads."""

    workers: int
    samples: int
    knee: int
    largest: int
    largest_limited_by: str
    critical: float | None
    upper: float | None  # the critical batch plus two standard errors
    cap_name: str
    cap: float
    below_knee_allowed: bool
    options: dict[int, list[str]]
    times: dict[int, float]  # predicted time to the same loss of each option (empty without a noise scale)
    per_worker: int
    notes: list[str]

    @classmethod
    def measured(cls, batches: dict[str, Any], noise: dict[str, Any], workers: int, samples: int) -> BatchChoice:
        knee, largest = usable_knee(batches), batches["safe_batch"]
        notes: list[str] = []
        critical = noise["critical_batch"]
        caps = {"critical batch (noise scale)": critical, "√(training samples)": math.isqrt(samples)}
        cap_name, cap = min(((k, v) for k, v in caps.items() if v), key=lambda kv: kv[1])
        # Below the knee a device idles; only the noise scale, beyond its error bar (two standard
        # errors), is evidence that a smaller global batch trains better. A rule of thumb is not.
        stderr = noise.get("b_simple_stderr")
        upper = critical + 2 * stderr if critical and stderr is not None else None
        below_knee_allowed = (
            workers * knee > cap and cap_name.startswith("critical") and upper is not None and upper < workers * knee
        )
        # The options weighed: the knee, and the largest batch each cap allows a worker.
        options: dict[int, list[str]] = {knee: ["the knee"]}
        for name, value in caps.items():
            if value:
                options.setdefault(max(1, min(largest, int(value // workers))), []).append(
                    f"the {name} / {workers} workers"
                )
        choice = cls(
            workers=workers,
            samples=samples,
            knee=knee,
            largest=largest,
            largest_limited_by=batches["limited_by"],
            critical=critical,
            upper=upper,
            cap_name=cap_name,
            cap=cap,
            below_knee_allowed=below_knee_allowed,
            options=options,
            times={},
            per_worker=knee,
            notes=notes,
        )
        allowed = [b for b in options if choice.ruled_out(b) is None]
        if critical:
            rates = samples_per_s_at(batches["probes"])
            choice.times = {b: time_to_loss(b, workers, critical, rates(b)) for b in options}
            choice.per_worker = min(allowed, key=choice.times.get)
        else:
            choice.per_worker = max(allowed)  # no noise scale, no time model: the most the cap allows
        choice.notes.extend(choice._cap_notes())
        if choice.times:
            notes.append(
                time_to_loss_note(options, choice.times, rates, choice.per_worker, workers, critical, choice.ruled_out)
            )
        return choice

    @property
    def global_batch(self) -> int:
        return self.workers * self.per_worker

    def ruled_out(self, batch: int) -> str | None:
        if batch < self.knee and not self.below_knee_allowed:
            return "below the knee, where a worker idles, and the noise scale does not rule out the knee's global batch"
        # A worker's batch of 1 is the least there is: N workers above the cap even there still get it.
        if self.workers * batch > self.cap and batch > 1 and (batch != self.knee or self.below_knee_allowed):
            return f"its global batch {self.workers * batch:,} exceeds the {self.cap_name} {self.cap:,.0f}"
        return None

    def _cap_notes(self) -> list[str]:
        workers, knee, cap, upper = self.workers, self.knee, self.cap, self.upper
        if self.global_batch > cap and self.below_knee_allowed:
            return [
                f"{workers} workers exceed the critical batch {self.critical:.0f} (+2 standard errors: {upper:.0f}) "
                f"even at 1 sample a worker{f', below the knee batch {knee}' if knee > 1 else ''}: "
                f"{max(1, int(cap))} worker(s) would stay within it"
            ]
        if self.per_worker < knee:
            return [
                f"{workers} workers x the knee batch {knee} exceed the critical batch {self.critical:.0f} "
                f"(+2 standard errors: {upper:.0f}): each worker runs below its knee; "
                f"{max(1, int(cap // knee))} worker(s) would use theirs fully"
            ]
        if workers * knee > cap:
            return [
                f"{workers} workers x the knee batch {knee} exceed the {self.cap_name} {cap:.0f}, but "
                + (
                    f"within its error bar (+2 standard errors: {upper:.0f})"
                    if self.cap_name.startswith("critical") and upper is not None
                    else "that is not a measurement of this model"
                )
                + ": each worker keeps its knee batch, below which it idles"
            ]
        return []

    def fields(self, margin: float) -> dict[str, Any]:
        """recommend.json's per_worker_batch and global_batch."""
        times, per_worker = self.times, self.per_worker
        return {
            "per_worker_batch": {
                "value": per_worker,
                "source": f"find-batch: knee {self.knee}, largest {self.largest} (limited by "
                f"{self.largest_limited_by}"
                + (f", less a {margin:.0%} margin" if self.largest_limited_by == "memory" else "")
                + "); "
                + (
                    f"the global batch within the {self.cap_name} {self.cap:,.0f}; "
                    if self.global_batch <= self.cap
                    else f"the global batch above the {self.cap_name} {self.cap:,.0f}, at "
                    + ("the knee (note); " if per_worker == self.knee else "1 a worker, the least (note); ")
                )
                + (
                    "of the options, the shortest predicted time to the same loss (note)"
                    if times
                    else "no noise scale to predict the time to a loss: the largest batch not ruled out"
                ),
                "options": [
                    {
                        "batch": b,
                        "global_batch": self.workers * b,
                        "suggested_by": by,
                        "relative_time_to_loss": times[b] / times[per_worker] if times else None,
                        "ruled_out": self.ruled_out(b),
                    }
                    for b, by in sorted(self.options.items())
                ],
            },
            "global_batch": {
                "value": self.global_batch,
                "source": f"{self.workers} x {per_worker}; {self.cap_name} {self.cap:.0f} (critical batch "
                f"{self.critical and round(self.critical)}, √{self.samples} = {math.isqrt(self.samples)})",
            },
        }


def _lr_fields(lrs: dict[str, Any], global_batch: int, optimizer: str, epochs: int) -> dict[str, Any]:
    """recommend.json's LR, its scaling and warmup, and the optimizer hint, from lr-find's result."""
    from paratrain.engine.lr import scaled_lr

    rule = lr_find_module.scaling_rule(optimizer)
    base_lr, base_batch = lrs["suggested_lr"], lrs["global_batch_size"]
    lr = scaled_lr(base_lr, global_batch, base_batch, rule)
    ratio = global_batch / base_batch
    warmup = 0.0
    if ratio > 1:
        warmup = min(5.0, max(1.0, round(epochs * GOYAL_WARMUP_FRACTION, 1)))
        if warmup >= epochs:
            warmup = epochs / 2
    # A hint, not a switch: the LR was found for the run's optimizer, and LARS/LAMB's layer-wise
    # trust ratio changes what an LR means, so the command keeps the optimizer lr-find measured.
    adaptive = ("lamb" if rule == "sqrt" else "lars") if ratio > GOYAL_MAX_RATIO else None
    return {
        "lr": {
            "value": lr,
            "source": f"lr-find at batch {base_batch}: {base_lr:.3g} ({lrs['rule']}), "
            f"{rule} scaling to {global_batch} ({'Goyal et al. 2017' if rule == 'linear' else 'You et al. 2019'})",
        },
        "base_lr": base_lr,
        "base_batch_size": base_batch,
        "lr_scaling": rule,
        "warmup_epochs": {
            "value": warmup,
            "source": "no scaling, no warmup"
            if ratio <= 1
            else f"Goyal et al. 2017: 5 of 90 epochs, here {GOYAL_WARMUP_FRACTION:.1%} of --epochs {epochs} "
            "(at least 1, at most 5)",
        },
        "optimizer": {
            "value": optimizer,
            "source": f"global batch {ratio:.0f}x the LR's base batch "
            + (
                f"> {GOYAL_MAX_RATIO}x: consider --optimizer {adaptive}, layer-wise adaptation (You et al. 2017, "
                f"2019), and run recommend again with it, so that lr-find measures its LR"
                if adaptive
                else f"<= {GOYAL_MAX_RATIO}x: {optimizer} with scaling and warmup suffices (Goyal et al. 2017)"
            ),
        },
    }


def _schedule_field(schedule: str | None) -> dict[str, Any]:
    # The LR found is the largest that trains stably; held constant it keeps the late epochs noisy.
    # Measured (docs/batch-size.md): cifar10-cnn at global batch 222 plateaued at 53-58 % over
    # 20 constant-LR epochs and reached 62 % in 10 with cosine decay.
    return {
        "value": schedule or "cosine",
        "source": "--schedule as given"
        if schedule
        else "cosine decay to zero after the warmup (SGDR, Loshchilov & Hutter 2017): the found LR is the "
        "largest that trains stably, and decaying it lets the last epochs converge",
    }


def samples_per_s_at(probes: list[dict[str, Any]]) -> Callable[[int], float]:
    """find-batch's samples/s at any batch: as measured where it probed, linear between the probes
    either side, the nearest probe's outside them."""
    points = sorted((p["batch"], p["samples_per_s"]) for p in probes if p["fits"])

    def rate(batch: int) -> float:
        for (b0, r0), (b1, r1) in itertools.pairwise(points):
            if b0 <= batch <= b1:
                return r0 + (r1 - r0) * (batch - b0) / (b1 - b0)
        return points[0][1] if batch < points[0][0] else points[-1][1]

    return rate


def time_to_loss(batch: int, workers: int, b_noise: float, samples_per_s: float) -> float:
    """Wall time to a given loss, divided by S_min: McCandlish et al. 2018's steps
    S = S_min (1 + B_noise / B) at the global batch B = workers x batch, each step taking a worker
    batch / samples_per_s (its throughput at that batch; the workers step together)."""
    return (1 + b_noise / (workers * batch)) * batch / samples_per_s


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"


def time_to_loss_note(
    options: dict[int, list[str]],
    times: dict[int, float],
    rates: Callable[[int], float],
    chosen: int,
    workers: int,
    b_noise: float,
    ruled_out: Callable[[int], str | None],
) -> str:
    """The options' predicted times to the same loss, relative to the chosen one, and why it was chosen."""
    described = []
    for batch, by in sorted(options.items()):
        why_not = ruled_out(batch)
        verdict = "chosen" if batch == chosen else ("slower" if why_not is None else f"ruled out: {why_not}")
        described.append(
            f"{batch:,} a worker ({', '.join(by)}; global {workers * batch:,}, {rates(batch):,.0f} samples/s): "
            f"{_times(times[batch] / times[chosen])}, {verdict}"
        )
    fastest = min(times.values()) == times[chosen]
    among = "the options" if fastest else "the options not ruled out"
    return (
        f"time to the same loss, relative to the chosen batch (McCandlish et al. 2018: steps S = S_min (1 + B_noise/B) "
        f"at the global batch B, with B_noise the critical batch {b_noise:,.0f}; a step takes a worker its batch / "
        f"find-batch's samples/s at that batch, interpolated between probes; communication left out): "
        + "; ".join(described)
        + f". {chosen:,} a worker wins: of {among}, its steps to the loss times "
        "the time a step takes is the smallest"
        + (
            ""
            if fastest
            else " (the model counts steps to a training loss; the bounds also stand for what it leaves out: a global "
            "batch "
            "beyond the critical batch may generalise worse, Keskar et al. 2016, and below the knee a worker idles)"
        )
    )


def _batch_schedule_field(for_the_run: dict[str, Any], choice: BatchChoice) -> dict[str, Any]:
    """recommend.json's batch_schedule: fixed, or a growing batch that starts at the recommended one and may
    grow, per rank, up to what find-batch measured to fit."""
    kind = for_the_run.get("batch_schedule", "fixed")
    if kind == "fixed":
        return {"value": "fixed", "source": "the default: one batch for the whole run"}
    grows = choice.largest >= 2 * choice.per_worker
    return {
        "value": kind,
        "max_batch_size": choice.largest if grows else None,
        "source": f"--batch-schedule {kind} as given: it starts at the recommended batch and "
        + (
            f"grows per rank up to find-batch's largest that fits, {choice.largest}, then by accumulation"
            if grows
            else f"grows by accumulation (find-batch's largest that fits, {choice.largest}, is not twice the start)"
        )
        + (", while its measured goodput rises" if kind == "adaptive" else ""),
    }


def train_command(train: dict[str, Any], result: dict[str, Any]) -> str:
    """The `paratrain train` command that runs the recommendation."""
    growth = result["batch_schedule"]
    flags = {
        **train,
        "workers": result["workers"],
        "batch_size": result["per_worker_batch"]["value"],
        "lr": f"{result['base_lr']:.4g}",
        "base_batch_size": result["base_batch_size"],
        "lr_scaling": result["lr_scaling"],
        "optimizer": result["optimizer"]["value"],
        "schedule": result["schedule"]["value"],
        **(
            {"batch_schedule": growth["value"], "max_batch_size": growth["max_batch_size"]}
            if growth["value"] != "fixed"
            else {}
        ),
    }
    if result["warmup_epochs"]["value"]:
        flags["warmup_epochs"] = result["warmup_epochs"]["value"]
    words = ["paratrain", "train"]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value not in (False, None):
            words += [flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    return shlex.join(words)
