"""`paratrain noise-scale`: the gradient noise scale B_simple, measured during a short run.

McCandlish, Kaplan, Amodei 2018 ("An Empirical Model of Large-Batch Training", arXiv:1812.06162):
with G the true gradient and Σ the per-sample gradient covariance, B_simple = tr(Σ)/|G|² predicts
the critical batch size, beyond which a larger batch buys few fewer steps. Steps and examples to
reach a given loss trade off as S = S_min(1 + B_noise/B) and E = E_min(1 + B/B_noise); B_simple
stands in for B_noise (they agree when the Hessian is a multiple of the identity).

Estimator (their Appendix A): the squared norm of a batch-B mean gradient has expectation
E|G_B|² = |G|² + tr(Σ)/B, so two batch sizes b < B give unbiased estimates
    |G|²  ≈ (B|G_B|² − b|G_b|²) / (B − b)      tr(Σ) ≈ (|G_b|² − |G_B|²) / (1/b − 1/B)
The run records |G_b|² and |G_B|² every step (`--grad-noise`, engine/grad_noise.py: in data-parallel
training each rank's gradient is the small batch and the average the big one; on one worker the
first micro-batch and the whole accumulated step). Data-parallel ranks' small-batch norms are
averaged (each is an unbiased estimate of the same thing). Single-step estimates are very noisy (and
|G|² can come out negative), so exponential moving averages of |G|² and tr(Σ) are kept separately and
their ratio is the estimate, not an average of per-step ratios (which would be biased).

Uncertainty: the delta-method standard error of that ratio, treating steps as independent:
var(R) ≈ Σ w_i² (t_i − R g_i)² / (Σ w_i g_i)² with the moving average's weights w_i. It reflects the
step-to-step noise only; consecutive steps are correlated through the weights, so it is a lower
bound when training moves fast.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from paratrain.batch import (
    check_train_flags,
    clear_measurement_run,
    run_config,
    steps_run_config,
    train_samples,
    write_result,
)
from paratrain.engine.batch_schedule import two_batch_estimates
from paratrain.errors import RunFailed, UsageError
from paratrain.runs import RunDir

RESULT_FILE = "noise_scale.json"
RUN_NAME = "noise-scale-run"
# Fewer steps give an estimate dominated by the noise of single steps (their relative spread is
# of the order of 1 on the workloads here) and too short a trend to read.
MIN_STEPS = 20


def read_norms(run_dir: Path) -> list[dict[str, Any]]:
    """Per step: the ranks' mean small-batch norm, the big-batch norm and the batch sizes."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((Path(run_dir) / "grad_noise").glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                by_step.setdefault(record["step"], []).append(record)
    steps = []
    for step in sorted(by_step):
        records = by_step[step]
        steps.append(
            {
                "step": step,
                "small_sq": sum(r["small_sq"] for r in records) / len(records),
                "big_sq": records[0]["big_sq"],
                "small_batch": records[0]["small_batch"],
                "big_batch": records[0]["big_batch"],
            }
        )
    return steps


def estimate(norms: list[dict[str, Any]], ema_steps: int) -> dict[str, Any]:
    """B_simple as the ratio of the moving averages of |G|² and tr(Σ), over the run and at its end."""
    beta = 1 - 1 / ema_steps
    ema_g2 = ema_trace = 0.0
    series = []
    g2s, traces = [], []
    for record in norms:
        g2, trace = two_batch_estimates(
            record["small_sq"], record["big_sq"], record["small_batch"], record["big_batch"]
        )
        g2s.append(g2)
        traces.append(trace)
        # Both averages start at 0 and share beta, so their ratio needs no bias correction.
        ema_g2 = beta * ema_g2 + (1 - beta) * g2
        ema_trace = beta * ema_trace + (1 - beta) * trace
        series.append({"step": record["step"], "b_simple": _ratio(ema_trace, ema_g2), "g2": ema_g2, "trace": ema_trace})
    n = len(norms)
    weights = [(1 - beta) * beta ** (n - 1 - i) for i in range(n)]
    final, final_err = _ratio_with_error(traces, g2s, weights)
    overall, overall_err = _ratio_with_error(traces, g2s, [1.0] * n)
    return {
        "b_simple": final,
        "b_simple_stderr": final_err,
        "b_simple_run": overall,
        "b_simple_run_stderr": overall_err,
        "g2": ema_g2,
        "trace": ema_trace,
        "series": series,
    }


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 and numerator > 0 else None


