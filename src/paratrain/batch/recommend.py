"""`paratrain recommend --workers N`: batch, LR, warmup, schedule and optimizer for N workers, from measurements.

The three measurements run in this order (each reused from OUT when the same flags made it):
1. find-batch on one worker: the largest per-worker batch that fits (less the safety margin) and the
   throughput knee. The per-worker batch stays within [knee, largest].
2. noise-scale on the N workers at the knee batch: B_simple, which stands in for the critical batch
   (McCandlish et al. 2018); with the HPC rule of thumb of a global batch under √(training samples),
   it caps the global batch: beyond the cap more batch buys few fewer steps and may generalise worse
   (Keskar et al. 2016; Shallue et al. 2018 measured the diminishing returns).
3. lr-find on one worker at the chosen per-worker batch: the base LR for that batch, scaled to the
   global batch by the optimizer's rule (linear for SGD/LARS, Goyal et al. 2017; square root for the
   Adam family, You et al. 2019), with Goyal et al.'s gradual warmup when the LR is scaled up.
An optimizer hint (LARS for SGD, LAMB for Adam) is given when the global batch is more than 32x the
LR's base batch: the largest ratio Goyal et al. trained with linear scaling and warmup alone
(8192 / 256); You et al. needed layer-wise adaptation beyond it. The command keeps the optimizer
lr-find measured. The schedule is cosine decay after the warmup unless --schedule is given.
"""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any, Callable, Optional

from paratrain.batch import check_train_flags, read_result, run_config, train_samples, write_result
from paratrain.batch import find_batch as find_batch_module
from paratrain.batch import lr_find as lr_find_module
from paratrain.batch import noise_scale as noise_scale_module
from paratrain.errors import UsageError

RESULT_FILE = "recommend.json"
CHOSEN = ("batch_size", "lr", "lr_scaling", "base_batch_size", "warmup_epochs", "workers")
GOYAL_MAX_RATIO = 32            # 8192 / 256: the largest batch ratio of Goyal et al. 2017
GOYAL_WARMUP_FRACTION = 5 / 90  # 5 warmup epochs of their 90


