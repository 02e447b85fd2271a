"""torchtitan's three H100 points (benchmarks/planner_published.py) planned with the h100's bf16 peak at each end of
the range torchtitan gives for its parts: "HBM2e based lower TDP SXM H100 (95GB) ... the actual peak TFLOPs number
is between SXM and NVL, and we don't know its exact value" (docs/performance.md @ 3faaa1a, footnote 1). The SXM5's
989.4 TFLOP/s is the plan's `h100`; the NVL's 835 the lower end. Everything else of the device is unchanged.

    .venv/bin/python benchmarks/planner_h100_peak.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # llama.py, as PYTHONPATH=benchmarks gives the CLI

from planner_published import CHECKPOINTING, LAYOUTS, LLM_POINTS

from paratrain.cli import main
from paratrain.plan import devices

PEAKS = {"SXM5 (the plan's h100)": 989.4e12, "NVL (the lower end)": 835e12}
COMMON = ["--dataset", "text", "--device", "h100", "--precision", "bf16", "--optimizer", "adamw", "--strategy", "fsdp"]
COMMON += ["--interconnect", "ib-ndr", "--json"]  # as planner_published.py plans them


def h100_points() -> list[tuple[str, int, int, int, list[str], str, int]]:
    """planner_published.py's H100 points, each as (model, GPUs, global batch, sequence, plan flags, the row's
    strategy, published tokens/s a GPU)."""
    points = []
    for _, model, device, gpus, layout, batch, seq, checkpointing, tokens, _ in LLM_POINTS:
        if device == "h100":
            strategy, tp, split = LAYOUTS[layout]
            flags = ["--seq-len", str(seq), *split, *CHECKPOINTING[checkpointing]]
            points.append((model, gpus, batch * gpus // tp, seq, flags, strategy, tokens))
    return points


def tokens_per_gpu(model: str, gpus: int, batch: int, seq: int, flags: list[str], strategy: str) -> float:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        argv = ["plan", "--model", f"llama:{model}", *COMMON, "--gpus", str(gpus), "--global-batch", str(batch), *flags]
        assert main(argv) == 0
    row = next(r for r in json.loads(out.getvalue())["rows"] if r["devices"] == gpus and r["strategy"] == strategy)
    return row["samples_per_s"] * seq / gpus


def table() -> None:
    sxm = devices.GPUS["h100"]
    print("| point | published | " + " | ".join(f"planned, peak of the {name}" for name in PEAKS) + " |")
    print("|---|---|" + "---|" * len(PEAKS))
    for model, gpus, batch, seq, flags, strategy, published in h100_points():
        cells = []
        for peak in PEAKS.values():
            devices.GPUS["h100"] = dataclasses.replace(sxm, peak_flops={**sxm.peak_flops, "bf16": peak})
            tokens = tokens_per_gpu(model, gpus, batch, seq, flags, strategy)
            cells.append(f"{tokens:,.0f} ({(tokens - published) / published:+.1%})")
        devices.GPUS["h100"] = sxm
        print(f"| {model}, {gpus} H100, {strategy} | {published:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    table()
