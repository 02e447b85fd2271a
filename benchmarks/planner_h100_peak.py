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

from paratrain.cli import main
from paratrain.plan import devices

PEAKS = {"SXM5 (the plan's h100)": 989.4e12, "NVL (the lower end)": 835e12}
COMMON = ["--dataset", "text", "--seq-len", "8192", "--device", "h100", "--precision", "bf16", "--optimizer", "adamw"]
COMMON += ["--strategy", "fsdp", "--interconnect", "ib-ndr", "--json"]
OPERATORS = ["--checkpoint-activations", "--checkpoint-activations-ops"]
# (model, GPUs, global batch, flags, the row's strategy, published tokens/s a GPU)
POINTS = [
    ("llama3_8b", 8, 16, OPERATORS, "fsdp", 5762),
    ("llama3_8b", 128, 256, OPERATORS, "fsdp", 5605),
    (
        "llama3_405b",
        128,
        32,
        ["--checkpoint-activations", "--tp", "8", "--sequence-parallel", "--loss-parallel"],
        "fsdp+tp",
        109,
    ),
]


def tokens_per_gpu(model: str, gpus: int, batch: int, flags: list[str], strategy: str) -> float:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        argv = ["plan", "--model", f"llama:{model}", *COMMON, "--gpus", str(gpus), "--global-batch", str(batch), *flags]
        assert main(argv) == 0
    row = next(r for r in json.loads(out.getvalue())["rows"] if r["devices"] == gpus and r["strategy"] == strategy)
    return row["samples_per_s"] * 8192 / gpus


def table() -> None:
    sxm = devices.GPUS["h100"]
    print("| point | published | " + " | ".join(f"planned, peak of the {name}" for name in PEAKS) + " |")
    print("|---|---|" + "---|" * len(PEAKS))
    for model, gpus, batch, flags, strategy, published in POINTS:
        cells = []
        for peak in PEAKS.values():
            devices.GPUS["h100"] = dataclasses.replace(sxm, peak_flops={**sxm.peak_flops, "bf16": peak})
            tokens = tokens_per_gpu(model, gpus, batch, flags, strategy)
            cells.append(f"{tokens:,.0f} ({(tokens - published) / published:+.1%})")
        devices.GPUS["h100"] = sxm
        print(f"| {model}, {gpus} H100, {strategy} | {published:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    table()
