"""--batch-schedule in real runs (#30): the adaptive batch grows with the noise scale the run measures, the
LR follows it, every change is a `batch` event; a warmup ramp interrupted by a kill resumes at the batch
it had reached and goes on as the uninterrupted run does."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SMALL = [
    "--workload",
    "synthetic-cnn",
    "--synthetic-samples",
    "2048",
    "--synthetic-shape",
    "3,16,16",
    "--batch-size",
    "16",
    "--lr",
    "0.05",
    "--threads-per-worker",
    "1",
    "--quiet",
]
CLI = [sys.executable, "-m", "paratrain", "train"]


def events(run, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == kind]


@pytest.mark.parametrize(
    "layout",
    [
        ["--grad-accum", "2"],
        ["--workers", "2"],
        ["--workers", "2", "--strategy", "fsdp"],
        # #58: 2 ranks of 2 micro-batches of 8 (the same 32 to start): a rank's small batch counts both
        ["--workers", "2", "--grad-accum", "2", "--batch-size", "8"],
    ],
    ids=["one-worker", "ddp", "fsdp", "ddp-accumulation"],
)
def test_the_adaptive_batch_grows_while_it_raises_the_goodput_and_the_lr_follows(tmp_path, layout):
    run = tmp_path / "adaptive"
    flags = ["--epochs", "3", *layout, "--log-every", "5", "--batch-schedule", "adaptive", "--max-batch-size", "64"]
    flags += ["--tensorboard", str(tmp_path / "tb")]
    subprocess.run([*CLI, *SMALL, *flags, "--max-global-batch", "256", "--run-dir", str(run)], check=True)
    summary = json.loads((run / "summary.json").read_text())
    changes = events(run, "batch")
    # a batch of 16 small images is all overhead: a larger per-rank batch runs faster per sample
    assert changes, "the per-rank batch of 16 grows within 3 epochs"
    batches = [32] + [c["global_batch"] for c in changes]
    assert all(b == 2 * a for a, b in itertools.pairwise(batches)) and batches[-1] <= 256  # doublings, capped
    assert all(c["per_rank_batch"] <= 64 for c in changes)
    # decided where the loss is read anyway, at a log point (every 5 steps)
    read_at = {e["step"] for e in events(run, "step")}
    for change in changes:  # each promised more progress a second, by the noise scale measured then
        assert change["goodput_gain"] >= 1.05 and change["noise_scale"] > 0
        assert change["lr_factor"] == change["global_batch"] / 32 and change["step"] in read_at
    block = summary["batch_schedule"]
    assert block["kind"] == "adaptive" and block["start_global_batch"] == 32
    assert block["final_global_batch"] == batches[-1] and block["largest_global_batch"] == 256
    # fewer optimizer steps than a fixed batch of 32 takes (3 epochs of 64), the same samples
    assert summary["steps"] < 3 * 64 and sum(e["epoch_samples"] for e in events(run, "epoch")) == 3 * 2048
    # the LR of the steps after the first change is the constant schedule's, times the batch's factor
    first = changes[0]
    after = [s for s in events(run, "step") if s["step"] > first["step"]]
    before = [s for s in events(run, "step") if s["step"] <= first["step"]]
    assert after[0]["lr"] == pytest.approx(before[-1]["lr"] * first["lr_factor"], rel=1e-9)
    # every log point's reading is a `noise` event, the batch it read at and what the next doubling promised;
    # a change comes right after the reading that made it, with its figures
    readings = events(run, "noise")
    assert [r["step"] for r in readings] == sorted(read_at)
    assert all(r["noise_scale_stderr"] >= 0 for r in readings[1:] if "noise_scale" in r)  # known from two readings
    for change in changes:
        made = next(r for r in readings if r["step"] == change["step"])
        assert made["next_global_batch"] == change["global_batch"] == 2 * made["global_batch"]
        assert (made["goodput_gain"], made["noise_scale"]) == (change["goodput_gain"], change["noise_scale"])
    assert {"noise_scale_stderr", "goodput_gain", "min_goodput_gain"} <= set(block)
    if "--workers" in layout:  # each rank's step (its micro-batches, accumulated) against the global batch
        recorded = [json.loads(line) for line in (run / "grad_noise" / "rank0.jsonl").read_text().splitlines()]
        assert {(n["small_batch"], n["big_batch"]) for n in recorded} == {(b // 2, b) for b in batches}
    # TensorBoard gets the batch and the readings beside the loss
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    assert [s.value for s in board.Scalars("batch/global_batch")] == batches[1:]
    assert len(board.Scalars("batch/noise_scale")) == sum("noise_scale" in r for r in readings)
    # the run's page draws the batch over the run and says where it went
    subprocess.run([sys.executable, "-m", "paratrain", "report", str(run)], check=True, capture_output=True)
    page = (run / "report.html").read_text()
    assert "alt='batch schedule'" in page and f"the global batch grew from 32 to {batches[-1]}" in page


def test_a_warmup_ramp_killed_midway_resumes_at_the_batch_it_had_reached(tmp_path):
    # from 16 to 64 over 2.5 epochs: 32 from 5/6 of an epoch, 64 from 5/3
    flags = [*SMALL, "--epochs", "3", "--batch-schedule", "warmup", "--batch-ramp-epochs", "2.5"]
    flags += ["--max-global-batch", "64", "--log-every", "8", "--checkpoint-every", "1"]
    subprocess.run([*CLI, *flags, "--run-dir", str(tmp_path / "full")], check=True)

    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [*CLI, *flags, "--run-dir", str(interrupted)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (interrupted / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (interrupted / "summary.json").exists(), "the run finished before it could be interrupted"
    saved = torch.load(interrupted / "checkpoint.pt", weights_only=True)
    assert saved["epoch"] == 1 and saved["batch_schedule"]["accum"] == 2  # midway up the ramp: 32 a step
    subprocess.run([*CLI, *flags, "--run-dir", str(interrupted), "--resume"], check=True)

    full, resumed = (tmp_path / "full", interrupted)
    assert [(c["step"], c["global_batch"]) for c in events(resumed, "batch")] == [
        (c["step"], c["global_batch"]) for c in events(full, "batch")
    ]
    full_steps, resumed_steps = events(full, "step"), events(resumed, "step")
    assert [(s["step"], s["lr"]) for s in resumed_steps] == [(s["step"], s["lr"]) for s in full_steps]
    assert [s["loss"] for s in resumed_steps] == pytest.approx([s["loss"] for s in full_steps], rel=1e-6)


def test_growing_the_per_rank_batch_trains_on_the_batches_accumulation_would(tmp_path):
    # 2 ranks of 16, a warmup ramp from 32 to 128 over 0.7 epochs: one run grows the per-rank batch up to 64
    # (--max-batch-size; loaded 64 at a time, cut into forwards), the other accumulates forwards of 16. The LR
    # stays put (--lr-scaling none): scaled to 0.2 at 128 the run nears divergence in its second epoch, which
    # blows the sums' rounding differences (1e-8) up to 1 % on some CPUs (an Intel Xeon here) and not on others
    flags = [*SMALL, "--workers", "2", "--epochs", "2", "--batch-schedule", "warmup", "--log-every", "4"]
    flags += ["--max-global-batch", "128", "--batch-ramp-epochs", "0.7", "--lr-scaling", "none"]
    joined, accumulated = tmp_path / "joined", tmp_path / "accumulated"
    subprocess.run([*CLI, *flags, "--max-batch-size", "64", "--run-dir", str(joined)], check=True)
    subprocess.run([*CLI, *flags, "--run-dir", str(accumulated)], check=True)

    def changes(run):
        return [(c["step"], c["global_batch"], c["per_rank_batch"], c["grad_accum"]) for c in events(run, "batch")]

    grown = changes(joined)
    assert grown == [(grown[0][0], 64, 32, 1), (grown[1][0], 128, 64, 1)]  # never past 64 a rank
    # each change came at an odd 16-sample batch of a loaded 64: the next forward spans two loaded batches
    assert [events(joined, "batch")[i]["samples"] // 32 for i in (0, 1)] == [15, 31]
    assert changes(accumulated) == [(step, batch, 16, batch // 32) for step, batch, _, _ in grown]
    # the same samples in the same steps: the same losses, up to the order of the sums (1e-7 measured; one
    # sample a join takes wrongly moved the losses by up to 8e-4 when tried)
    steps = events(joined, "step")
    assert [s["step"] for s in steps] == [s["step"] for s in events(accumulated, "step")]
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in events(accumulated, "step")], rel=1e-5)
    summary = json.loads((joined / "summary.json").read_text())["batch_schedule"]
    assert (summary["final_per_rank_batch"], summary["largest_per_rank_batch"]) == (64, 64)


SCHEDULED_SCRIPT = str(Path(__file__).parent.parent / "docs" / "examples" / "ddp_schedule.py")
LAUNCH = [sys.executable, "-m", "paratrain", "launch", "-n", "2", "--threads-per-worker", "1"]
# 4,096 samples over 2 ranks at 4 a micro-step: a global batch of 8 to start, 512 steps an epoch.
SCRIPT_ARGS = ["--epochs", "1", "--samples", "4096", "--batch-size", "4", "--log-every", "5"]


def test_a_script_that_lets_paratrain_set_its_batch_grows_it_adaptively(tmp_path):
    """docs/examples/ddp_schedule.py under `launch --batch-schedule adaptive`: the script's own DDP loop,
    its micro-steps handed out by paratrain.batch_schedule; at 4 samples a rank the step's fixed costs
    dominate, so accumulating more micro-steps raises the throughput and the random labels' noise lets it."""
    run = tmp_path / "run"
    flags = ["--batch-schedule", "adaptive", "--max-global-batch", "64", "--run-dir", str(run)]
    subprocess.run([*LAUNCH, *flags, SCHEDULED_SCRIPT, *SCRIPT_ARGS], check=True, capture_output=True)
    changes = events(run, "batch")
    assert changes, "the global batch of 8 grows within an epoch"
    batches = [8] + [c["global_batch"] for c in changes]
    assert all(b == 2 * a for a, b in itertools.pairwise(batches)) and batches[-1] <= 64  # doublings, capped
    for change in changes:  # by accumulation, each read at a log point and promising more progress a second
        assert change["per_rank_batch"] == 4 and change["grad_accum"] == change["global_batch"] // 8
        assert change["step"] % 5 == 0 and change["goodput_gain"] >= 1.05 and change["noise_scale"] > 0
        assert change["lr_factor"] == change["global_batch"] / 8
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    block = summary["batch_schedule"]
    assert block["kind"] == "adaptive" and block["start_global_batch"] == 8 and block["largest_global_batch"] == 64
    assert block["final_global_batch"] == batches[-1] == summary["reported"]["global_batch_size"]
    # the script's optimizer ends at its LR times the last factor (linear scaling), as the script reports it
    assert summary["reported"]["lr"] == pytest.approx(0.01 * batches[-1] / 8, rel=1e-9)
    # each rank's norms, as `paratrain noise-scale` reads a built-in run's
    assert sorted(p.name for p in (run / "grad_noise").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    # every log point's reading, from rank 0 alone (512 steps at most, a reading every 5)
    readings = events(run, "noise")
    assert [r["step"] for r in readings] == list(range(5, int(summary["reported"]["steps"]) + 1, 5))
    for change in changes:
        made = next(r for r in readings if r["step"] == change["step"])
        assert made["goodput_gain"] == change["goodput_gain"] and made["next_global_batch"] == change["global_batch"]
    subprocess.run([sys.executable, "-m", "paratrain", "report", str(run)], check=True, capture_output=True)
    page = (run / "report.html").read_text()
    assert "alt='batch schedule'" in page and "--batch-schedule adaptive: the global batch grew from 8 to" in page


def noise_records(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / "grad_noise" / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("wrap,ranks", [("fsdp", 2), ("hsdp", 4)])
def test_a_scripts_fsdp_and_hsdp_read_the_noise_its_ddp_reads(tmp_path, wrap, ranks):
    """The example script's model fully_shard-ed (over all ranks; HSDP: over pairs of ranks, replicated across the
    pairs) reads each step's two squared norms from FSDP's reduce-scatter and the averaged shards: the same, rank
    by rank and step by step, as under DDP's comm hook, up to the first batch change (which each run decides from
    its own timings). HSDP runs 4 ranks on 2 cores: a correctness test."""
    runs = {}
    for wrapped in ("ddp", wrap):
        runs[wrapped] = tmp_path / wrapped
        launch = [*LAUNCH[:5], str(ranks), *LAUNCH[6:], "--allow-oversubscribe", "--run-dir", str(runs[wrapped])]
        flags = ["--batch-schedule", "adaptive", "--max-global-batch", str(16 * ranks)]
        # 40 steps of 4 samples a rank
        script = ["--epochs", "1", "--samples", str(160 * ranks), "--batch-size", "4", "--log-every", "5"]
        subprocess.run([*launch, *flags, SCHEDULED_SCRIPT, *script, "--wrap", wrapped], check=True, capture_output=True)
    until = min([change["step"] for run in runs.values() for change in events(run, "batch")], default=40)
    for rank in range(ranks):
        ddp, sharded = ([r for r in noise_records(runs[w], rank) if r["step"] <= until] for w in ("ddp", wrap))
        assert [r["step"] for r in sharded] == [r["step"] for r in ddp] == list(range(1, until + 1))
        for name in ("small_sq", "big_sq"):
            assert [r[name] for r in sharded] == pytest.approx([r[name] for r in ddp], rel=1e-4)
        assert {(r["small_batch"], r["big_batch"]) for r in sharded} == {(4, 4 * ranks)}
    assert json.loads((runs[wrap] / "summary.json").read_text())["status"] == "completed"


SPLIT_SCRIPT = """\
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
import paratrain
dist.init_process_group("gloo")
grid = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
model = fully_shard(parallelize_module(torch.nn.Linear(4, 4), grid["tp"], ColwiseParallel()), mesh=grid["dp"])
paratrain.batch_schedule(model, torch.optim.SGD(model.parameters(), lr=0.1), batch_size=4)
"""


def test_a_scripts_fsdp_over_tensor_parallel_pieces_is_refused_for_adaptive_with_one_line(tmp_path):
    """A rank's reduce-scatter holds its piece's gradient, not its batch's: the ranks end with one line saying what
    to do, exit 1 (the script's failure), before any step."""
    script = tmp_path / "split.py"
    script.write_text(SPLIT_SCRIPT)
    run = tmp_path / "run"
    flags = ["--batch-schedule", "adaptive", "--max-global-batch", "64", "--run-dir", str(run)]
    done = subprocess.run([*LAUNCH, *flags, str(script)], capture_output=True, text=True)
    assert done.returncode == 1
    told = done.stderr.strip().splitlines()
    assert len(told) == 1 and "not on tensor-parallel pieces" in told[0] and "warmup" in told[0]
    assert not (run / "metrics.jsonl").exists()


def test_a_scripts_warmup_ramp_doubles_at_the_samples_the_rule_gives(tmp_path):
    """warmup from 8 to 32 over one epoch of 4,096 samples: two doublings, at a third and two thirds of the
    ramp by samples trained on (engine/batch_schedule.py). By hand: 8 a step reaches 4096/3 = 1365.3 after
    step 171 (1,368 samples); 16 a step then reaches 2730.7 after 86 more (2,744), at step 257."""
    run = tmp_path / "run"
    flags = ["--batch-schedule", "warmup", "--max-global-batch", "32", "--lr-scaling", "sqrt", "--run-dir", str(run)]
    subprocess.run([*LAUNCH, *flags, SCHEDULED_SCRIPT, *SCRIPT_ARGS], check=True, capture_output=True)
    changes = [(c["step"], c["global_batch"], c["lr_factor"]) for c in events(run, "batch")]
    assert changes == [(171, 16, pytest.approx(2**0.5)), (257, 32, pytest.approx(2.0))]
    reported = json.loads((run / "summary.json").read_text())["reported"]
    # 171 steps of 8, 86 of 16, then steps of 32 while a whole one is left of the rank's 2,048 samples
    assert reported["steps"] == 171 + 86 + (2048 - 171 * 4 - 86 * 8) // 16
    assert reported["lr"] == pytest.approx(0.02)  # 0.01 x sqrt(32 / 8)


def test_a_scaling_study_of_a_script_gives_every_point_the_batch_schedule(tmp_path):
    """`scale --script --batch-schedule warmup`: each point's ranks get the schedule `launch` would give them:
    the script's own global batch at that point (4 a rank) doubled at even points of the ramp up to
    --max-global-batch, on 1 and 2 workers and on the all-cores reference alike."""
    out = tmp_path / "study"
    flags = ["--workers", "1,2", "--batch-schedule", "warmup", "--max-global-batch", "32", "--out", str(out)]
    script = ["--epochs", "1", "--samples", "1024", "--batch-size", "4", "--log-every", "5"]
    scale = [sys.executable, "-m", "paratrain", "scale", "--script", SCHEDULED_SCRIPT, *flags, "--", *script]
    subprocess.run(scale, check=True, capture_output=True)
    rows = json.loads((out / "scaling.json").read_text())["rows"]
    assert sorted((r["workers"], r["point"]) for r in rows) == [
        (1, "all_cores_reference"),
        (1, "scaling"),
        (2, "scaling"),
    ]
    for row in rows:
        run = Path(row["run_dir"])
        start = 4 * row["workers"]
        doubled = [c["global_batch"] for c in events(run, "batch")]
        assert doubled == [start * 2**k for k in range(1, 4) if start * 2**k <= 32], (row["workers"], doubled)
        block = json.loads((run / "summary.json").read_text())["batch_schedule"]
        assert (block["kind"], block["start_global_batch"], block["final_global_batch"]) == ("warmup", start, 32)


def test_a_schedule_the_scripts_own_batch_leaves_no_room_for_fails_its_ranks_with_one_line(tmp_path):
    """The starting batch is the script's (known in its ranks only): a --max-global-batch below twice it ends the
    run with the ranks' one line, the script's failure (exit 1), before any training step."""
    run = tmp_path / "run"
    flags = ["--batch-schedule", "adaptive", "--max-global-batch", "8", "--run-dir", str(run)]
    done = subprocess.run([*LAUNCH, *flags, SCHEDULED_SCRIPT, *SCRIPT_ARGS], capture_output=True, text=True)
    assert done.returncode == 1
    told = done.stderr.strip().splitlines()
    assert len(told) == 1 and "--max-global-batch 8 leaves no room to grow from the starting global batch 8" in told[0]
    assert not (run / "metrics.jsonl").exists() and not (run / "reports" / "rank0.jsonl").exists()
