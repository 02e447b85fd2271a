"""How much faster than a fixed batch any batch schedule could be, by the adaptive schedule's own model, from a run's
noise readings and the throughput measured at each batch (docs/batch-size.md, issue #30).

A sample in a global batch B counts 1 / (1 + B / B_noise) of one in a tiny batch (McCandlish et al. 2018), so a
schedule at batch B makes progress at throughput(B) / (1 + B / B_noise) a second. At each noise reading of a run
(its `noise` events: the batch it was at and B_noise), the best batch makes
    r = max over B of throughput(B) / throughput(b) x (B_noise + b) / (B_noise + B)
times the progress of the run's batch b. A schedule that took the best batch at every reading (an oracle that knew
B_noise exactly and paid nothing to change) would spend 1 / r of the time between readings, so it could reach the
run's end at most sum(t_i) / sum(t_i / r_i) times sooner, t_i the compared batch's time for the progress made
between reading i - 1 and i. If that is below a goal, no schedule reaches the goal on these devices at this budget,
whatever its rule. With `--against B` the oracle is compared with a fixed batch B instead of the run's own batch at
each reading (the readings taken as the noise scale at that point of training, whatever batch measured it).

The throughput at each batch comes from fixed-batch runs (`--fixed RUN_DIR...`: summary.json's global batch and
samples per second, epochs after the first); runs at the same batch are taken at their median.

    .venv/bin/python benchmarks/goodput_bound.py --fixed RUNS/fixed-*/seed0 -- RUNS/adaptive/seed*
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def throughputs(runs: list[Path]) -> dict[int, float]:
    """Samples a second at each global batch, the median over the runs at it."""
    seen: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        seen[int(summary["global_batch_size"])].append(float(summary["samples_per_s"]))
    return {batch: statistics.median(values) for batch, values in sorted(seen.items())}


def readings(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event.get("event") == "noise" and event.get("noise_scale")]


def best_gain(batch: int, noise: float, speed: dict[int, float]) -> tuple[float, int]:
    """The goodput of the best batch against `batch`'s at noise scale `noise`, and that batch."""
    gains = {b: speed[b] / speed[batch] * (noise + batch) / (noise + b) for b in speed}
    best = max(gains, key=gains.get)
    return gains[best], best


def fixed_seconds(points: list[dict], against: int | None, speed: dict[int, float]) -> list[float]:
    """The time the compared batch takes for the progress the run made up to each reading from the one before: the
    samples of the interval at the run's batch b, which a batch F needs (B_noise + F) / (B_noise + b) times of, at F's
    throughput (equal spans when the run stayed at F, as a run compared with its own batch does)."""
    spans, last = [], 0
    for point in points:
        batch, noise = point["global_batch"], point["noise_scale"]
        compared = against or batch
        samples = (point["step"] - last) * batch * (noise + compared) / (noise + batch)
        spans.append(samples / speed[compared])
        last = point["step"]
    return spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", type=Path, nargs="+", required=True, help="fixed-batch runs: the throughput")
    parser.add_argument(
        "--against", type=int, default=None, help="a fixed global batch to compare with (default: each reading's own)"
    )
    parser.add_argument("runs", type=Path, nargs="+", help="runs whose noise readings to read")
    args = parser.parse_args()
    speed = throughputs(args.fixed)
    if args.against is not None and args.against not in speed:
        parser.error(f"--against {args.against}: no fixed run at that global batch (measured: {sorted(speed)})")
    base = min(speed)
    print(
        "throughput: " + ", ".join(f"batch {b}: {s:.2f} samples/s ({s / speed[base]:.2f}x)" for b, s in speed.items())
    )
    for run in args.runs:
        points = [r for r in readings(run) if r["global_batch"] in speed]
        if not points:
            print(f"{run}: no noise readings at a batch with a measured throughput")
            continue
        gains = [best_gain(args.against or r["global_batch"], r["noise_scale"], speed) for r in points]
        ratios = [max(gain, 1.0) for gain, _ in gains]
        spans = fixed_seconds(points, args.against, speed)
        bound = sum(spans) / sum(span / r for span, r in zip(spans, ratios))
        noise = statistics.median(r["noise_scale"] for r in points)
        top, at = max(gains)
        print(
            f"{run}: {len(points)} readings, B_noise median {noise:.0f}; the best batch's goodput at most {top:.2f}x "
            f"(batch {at}); an oracle schedule at most {bound:.2f}x sooner"
        )


if __name__ == "__main__":
    main()
