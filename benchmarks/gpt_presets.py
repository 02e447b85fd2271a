"""The `gpt` presets on this machine: parameters, FLOPs per token, tokens/s on 1 and 2 workers,
efficiency, MFU against the measured CPU peak and memory per rank (docs/workloads.md).

Trained presets run `paratrain train` (weak scaling: the per-worker batch and the steps per epoch
stay, so 2 workers process twice the windows in an epoch), one thread per worker, 2 epochs, the
first excluded from timing as everywhere in paratrain. Runs alternate (w1, w2, w1, w2, ...) across
repeats because the machine is shared and noisy; the table gives medians. Presets too slow to
train here (by default gpt-large and gpt-xl) are only counted: parameters and FLOPs per token on
the meta device, and the model-state memory of one Adam replica (16 bytes a parameter), marked
as an estimate.

    .venv/bin/python benchmarks/gpt_presets.py --repeats 3                       # the table
    .venv/bin/python benchmarks/gpt_presets.py --presets gpt-tiny --repeats 1    # a quick check
    # gpt-small, 2 workers, ~10 min: val bits/byte
    .venv/bin/python benchmarks/gpt_presets.py --ten-minute-run

`--ten-minute-run` first measures gpt-small's tokens/s on 2 workers (two short epochs), sizes
`--samples-per-epoch` so that 4 epochs take about 600 s, runs that and prints the validation
bits per byte with the exact command it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Per preset: (tokens per window, windows per worker per step, steps per epoch). Windows are the
# preset's context; batches are as small as keeps a CPU step within seconds to a minute.
SETTINGS = {
    "gpt-tiny": (256, 8, 20),
    "gpt-small": (256, 4, 10),
    "gpt-medium": (1024, 1, 3),
    "gpt-large": (1024, 1, 2),
    "gpt-xl": (1024, 1, 2),
}
TRAINED = ("gpt-tiny", "gpt-small", "gpt-medium")
ADAM_BYTES_PER_PARAMETER = 16  # fp32 weights 4 + gradients 4 + Adam's two moments 8


def train(
    preset: str,
    workers: int,
    out: Path,
    seq_len: int,
    batch: int,
    samples: int,
    epochs: int = 2,
    extra: tuple[str, ...] = (),
) -> dict:
    cmd = [
        str(BIN / "paratrain"),
        "train",
        "--workload",
        preset,
        "--workers",
        str(workers),
        "--threads-per-worker",
        "1",
        "--seq-len",
        str(seq_len),
        "--batch-size",
        str(batch),
        "--samples-per-epoch",
        str(samples),
        "--epochs",
        str(epochs),
        "--eval-samples",
        "16",
        "--optimizer",
        "adamw",
        "--lr",
        "1e-3",
        "--run-dir",
        str(out),
        "--quiet",
        "--json",
        *extra,
    ]
    for attempt in (1, 2):  # a rendezvous on a shared machine fails now and then: one retry
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode == 0:
            return json.loads(proc.stdout)
        print(f"attempt {attempt} failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}", file=sys.stderr)
        out = out.with_name(out.name + "-retry")
    raise SystemExit(f"benchmark run failed twice: {' '.join(cmd)}")


def counted(preset: str, seq_len: int) -> dict:
    """Parameters and FLOPs per token of a preset, on the meta device (no memory, no arithmetic)."""
    from paratrain.engine.flops import count_flops_per_sample
    from paratrain.workloads.gpt import GPT, PRESETS
    from paratrain.workloads.objective import Objective

    with torch.device("meta"):
        model = GPT(PRESETS[preset])
    x = torch.zeros(1, seq_len, dtype=torch.long)
    return {
        "parameters": model.num_params(),
        "flops_per_token": count_flops_per_sample(model, Objective(), x, x) / seq_len,
        "analytic_flops_per_token": model.flops_per_token(seq_len),
        "adam_state_bytes": ADAM_BYTES_PER_PARAMETER * model.num_params(),
    }


def measure(presets: list[str], repeats: int, work: Path) -> dict[str, dict]:
    results = {p: {**counted(p, SETTINGS[p][0]), "runs": {1: [], 2: []}} for p in presets}
    for repeat in range(repeats):
        for preset in presets:
            if preset not in TRAINED:
                continue
            seq_len, batch, steps = SETTINGS[preset]
            for workers in (1, 2):
                summary = train(
                    preset,
                    workers,
                    work / f"{preset}-w{workers}-r{repeat}",
                    seq_len,
                    batch,
                    samples=steps * batch * workers,
                )
                results[preset]["runs"][workers].append(summary)
                print(
                    f"{preset} w{workers} r{repeat}: {summary['tokens_per_s']:,.0f} tokens/s, MFU {summary['mfu']:.1%}",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def table(results: dict[str, dict]) -> str:
    lines = [
        "| preset | parameters | FLOPs/token (counted; 6N+12LHQT) | tokens/s, 1 worker | tokens/s, 2 workers | "
        "efficiency | MFU 1 / 2 workers | memory per rank (peak RSS, 1 / 2 workers) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    peak_source = None
    for preset, r in results.items():
        flops = f"{r['flops_per_token'] / 1e6:,.1f} M ({r['analytic_flops_per_token'] / 1e6:,.1f} M)"
        head = f"| {preset} | {r['parameters'] / 1e6:,.1f} M | {flops} |"
        one, two = r["runs"][1], r["runs"][2]
        if not one:
            lines.append(
                f"{head} not trained here | | | | ~{r['adam_state_bytes'] / 2**30:.1f} GiB of Adam model state "
                "per replica (estimate, 16 B/parameter) |"
            )
            continue
        t1 = statistics.median(s["tokens_per_s"] for s in one)
        t2 = statistics.median(s["tokens_per_s"] for s in two)
        m1 = statistics.median(s["mfu"] for s in one)
        m2 = statistics.median(s["mfu"] for s in two)
        rss1 = statistics.median(max(s["peak_memory_bytes"]) for s in one) / 2**20
        rss2 = statistics.median(max(s["peak_memory_bytes"]) for s in two) / 2**20
        lines.append(
            f"{head} {t1:,.0f} | {t2:,.0f} | {t2 / (2 * t1):.2f} | {m1:.1%} / {m2:.1%} | "
            f"{rss1:,.0f} / {rss2:,.0f} MiB |"
        )
        peak_source = one[0]["mfu_peak"]["source"]
    settings = ", ".join(
        f"{p}: seq {SETTINGS[p][0]} x batch {SETTINGS[p][1]} per worker, {SETTINGS[p][2]} steps/epoch"
        for p in results
        if p in TRAINED
    )
    notes = [
        f"\nSettings: {settings}; 2 epochs, the first excluded; one thread per worker; AdamW.",
        f"Repeats: {max(len(r['runs'][1]) for r in results.values())}, medians shown.",
    ]
    if peak_source:
        notes.append(f"CPU peak per worker: {peak_source}.")
    return "\n".join(lines + notes)


def ten_minute_run(work: Path, seconds: float = 600.0, epochs: int = 4) -> None:
    seq_len, batch = 256, 8
    probe = train("gpt-small", 2, work / "probe", seq_len, batch, samples=2 * batch * 5)
    samples = max(2 * batch, int(probe["tokens_per_s"] * seconds / epochs / seq_len) // (2 * batch) * (2 * batch))
    extra = ("--eval-samples", "256")
    out = work / "gpt-small-10min"
    summary = train("gpt-small", 2, out, seq_len, batch, samples=samples, epochs=epochs, extra=extra)
    print(
        f"command: {BIN / 'paratrain'} train --workload gpt-small --workers 2 --threads-per-worker 1 --seq-len "
        f"{seq_len} --batch-size {batch} --samples-per-epoch {samples} --epochs {epochs} --optimizer adamw --lr 1e-3 "
        "--eval-samples 256"
    )
    print(
        f"train time {summary['train_time_s']:.0f} s, {summary['tokens_per_s']:,.0f} tokens/s, "
        f"val loss {summary['val_loss']:.4f} nats/byte = {summary['val_bits_per_byte']:.3f} bits/byte, "
        f"next-byte accuracy {summary['val_accuracy']:.1%}, MFU {summary['mfu']:.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(SETTINGS), help="comma-separated presets (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ten-minute-run", action="store_true", help="the gpt-small 2-worker run instead of the table")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpt-presets-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.ten_minute_run:
            ten_minute_run(work)
            return
        presets = [p.strip() for p in args.presets.split(",") if p.strip()]
        unknown = sorted(set(presets) - set(SETTINGS))
        if unknown:
            raise SystemExit(f"unknown preset(s) {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
        print(table(measure(presets, args.repeats, work)))


if __name__ == "__main__":
    main()
