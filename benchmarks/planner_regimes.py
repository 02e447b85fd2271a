"""`paratrain plan` against the published runs of benchmarks/planner_regimes/ (issue #59, docs/planner.md): each
point the plan can express, planned as published (model shape, devices, layout, global batch, precision,
checkpointing, links), its predicted step time against the one derived from the published figure.

The points were collected by a helper who read none of the planner (the folder's README); a third of them
(heldout.json) is read only with --heldout, after the model's changes. A point is mapped from its fields alone,
by the rules below, so held-out points are mapped as the others are:
- the model: a Llama 2 or 3.1 by name (llama.py), a GPT of the given layers, hidden size, heads and vocabulary
  (regime_models.py; heads: hidden / 128 where not published), VGG-16, ResNet-50;
- the layout: ZeRO-3 or FSDP full shard: fsdp; HSDP: hsdp (a replica a node); no sharding: ddp. Tensor or
  pipeline parallelism beside data parallelism without sharding (Megatron's layouts): the mesh --dp-replicate DP
  --tp TP --pp PP, its micro-batches as published (num_micro_batches, else the global batch over DP micro-batches
  of micro_batch_size, 1 where not published; interleaved stages are not modelled: the plan's 1F1B); beside
  sharding, context parallelism and CPU offload: not planned, and listed as such;
- the links: the inter-node figure as published, per node, split over the node's GPUs (a DGX's 8 x 200 Gb/s:
  200 Gb/s a GPU); the intra-node link is the device's own (NVLink);
- precision: 16-bit mixed as bf16 (A100 and H100 have one peak for both), else as published; full activation
  checkpointing as `--checkpoint-activations`; Adam for language models, SGD for CNNs.

    .venv/bin/python benchmarks/planner_regimes.py [--heldout] [--pythonpath OTHER/src]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARATRAIN = str(Path(sys.executable).parent / "paratrain")
POINTS = ROOT / "benchmarks" / "planner_regimes"
LLAMAS = {
    "llama 2 7b": "llama2_7b",
    "llama 2 34b": "llama2_34b",
    "llama 2 70b": "llama2_70b",
    "llama 3.1 8b": "llama3_8b",
    "llama 3.1 70b": "llama3_70b",
    "llama 3.1 405b": "llama3_405b",
}
DEVICES = (("a100-sxm4-40gb", "a100-40gb"), ("a100", "a100"), ("h100", "h100"), ("v100", "v100"), ("pascal", "p100"))


def model_args(point: dict[str, Any]) -> list[str] | str:
    m, seq = point["model"], point["model"].get("sequence_length")
    name = (m.get("name") or "").lower()
    for published, ours in LLAMAS.items():
        if published in name:
            return ["--model", f"llama:{ours}", "--dataset", "text", "--seq-len", str(seq), "--optimizer", "adam"]
    if "vgg-16" in name or "resnet-50" in name:
        model = "regime_models:vgg16" if "vgg" in name else "resnet50v2"
        return ["--model", model, "--image-size", "224", "--num-classes", "1000", "--optimizer", "sgd"]
    if "gpt" in name and all(isinstance(m.get(k), int) for k in ("layers", "hidden_size", "vocab_size")) and seq:
        heads = m.get("attention_heads") or max(m["hidden_size"] // 128, 1)
        shape = f"gpt_l{m['layers']}_h{m['hidden_size']}_a{heads}_v{m['vocab_size']}"
        return ["--model", f"regime_models:{shape}", "--dataset", "text", "--seq-len", str(seq), "--optimizer", "adam"]
    return f"no model of {m.get('name')!r} here"


def layout_args(point: dict[str, Any]) -> list[str] | str:
    layout, hw = point["layout"], point["hardware"]
    if (layout.get("context_parallel") or 1) > 1 or layout.get("cpu_offload"):
        return "context parallelism or CPU offload: not modelled"
    sharding = (layout.get("sharding") or "none").lower()
    megatron = (layout.get("tensor_parallel") or 1) > 1 or (layout.get("pipeline_stages") or 1) > 1
    if megatron and not sharding.startswith("none"):
        return f"tensor or pipeline parallelism beside sharding {layout.get('sharding')!r}: not mapped"
    strategy = "hsdp" if "hsdp" in sharding else "fsdp" if "zero-3" in sharding or "full shard" in sharding else None
    if strategy is None and not sharding.startswith("none"):
        return f"sharding {layout.get('sharding')!r}: not mapped"
    batch = layout.get("global_batch")
    if not isinstance(batch, int):
        return "no global batch published"
    device = next((ours for key, ours in DEVICES if key in (hw.get("device") or "").lower()), None)
    if device is None:
        return f"no device {hw.get('device')!r} in the plan's table"
    per_node = hw.get("gpus_per_node") or 8
    args = ["--device", device, "--gpus", str(hw["total_gpus"]), "--gpus-per-node", str(per_node)]
    args += ["--global-batch", str(batch)]
    if megatron:
        dp, tp, pp = (layout.get(k) or 1 for k in ("data_parallel", "tensor_parallel", "pipeline_stages"))
        microbatches = layout.get("num_micro_batches") or batch // (dp * (layout.get("micro_batch_size") or 1))
        args += ["--dp-replicate", str(dp), "--tp", str(tp), "--pp", str(pp), "--microbatches", str(microbatches)]
    else:
        args += ["--strategy", strategy or "ddp"]
    precision = (layout.get("precision") or "fp32").lower()
    args += ["--precision", "bf16" if "16" in precision else "fp32"]
    if (layout.get("activation_checkpointing") or "none").lower().startswith("full"):
        args.append("--checkpoint-activations")
    gbps = node_gbps(hw.get("inter_node_link") or "")
    if gbps is not None and hw["total_gpus"] > per_node:
        args += ["--inter-node-gbps", f"{gbps / per_node:g}"]
    return args


def node_gbps(text: str) -> float | None:
    """A node's network bandwidth as published: "8x200 Gb/s", "2 x 100 Gbps ... usable 120Gbps", "400 Gbps"."""
    usable = re.search(r"usable bandwidth of (\d+) ?Gb", text)
    if usable:
        return float(usable.group(1))
    many = re.search(r"(\d+) ?x ?(\d+) ?Gb", text)
    if many:
        return float(many.group(1)) * float(many.group(2))
    one = re.search(r"(\d+(?:\.\d+)?) ?G(?:b|bit|bps)", text)
    return float(one.group(1)) if one else None


