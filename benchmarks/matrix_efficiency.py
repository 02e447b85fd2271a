"""The plan's transformer efficiency (plan/devices.py, `matrix_efficiency`), derived, and checked on the rows
it was not derived from.

MosaicML's MPT training benchmarks (mosaicml/llm-foundry, scripts/train/benchmarking/README.md, tables "H100
80GB BF16" and "A100 80GB with 1600 Gbps node-node interconnect"): 8 GPUs of one node, FSDP FULL_SHARD,
amp_bf16, tokens/s per GPU. The figure is the share of the bf16 peak at which `paratrain plan` of mpt.py's
MPT-7B, sequence 2,048, micro-batch 6, no activation checkpointing, gives the published tokens/s per GPU,
with the memory-bound operators' bytes (profile.py) timed apart at the device's memory bandwidth: the
matrix products' own share. The other rows (longer sequences, 13B and 30B, checkpointed) are predicted with
it. Each row is planned as one micro-batch a step (the plan has no gradient accumulation; MPT's accumulated
2-21), so the optimizer's step, a few milliseconds against seconds, is counted once a micro-batch.

    .venv/bin/python benchmarks/matrix_efficiency.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # mpt.py, as PYTHONPATH=benchmarks gives the CLI

from paratrain.cli import main
from paratrain.plan import devices

GPUS = 8
# (device, model, sequence, micro-batch a GPU, activation checkpointing, published tokens/s per GPU)
DERIVED_FROM = [("h100", "mpt_7b", 2048, 6, False, 10643), ("a100", "mpt_7b", 2048, 6, False, 4641)]
HELD_OUT = [
    ("h100", "mpt_7b", 4096, 16, True, 8611),
    ("h100", "mpt_7b", 8192, 8, True, 6935),
    ("h100", "mpt_13b", 2048, 2, False, 4792),
    ("h100", "mpt_13b", 4096, 10, True, 4717),
    ("h100", "mpt_30b", 2048, 3, True, 2002),
    ("a100", "mpt_7b", 4096, 16, True, 3684),
    ("a100", "mpt_7b", 8192, 8, True, 3206),
    ("a100", "mpt_13b", 2048, 2, False, 2262),
    ("a100", "mpt_13b", 4096, 10, True, 2060),
    ("a100", "mpt_30b", 2048, 3, True, 916),
]


def command(device: str, model: str, seq: int, micro: int, checkpointed: bool) -> list[str]:
    argv = ["plan", "--model", f"mpt:{model}", "--dataset", "text", "--seq-len", str(seq), "--device", device]
    argv += ["--precision", "bf16", "--optimizer", "adamw", "--strategy", "fsdp", "--gpus", str(GPUS)]
    argv += ["--global-batch", str(micro * GPUS), "--json"]
    return argv + (["--activation-checkpointing", "full"] if checkpointed else [])


def tokens_per_gpu(argv: list[str], seq: int) -> float:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    row = next(r for r in json.loads(out.getvalue())["rows"] if r["devices"] == GPUS and r["strategy"] == "fsdp")
    return row["samples_per_s"] * seq / GPUS


def with_efficiency(device: str, share: float) -> None:
    table = devices.GPUS[device]
    devices.GPUS[device] = dataclasses.replace(table, matrix_efficiency={"bf16": share, "fp16": share})


def derive(device: str, model: str, seq: int, micro: int, checkpointed: bool, published: float) -> float:
    """The share at which the plan gives the published tokens/s (bisection: the plan is monotone in it)."""
    low, high = 0.05, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        with_efficiency(device, mid)
        if tokens_per_gpu(command(device, model, seq, micro, checkpointed), seq) < published:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def main_table() -> None:
    shares = {}
    print("| device | derived from | published tokens/s/GPU | MFU published | share of the peak, memory-bound apart |")
    print("|---|---|---|---|---|")
    mfu = {"h100": "46.44 %", "a100": "64.23 %"}
    for device, model, seq, micro, checkpointed, published in DERIVED_FROM:
        shares[device] = derive(device, model, seq, micro, checkpointed, published)
        row = f"{model}, {seq}, micro-batch {micro} | {published:,} | {mfu[device]} | {shares[device]:.3f}"
        print(f"| {device} | {row} |")
    print()
    print("| device | model | sequence | micro-batch | checkpointing | published | planned (error) |")
    print("|---|---|---|---|---|---|---|")
    for device, model, seq, micro, checkpointed, published in HELD_OUT:
        with_efficiency(device, round(shares[device], 3))
        planned = tokens_per_gpu(command(device, model, seq, micro, checkpointed), seq)
        error = (planned - published) / published
        flag = "every block" if checkpointed else "none"
        print(f"| {device} | {model} | {seq:,} | {micro} | {flag} | {published:,} | {planned:,.0f} ({error:+.1%}) |")


if __name__ == "__main__":
    main_table()
