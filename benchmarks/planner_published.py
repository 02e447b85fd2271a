"""`paratrain plan` against published multi-GPU measurements (docs/planner.md): prints each point's
published and predicted figures, the error, and the commands. Takes about two minutes here; no GPU
needed: the plan measures each model on the meta device.

Single-node: NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets, each model's README,
"Training performance results" (pytorch-21.03 container), 1 and 8 GPUs of a DGX A100 80GB and a
DGX-1 16GB. Per-GPU batches are those of the repository's configs.yml for each platform and
precision. ResNet-50's figures are the device table's calibration (its 1-GPU rows give the
efficiency, its 8-GPU rows the share a full node keeps: plan/devices.py), so they agree by
construction; ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d (dle_models.py) are the test.

Multi-node: Goyal et al. 2017 (arXiv:1706.02677), ResNet-50 on 8 to 256 P100 in servers of 8 joined
by 50 Gbit Ethernet, 32 images a GPU: "~90% scaling efficiency".

Large language models: torchtitan's docs/performance.md, Llama 3.1 8B with FSDP on 8 and 128 H100
(commit eaea6f6a2fa940f03a10906be1df3489cf30af85, tables 1 and 3, the rows without torch.compile or
Float8: tokens/s per GPU and peak memory), and the same file's earlier version (commit
041336434916bdc0f88c1f89fda176fd3c2092e4: Llama 3 8B / 70B and Llama 2 13B / 70B with FSDP on 64 A100
80GB, tokens/s per GPU), and between them (commit 3faaa1a0dee68ce028400e3dafd1735d152cb4f8) Llama 3.1 405B on
128 H100 as FSDP over 16 groups of 8 tensor-parallel ranks in bf16 (its row without Float8 or asynchronous TP;
tokens/s per GPU). The models are llama.py's. torchtitan's rows with torch.compile, Float8 or asynchronous TP
(its later 2D, 3D and 4D tables) are left out: the plan models none of them. The
transformer efficiency the plan uses comes from another source (MosaicML's MPT benchmarks: devices.py),
so none of these points is a calibration.

    .venv/bin/python benchmarks/planner_published.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARATRAIN = str(Path(sys.executable).parent / "paratrain")
MODELS = {
    "ResNet-50": "resnet50v2",
    "ResNeXt-101 32x4d": "dle_models:resnext101_32x4d",
    "SE-ResNeXt-101 32x4d": "dle_models:se_resnext101_32x4d",
}
PRECISION = {"TF32": "tf32", "AMP": "fp16", "FP32": "fp32"}
# (model, device, precision as published, per-GPU batch, 1-GPU img/s, 8-GPU img/s)
SINGLE_NODE = [
    ("ResNet-50", "a100", "TF32", 256, 938, 7248),
    ("ResNet-50", "a100", "AMP", 256, 2470, 16621),
    ("ResNet-50", "v100", "FP32", 112, 367, 2855),
    ("ResNet-50", "v100", "AMP", 256, 1200, 8322),
    ("ResNeXt-101 32x4d", "a100", "TF32", 128, 456, 3471),
    ("ResNeXt-101 32x4d", "a100", "AMP", 128, 1211, 7925),
    ("ResNeXt-101 32x4d", "v100", "FP32", 64, 147, 1133),
    ("ResNeXt-101 32x4d", "v100", "AMP", 128, 587, 4065),
    ("SE-ResNeXt-101 32x4d", "a100", "TF32", 128, 395, 2991),
    ("SE-ResNeXt-101 32x4d", "a100", "AMP", 128, 855, 5779),
    ("SE-ResNeXt-101 32x4d", "v100", "FP32", 64, 132, 1004),
    ("SE-ResNeXt-101 32x4d", "v100", "AMP", 112, 443, 2971),
]
IMAGENET = ["--image-size", "224", "--num-classes", "1000", "--optimizer", "sgd", "--strategy", "ddp"]

TITAN_H100 = "torchtitan performance.md @ eaea6f6"
TITAN_A100 = "torchtitan performance.md @ 0413364"
TITAN_405B = "torchtitan performance.md @ 3faaa1a"
# torchtitan's layouts as `plan` flags: FSDP alone; FSDP over groups of 8 ranks splitting each layer, with its
# sequence and loss parallelism (on by default with tensor parallelism in torchtitan)
LAYOUTS = {
    "fsdp": ("fsdp", 1, []),
    "fsdp x tp 8": ("fsdp+tp", 8, ["--tp", "8", "--sequence-parallel", "--loss-parallel"]),
}
# torchtitan's checkpointing as published, as `plan` flags.
CHECKPOINTING = {
    "none": [],
    "full": ["--checkpoint-activations"],
    # torchtitan's "selective" checkpointing: by layer, every 2nd block (its option "2"), or by operator
    "selective (layer)": ["--checkpoint-activations", "--checkpoint-activations-every", "2"],
    "selective (op)": ["--checkpoint-activations", "--checkpoint-activations-ops"],
}
# (source, model, device, GPUs, layout, local batch of a data-parallel rank, sequence, checkpointing as published,
# tokens/s/GPU, memory GiB)
LLM_POINTS = [
    (TITAN_H100, "llama3_8b", "h100", 8, "fsdp", 2, 8192, "selective (op)", 5762, 82.4),
    (TITAN_H100, "llama3_8b", "h100", 128, "fsdp", 2, 8192, "selective (op)", 5605, 67.0),
    (TITAN_405B, "llama3_405b", "h100", 128, "fsdp x tp 8", 2, 8192, "full", 109, None),
    (TITAN_A100, "llama3_8b", "a100", 64, "fsdp", 1, 8192, "selective (layer)", 2904, None),
    (TITAN_A100, "llama3_8b", "a100", 64, "fsdp", 1, 8192, "selective (op)", 2973, None),
    (TITAN_A100, "llama3_70b", "a100", 64, "fsdp", 1, 8192, "full", 331, None),
    (TITAN_A100, "llama2_13b", "a100", 64, "fsdp", 2, 4096, "none", 2162, None),
    (TITAN_A100, "llama2_13b", "a100", 64, "fsdp", 2, 4096, "selective (layer)", 1914, None),
    (TITAN_A100, "llama2_13b", "a100", 64, "fsdp", 2, 4096, "selective (op)", 1904, None),
    (TITAN_A100, "llama2_70b", "a100", 64, "fsdp", 1, 4096, "selective (op)", 355, None),
    (TITAN_A100, "llama2_70b", "a100", 64, "fsdp", 2, 4096, "full", 353, None),
]


def plan(args: list[str], strategy: str | None = None) -> tuple[dict[int, dict], str]:
    """The plan's rows by device count (of `strategy` where a count has several), and the command."""
    cmd = [PARATRAIN, "plan", *args, "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks"))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    rows = [r for r in json.loads(proc.stdout)["rows"] if strategy in (None, r["strategy"])]
    return {r["devices"]: r for r in rows}, " ".join(["paratrain", *cmd[1:]])