def plan(args: list[str], strategy: str | None, gpus: int, pythonpath: str | None) -> tuple[dict[str, Any] | None, str]:
    cmd = [PARATRAIN, "plan", *args, "--json"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pythonpath, str(ROOT / "benchmarks")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    command = " ".join(["paratrain", *cmd[1:]])
    if proc.returncode != 0:
        return None, f"{command}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    result = json.loads(proc.stdout)
    rows = [r for r in result["rows"] if r["devices"] == gpus and strategy in (None, r["strategy"])]
    return (rows[0] | {"stops_paying": result.get("stops_paying")} if rows else None), command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heldout", action="store_true", help="the held-out third instead (after the changes)")
    parser.add_argument("--pythonpath", help="plan with this src/ (another checkout's code)")
    args = parser.parse_args()
    points = json.loads((POINTS / ("heldout.json" if args.heldout else "points.json")).read_text())
    print("| point | regime | GPUs | layout planned | published step (s) | predicted (s) | error | exposed comm |")
    print("|---|---|---|---|---|---|---|---|")
    skipped, commands = [], []
    for point in sorted(points, key=lambda p: (p["regime"], p["id"])):
        published = (point.get("derived") or {}).get("step_time_s")
        model, layout = model_args(point), layout_args(point)
        reason = next((r for r in (model, layout) if isinstance(r, str)), None)
        if published is None:
            reason = "no step time published"
        if reason is not None:
            skipped.append(f"{point['id']} ({point['regime']}): {reason}")
            continue
        strategy = layout[layout.index("--strategy") + 1] if "--strategy" in layout else None  # a mesh: its one row
        row, command = plan([*model, *layout], strategy, point["hardware"]["total_gpus"], args.pythonpath)
        commands.append(command)
        if row is None:
            skipped.append(f"{point['id']} ({point['regime']}): the plan refused or has no row: {command}")
            continue
        step, exposed = row["step_time_s"], row["time"]["exposed_comm_s"]
        print(
            f"| {point['id']} | {point['regime']} | {point['hardware']['total_gpus']} | {row['strategy']}, "
            f"{row['global_batch'] // row['data_parallel']} a replica | {published:.3g} | {step:.3g} | "
            f"{step / published - 1:+.0%} | {exposed / step:.0%} |",
            flush=True,
        )
    print("\nnot planned:")
    for line in skipped:
        print(f"- {line}")
    print("\ncommands (PYTHONPATH=benchmarks):")
    for command in commands:
        print(f"    {command}")


if __name__ == "__main__":
    main()
