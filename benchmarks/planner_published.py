"""`paratrain plan` against published multi-GPU measurements (docs/planner.md): prints each point's
published and predicted figures, the error, and the commands. Takes about a minute here; no GPU
needed: the plan measures each model on the meta device.

Single-node: NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets, each model's README,
"Training performance results" (pytorch-21.03 container), 1 and 8 GPUs of a DGX A100 80GB and a
DGX-1 16GB. Per-GPU batches are those of the repository's configs.yml for each platform and
precision. ResNet-50's figures are the device table's calibration (its 1-GPU rows give the
efficiency, its 8-GPU rows the share a full node keeps: plan/devices.py), so they agree by
construction; ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d (dle_models.py) are the test.

Multi-node: Goyal et al. 2017 (arXiv:1706.02677), ResNet-50 on 8 to 256 P100 in servers of 8 joined
by 50 Gbit Ethernet, 32 images a GPU: "~90% scaling efficiency".

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


def plan(args: list[str]) -> tuple[dict[int, dict], str]:
    cmd = [PARATRAIN, "plan", *args, "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks"))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()}")
    return {r["devices"]: r for r in json.loads(proc.stdout)["rows"]}, " ".join(["paratrain", *cmd[1:]])


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
    print("\ncommands (PYTHONPATH=benchmarks):")
    for command in commands:
        print(f"    {command}")


if __name__ == "__main__":
    main()