def main() -> None:
    commands = []
    print(
        "| model | GPUs, precision, batch a GPU | 1 GPU: published / predicted img/s | 8 GPUs: published / predicted "
        "img/s | speedup at 8: published / predicted (error) |"
    )
    print("|---|---|---|---|---|")
    for model, device, precision, batch, one, eight in SINGLE_NODE:
        rows, command = plan(
            [
                "--model",
                MODELS[model],
                *IMAGENET,
                "--device",
                device,
                "--precision",
                PRECISION[precision],
                "--gpus",
                "8",
                "--batch-size",
                str(batch),
            ]
        )
        commands.append(command)
        p1, p8 = rows[1]["samples_per_s"], rows[8]["samples_per_s"]
        published, predicted = eight / one, p8 / p1
        print(
            f"| {model} | {device.upper()} {precision}, {batch} | {one:,} / {p1:,.0f} ({(p1 - one) / one:+.1%}) | "
            f"{eight:,} / {p8:,.0f} ({(p8 - eight) / eight:+.1%}) | {published:.2f} / {predicted:.2f} "
            f"({(predicted - published) / published:+.1%}) |"
        )
    rows, command = plan(
        [
            "--model",
            "resnet50v2",
            *IMAGENET,
            "--device",
            "p100",
            "--precision",
            "fp32",
            "--nodes",
            "32",
            "--gpus-per-node",
            "8",
            "--inter-node-gbps",
            "50",
            "--batch-size",
            "32",
        ]
    )
    commands.append(command)
    efficiency = (rows[256]["samples_per_s"] / 256) / (rows[8]["samples_per_s"] / 8)
    print(
        f"\nGoyal et al. 2017, 8 -> 256 P100, scaling efficiency: published ~0.90, predicted {efficiency:.3f} "
        f"({(efficiency - 0.90) / 0.90:+.1%}); exposed communication {rows[8]['time']['exposed_comm_s'] * 1e3:.2f} ms "
        f"a step on 8, {rows[256]['time']['exposed_comm_s'] * 1e3:.2f} ms on 256, of "
        f"{rows[256]['step_time_s'] * 1e3:.0f} ms"
    )
    commands += llm_points()
    print("\ncommands (PYTHONPATH=benchmarks):")
    for command in commands:
        print(f"    {command}")


def llm_points() -> list[str]:
    """torchtitan's FSDP runs: published and predicted tokens/s per GPU and peak memory, with the errors."""
    commands = []
    print(
        "\n| source | model | GPUs | layout | local batch x sequence | checkpointing | tokens/s/GPU: published / "
        "predicted (error) | memory GiB: published / predicted (error) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for source, model, device, gpus, layout, batch, seq, checkpointing, tokens, memory in LLM_POINTS:
        how = CHECKPOINTING[checkpointing]
        strategy, tp, split = LAYOUTS[layout]
        rows, command = plan(
            ["--model", f"llama:{model}", "--dataset", "text", "--seq-len", str(seq), "--device", device]
            + ["--precision", "bf16", "--optimizer", "adamw", "--strategy", "fsdp", "--gpus", str(gpus)]
            + ["--global-batch", str(batch * gpus // tp), *split, *how]  # the ranks splitting a layer share a batch
            + (["--interconnect", "ib-ndr"] if device == "h100" else []),  # 400 Gb/s a GPU, as published
            strategy,
        )
        commands.append(command)
        row = rows[gpus]
        predicted = row["samples_per_s"] * seq / gpus
        held = row["memory"]["total_bytes"] / 2**30
        memory_cell = f"{memory} / {held:.1f} ({(held - memory) / memory:+.1%})" if memory else f"- / {held:.1f}"
        print(
            f"| {source} | {model} | {gpus} {device.upper()} | {layout} | {batch} x {seq:,} | {checkpointing} | "
            f"{tokens:,} / {predicted:,.0f} ({(predicted - tokens) / tokens:+.1%}) | {memory_cell} |"
        )
    return commands


if __name__ == "__main__":
    main()