def _ratio_with_error(traces: list[float], g2s: list[float], weights: list[float]) -> tuple[float | None, float | None]:
    total_w = sum(weights)
    trace = sum(w * t for w, t in zip(weights, traces)) / total_w
    g2 = sum(w * g for w, g in zip(weights, g2s)) / total_w
    ratio = _ratio(trace, g2)
    if ratio is None:
        return None, None
    variance = sum((w / total_w) ** 2 * (t - ratio * g) ** 2 for w, t, g in zip(weights, traces, g2s)) / g2**2
    return ratio, math.sqrt(variance)


def batch_curve(b_noise: float) -> list[dict[str, float]]:
    """Predicted steps and examples to reach the same loss, relative to their minima, by batch size."""
    top = 2 ** math.ceil(math.log2(max(2.0, 8 * b_noise)))
    batches = [2**k for k in range(int(math.log2(top)) + 1)]
    return [{"batch": b, "steps_vs_min": 1 + b_noise / b, "examples_vs_min": 1 + b / b_noise} for b in batches]


def short_steps(per_rank: int, batch: int, accum: int, steps: int) -> int:
    """The steps with a short batch (each epoch's last: short of whole micro-batches or of micro-steps) before the
    `steps`-th full one, on `per_rank` samples a rank: they are not recorded, so the run takes that many more."""
    step_samples = batch * accum
    full = per_rank // step_samples
    if full == 0:
        raise UsageError(
            f"a step of {step_samples} samples per rank (--batch-size x --grad-accum) is more than a rank's "
            f"{per_rank} training samples; lower --batch-size"
        )
    per_epoch = math.ceil(math.ceil(per_rank / batch) / accum)
    # An epoch's full steps come first: the short ones end the epochs before the one the last full step is in.
    return (per_epoch - full) * ((steps - 1) // full)


def measure_noise_scale(train: dict[str, Any], out: Path, steps: int, ema_steps: int | None = None) -> dict[str, Any]:
    """Record `steps` optimizer steps of full batches with --grad-noise into OUT/noise-scale-run (the run
    takes as many more as it has short end-of-epoch steps); write OUT/noise_scale.json and return it."""
    check_train_flags(train, "noise-scale")
    if steps < MIN_STEPS:
        raise UsageError(
            f"--steps {steps} is too few for an estimate: the noise scale needs at least {MIN_STEPS} optimizer "
            f"steps (a few hundred give a tighter one); use --steps {MIN_STEPS} or more"
        )
    ema = ema_steps or max(10, steps // 4)
    values = dict(train)
    workers = run_config(values).data_parallel_size
    if workers == 1 and "grad_accum" not in values:
        # One worker compares a micro-batch with the whole step: two micro-batches are the fewest that do.
        values["grad_accum"] = 2
    run_dir = Path(out) / RUN_NAME
    layout = run_config(values)
    per_rank = -(-train_samples(layout) // layout.data_parallel_size)
    more = short_steps(per_rank, layout.batch_size, layout.grad_accum, steps)
    cfg = steps_run_config(values, steps + more, grad_noise=True, quiet=True, run_dir=run_dir)
    clear_measurement_run(run_dir)
    from paratrain.launch.builtin import train as run_training

    try:
        run_training(cfg)
    except RunFailed:
        if RunDir(run_dir).summary_record().status != "diverged":
            raise
    summary = RunDir(run_dir).summary_record()
    grad_noise = summary.grad_noise or {}
    norms = read_norms(run_dir)
    if len(norms) < MIN_STEPS:
        raise RunFailed(
            f"the run recorded {len(norms)} steps of gradient norms ({summary.status}); the estimate needs "
            f"{MIN_STEPS}: see {run_dir}"
        )
    result = {
        "train": json.loads(json.dumps(train, default=str)),
        "options": {"steps": steps, "ema_steps": ema_steps},
        "run_dir": str(run_dir),
        "steps": len(norms),
        "ema_steps": ema,
        "source": grad_noise.get("source"),
        "small_batch": norms[-1]["small_batch"],
        "big_batch": norms[-1]["big_batch"],
        "ranks": grad_noise.get("ranks", 1),
        "status": summary.status,
        **estimate(norms, ema),
    }
    result["critical_batch"] = result["b_simple"]
    result["curve"] = batch_curve(result["b_simple"]) if result["b_simple"] else []
    write_result(Path(out) / RESULT_FILE, result)
    return result