def recommend(train: dict[str, Any], workers: int, out: Path, noise_steps: int = 200, lr_steps: int = 100,
              max_batch: Optional[int] = None, on_stage: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """Measure (or reuse) find-batch, noise-scale and lr-find; write OUT/recommend.json and return it."""
    chosen = [k for k in train if k in CHOSEN]
    if chosen:
        raise UsageError(f"paratrain recommend chooses --{chosen[0].replace('_', '-')} itself; drop it")
    out = Path(out)
    cfg = run_config(train)
    samples = train_samples(cfg)
    # A --schedule given is for the recommended run; the measurement runs set their own LR.
    schedule = train.get("schedule")
    train = {k: v for k, v in train.items() if k != "schedule"}
    one = {**train, "workers": 1}
    # Everything that would stop a later stage is checked now, before the first measurement runs.
    for flag, steps, least in (("--noise-steps", noise_steps, noise_scale_module.MIN_STEPS),
                               ("--lr-steps", lr_steps, lr_find_module.MIN_STEPS)):
        if steps < least:
            raise UsageError(f"{flag} {steps} is too few: the measurement needs at least {least} optimizer steps; "
                             f"use {flag} {least} or more")
    for stage in ("find-batch", "noise-scale", "lr-find"):
        check_train_flags(train, stage)
    run_config({**train, "workers": workers}, grad_noise=True)     # the noise-scale run's layout, validated

    on_stage("find-batch")
    batches = (read_result(out / find_batch_module.RESULT_FILE, one, max_batch=max_batch)
               or find_batch_module.find_batch(one, out, max_batch=max_batch))
    knee, largest = batches["knee_batch"], batches["safe_batch"]
    # find-batch measures one worker on all the training samples; with N workers a rank holds a 1/N
    # share, and a step larger than it cannot be run (the noise-scale run at the knee would refuse).
    per_rank = samples // workers
    notes = []
    if largest > per_rank:
        notes.append(f"find-batch's knee {knee} and largest batch {largest} capped at a rank's {per_rank} training samples")
        knee, largest = min(knee, per_rank), per_rank

    on_stage("noise-scale")
    noise_train = {**train, "workers": workers, "batch_size": knee}
    noise = (read_result(out / noise_scale_module.RESULT_FILE, noise_train, steps=noise_steps)
             or noise_scale_module.measure_noise_scale(noise_train, out, noise_steps))
    critical = noise["critical_batch"]
    sqrt_rule = math.isqrt(samples)
    caps = {"critical batch (noise scale)": critical, "√(training samples)": sqrt_rule}
    cap_name, cap = min(((k, v) for k, v in caps.items() if v), key=lambda kv: kv[1])
    # Below the knee a device idles; only the noise scale, beyond its error bar (two standard
    # errors), is evidence that a smaller global batch trains better. A rule of thumb is not.
    stderr = noise.get("b_simple_stderr")
    upper = critical + 2 * stderr if critical and stderr is not None else None
    if workers * knee <= cap:
        per_worker = max(1, min(largest, int(cap // workers)))
    elif cap_name.startswith("critical") and upper is not None and upper < workers * knee:
        per_worker = max(1, int(cap // workers))
        notes.append(f"{workers} workers x the knee batch {knee} exceed the critical batch {critical:.0f} "
                     f"(+2 standard errors: {upper:.0f}): each worker runs below its knee; "
                     f"{max(1, int(cap // knee))} worker(s) would use theirs fully")
    else:
        per_worker = knee
        notes.append(f"{workers} workers x the knee batch {knee} exceed the {cap_name} {cap:.0f}, but "
                     + (f"within its error bar (+2 standard errors: {upper:.0f})" if cap_name.startswith("critical")
                        and upper is not None else "that is not a measurement of this model")
                     + ": each worker keeps its knee batch, below which it idles")
    global_batch = workers * per_worker

    on_stage("lr-find")
    lr_train = {**train, "workers": 1, "batch_size": per_worker}
    lrs = (read_result(out / lr_find_module.RESULT_FILE, lr_train, steps=lr_steps, rule=lr_find_module.RULE)
           or lr_find_module.find_lr(lr_train, out, steps=lr_steps, target_batch=global_batch))
    rule = lr_find_module.scaling_rule(cfg.optimizer)
    base_lr, base_batch = lrs["suggested_lr"], lrs["global_batch_size"]
    from paratrain.engine.lr import scaled_lr

    lr = scaled_lr(base_lr, global_batch, base_batch, rule)
    ratio = global_batch / base_batch
    warmup = 0.0
    if ratio > 1:
        warmup = min(5.0, max(1.0, round(cfg.epochs * GOYAL_WARMUP_FRACTION, 1)))
        if warmup >= cfg.epochs:
            warmup = cfg.epochs / 2
    # A hint, not a switch: the LR was found for the run's optimizer, and LARS/LAMB's layer-wise
    # trust ratio changes what an LR means, so the command keeps the optimizer lr-find measured.
    adaptive = ("lamb" if rule == "sqrt" else "lars") if ratio > GOYAL_MAX_RATIO else None
    result = {
        "train": json.loads(json.dumps(train, default=str)), "workers": workers,
        "per_worker_batch": {"value": per_worker, "source": f"find-batch: knee {knee}, largest that fits {largest} "
                             f"(margin {batches['margin']:.0%}); capped by the {cap_name} / {workers} workers"},
        "global_batch": {"value": global_batch, "source": f"{workers} x {per_worker}; {cap_name} {cap:.0f} "
                         f"(critical batch {critical and round(critical)}, √{samples} = {sqrt_rule})"},
        "lr": {"value": lr, "source": f"lr-find at batch {base_batch}: {base_lr:.3g} ({lrs['rule']}), "
               f"{rule} scaling to {global_batch} ({'Goyal et al. 2017' if rule == 'linear' else 'You et al. 2019'})"},
        "base_lr": base_lr, "base_batch_size": base_batch, "lr_scaling": rule,
        "warmup_epochs": {"value": warmup, "source": "no scaling, no warmup" if ratio <= 1 else
                          f"Goyal et al. 2017: 5 of 90 epochs, here {GOYAL_WARMUP_FRACTION:.1%} of --epochs {cfg.epochs} "
                          "(at least 1, at most 5)"},
        "optimizer": {"value": cfg.optimizer, "source": f"global batch {ratio:.0f}x the LR's base batch "
                      + (f"> {GOYAL_MAX_RATIO}x: consider --optimizer {adaptive}, layer-wise adaptation (You et al. 2017, "
                         f"2019), and run recommend again with it, so that lr-find measures its LR" if adaptive
                         else f"<= {GOYAL_MAX_RATIO}x: {cfg.optimizer} with scaling and warmup suffices (Goyal et al. 2017)")},
        # The LR found is the largest that trains stably; held constant it keeps the late epochs noisy.
        # Measured (docs/batch-size.md): cifar10-cnn at global batch 222 plateaued at 53-58 % over
        # 20 constant-LR epochs and reached 62 % in 10 with cosine decay.
        "schedule": {"value": schedule or "cosine",
                     "source": "--schedule as given" if schedule else
                     "cosine decay to zero after the warmup (SGDR, Loshchilov & Hutter 2017): the found LR is the "
                     "largest that trains stably, and decaying it lets the last epochs converge"},
        "notes": notes,
        "measurements": {"find_batch": str(out / find_batch_module.RESULT_FILE),
                         "noise_scale": str(out / noise_scale_module.RESULT_FILE), "lr_find": str(out / lr_find_module.RESULT_FILE)},
    }
    result["command"] = train_command(train, result)
    write_result(out / RESULT_FILE, result)
    return result


def train_command(train: dict[str, Any], result: dict[str, Any]) -> str:
    """The `paratrain train` command that runs the recommendation."""
    flags = {**train, "workers": result["workers"], "batch_size": result["per_worker_batch"]["value"],
             "lr": f"{result['base_lr']:.4g}", "base_batch_size": result["base_batch_size"],
             "lr_scaling": result["lr_scaling"], "optimizer": result["optimizer"]["value"],
             "schedule": result["schedule"]["value"]}
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
