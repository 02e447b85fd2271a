"""`paratrain lr-find`: the LR range test.

One short run whose LR grows exponentially from --lr-min to --lr-max (`--schedule range-test`,
engine/lr.py), logging the loss of every step. The loss is smoothed with a bias-corrected moving
average (β = 0.98, as fastai and torch-lr-finder do) and the curve is cut where the smoothed loss
exceeds 4x its minimum (fastai's stop rule; the run itself stops when the loss becomes NaN or
infinite). The suggestion is fastai's "minimum/10": a tenth of the LR where the smoothed loss was
lowest, before it diverged. The LR of the steepest descent of the smoothed loss against log(LR)
(Lightning's and torch-lr-finder's rule; the first tenth of the curve skipped, where the average
is still settling) is reported beside it, not used: on cifar10-cnn (100 steps, 1e-6 to 1, batch
111) it sat at 0.33, just below the loss's minimum at 0.43, and 10 epochs at that LR scaled
to 2 workers never left chance accuracy (docs/batch-size.md). The suggested LR belongs to the batch the sweep
ran at; it is also given
scaled to --target-batch by the rule the optimizer follows (linear for SGD and LARS: Goyal et al.
2017; square root for the Adam family: You et al. 2019).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from paratrain.batch import check_train_flags, clear_measurement_run, steps_run_config, write_result
from paratrain.engine.lr import scaled_lr
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import RunDir

RESULT_FILE = "lr_find.json"
RUN_NAME = "lr-find-run"
SMOOTHING = 0.98
DIVERGED_ABOVE = 4.0  # x the lowest smoothed loss
MIN_STEPS = 20
RULE = "minimum/10: a tenth of the LR of the lowest smoothed loss (fastai)"


def scaling_rule(optimizer: str) -> str:
    return "sqrt" if optimizer in ("adam", "adamw", "lamb") else "linear"


def smooth(losses: list[float], beta: float = SMOOTHING) -> list[float]:
    average, out = 0.0, []
    for i, loss in enumerate(losses, 1):
        average = beta * average + (1 - beta) * loss
        out.append(average / (1 - beta**i))
    return out


def suggest(lrs: list[float], losses: list[float]) -> dict[str, Any]:
    """The curve up to divergence, the suggestion (fastai's minimum/10) and the steepest descent."""
    smoothed = smooth(losses)
    best = float("inf")
    end = len(smoothed)
    for i, value in enumerate(smoothed):
        best = min(best, value)
        if not math.isfinite(value) or value > DIVERGED_ABOVE * best:
            end = i
            break
    diverged_at = lrs[end] if end < len(lrs) else None
    lrs, smoothed = lrs[:end], smoothed[:end]
    if len(smoothed) < 5:
        raise RunFailed(f"the loss diverged after {len(smoothed)} steps of the range test; lower --lr-min")
    skip = len(smoothed) // 10
    slopes = [
        (smoothed[i + 1] - smoothed[i - 1]) / (math.log(lrs[i + 1]) - math.log(lrs[i - 1]))
        for i in range(max(1, skip), len(smoothed) - 1)
    ]
    steepest = max(1, skip) + min(range(len(slopes)), key=slopes.__getitem__)
    lowest = min(range(len(smoothed)), key=smoothed.__getitem__)
    return {
        "suggested_lr": lrs[lowest] / 10,
        "steepest_lr": lrs[steepest],
        "minimum_lr": lrs[lowest],
        "diverged_at_lr": diverged_at,
        "curve_steps": end,
        "smoothed": smoothed,
    }


def find_lr(
    train: dict[str, Any],
    out: Path,
    steps: int = 100,
    lr_min: float = 1e-6,
    lr_max: float = 10.0,
    target_batch: int | None = None,
) -> dict[str, Any]:
    """Run the range test into OUT/lr-find-run; write OUT/lr_find.json and return it."""
    check_train_flags(train, "lr-find")
    for owned in ("lr", "lr_scaling", "warmup_epochs"):
        if owned in train:
            raise UsageError(
                f"paratrain lr-find sets --{owned.replace('_', '-')} itself (the sweep runs --lr-min to "
                "--lr-max unscaled, without warmup); drop it"
            )
    if steps < MIN_STEPS:
        raise UsageError(
            f"--steps {steps} is too few for a range test: it needs at least {MIN_STEPS} steps to smooth the "
            f"loss (100 to 300 are usual); use --steps {MIN_STEPS} or more"
        )
    cfg = steps_run_config(
        train,
        steps,
        lr=lr_min,
        lr_end=lr_max,
        schedule="range-test",
        lr_scaling="none",
        log_every=1,
        quiet=True,
        run_dir=Path(out) / RUN_NAME,
    )
    run = RunDir(cfg.run_dir)
    clear_measurement_run(run.path)
    from paratrain.launch.builtin import train as run_training

    try:
        run_training(cfg)
        diverged = False
    except RunFailed:
        if run.summary_record().status != "diverged":
            raise
        diverged = True
    steps_logged = [e for e in run.read_metrics() if e["event"] == "step"]
    lrs, losses = [e["lr"] for e in steps_logged], [e["loss"] for e in steps_logged]
    found = suggest(lrs, losses)
    batch = cfg.global_batch_size
    target = target_batch or batch
    rule = scaling_rule(cfg.optimizer)
    result = {
        "train": json.loads(json.dumps(train, default=str)),
        "options": {"steps": steps, "lr_min": lr_min, "lr_max": lr_max, "rule": RULE},
        "run_dir": str(run.path),
        "lr_min": lr_min,
        "lr_max": lr_max,
        "steps": len(steps_logged),
        "stopped_by_nan": diverged,
        "global_batch_size": batch,
        "optimizer": cfg.optimizer,
        "rule": RULE,
        **{k: v for k, v in found.items() if k != "smoothed"},
        "curve": [{"lr": lr, "loss": loss, "smoothed": s} for lr, loss, s in zip(lrs, losses, found["smoothed"])],
        "scaled": {
            "global_batch_size": target,
            "scaling": rule,
            "lr": scaled_lr(found["suggested_lr"], target, batch, rule),
        },
    }
    write_result(Path(out) / RESULT_FILE, result)
    return result
