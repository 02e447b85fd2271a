"""The probe and the doctor on scripts in the styles people write (tests/script_styles/, no paratrain import):
a plain DDP loop, torch.compile (default and fullgraph=True), torch.utils.checkpoint, bf16 autocast, the user's
own FSDP2, an IterableDataset, Hugging Face Accelerate, Lightning Fabric and the Lightning Trainer. Each runs under
`paratrain launch -n 2` with two planted faults: the probe must work (no fallback), every second of each
rank's steps must be charged to one phase, the samples per optimizer step must be the script's own count, and
the doctor must name both faults."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.doctor import diagnose
from paratrain.runs import RunDir

STYLES = Path(__file__).parent / "script_styles"
LAUNCH = [sys.executable, "-m", "paratrain", "launch", "-n", "2"]
# style, its extra flags, the planted faults and the doctor's checks that must name them. Two faults whose
# shares of the step leave each other visible: a gc.collect() of 160 ms a step would hide a 16 ms decode.
CASES = [
    ("plain_ddp", [], "no_sampler,gc", {"duplicate_data", "garbage_collection"}),
    ("compiled", [], "gc,float64", {"garbage_collection", "float64"}),
    ("compiled", ["--fullgraph"], "decode,no_sampler", {"data_preparation", "duplicate_data"}),
    ("checkpointed", [], "float64,gc", {"float64", "garbage_collection"}),
    # not decode: where bfloat16 is emulated (an AVX2 CPU) the model takes 4x as long and the decoding falls under
    # data_preparation's 15 % (8.5 % measured), so the planted fault would be too small to name
    ("autocast_bf16", [], "gc,no_sampler", {"garbage_collection", "duplicate_data"}),
    ("fsdp2", [], "gc,no_sampler", {"garbage_collection", "duplicate_data"}),
    ("iterable", [], "no_sampler,gc", {"duplicate_data", "garbage_collection"}),
    ("accelerate_loop", [], "decode,float64", {"data_preparation", "float64"}),
    ("fabric_loop", [], "float64,gc", {"float64", "garbage_collection"}),
    ("trainer", [], "float64,decode", {"float64", "data_preparation"}),
]


@pytest.mark.parametrize(
    "style, flags, faults, checks", CASES, ids=[c[0] + "".join(c[1]).replace("--", "-") for c in CASES]
)
def test_each_style_is_probed_whole_and_both_planted_faults_are_named(tmp_path, style, flags, faults, checks):
    if style in ("fabric_loop", "trainer"):
        pytest.importorskip("lightning")
    if style == "accelerate_loop":
        pytest.importorskip("accelerate")
    run = tmp_path / style
    done = subprocess.run(
        [*LAUNCH, "--run-dir", str(run), str(STYLES / f"{style}.py"), "--steps", "30", "--fault", faults, *flags],
        capture_output=True,
        text=True,
        timeout=280,
    )
    log = (run / "logs" / "rank0.log").read_text() if (run / "logs" / "rank0.log").exists() else ""
    assert done.returncode == 0, done.stderr[-3000:] + log[-3000:]
    samples = int(re.findall(r"^SAMPLES_PER_STEP (\d+)$", log, re.M)[-1])
    steps = int(re.findall(r"^STEPS (\d+)$", log, re.M)[-1])
    probe = RunDir(run).read_summary()["probe"]
    assert probe["status"] == "on", probe
    assert probe["synchronised"] is True, probe  # DDP, FSDP2's collectives, a framework's own: seen
    for rank in probe["ranks"]:
        assert rank["steps"] == steps, (rank["rank"], rank["steps"], steps)
        assert sum(rank["phases_s"].values()) == pytest.approx(rank["step_s"], rel=0.01), rank["phases_s"]
        assert rank["samples_per_step"] == samples, (rank["rank"], rank["samples_per_step"], samples)
    named = {f["check"] for f in diagnose(run)["findings"]}
    assert checks <= named, (checks - named, named)


def test_accelerate_without_cpu_true_trains_copies_the_doctor_names_first_and_scale_calls_no_speedup(tmp_path):
    """A plain Accelerator() on CPU ranks joins the launcher's process group and trains each rank alone. Under
    `scale --script` its 2 ranks' samples/s add up, so the ratio looks like a speedup: the study flags the row and
    its headline refuses the word; the doctor names it first, with Accelerator(cpu=True) as the remedy."""
    pytest.importorskip("accelerate")
    out = tmp_path / "study"
    scale = [sys.executable, "-m", "paratrain", "scale", "--script", str(STYLES / "accelerate_mlp.py")]
    done = subprocess.run(
        [*scale, "--workers", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    headline = next(line for line in done.stdout.splitlines() if line.startswith("accelerate_mlp.py: "))
    assert "no speedup: the 2 ranks never synchronised" in headline and "speedup 1" not in headline, headline
    study = json.loads((out / "scaling.json").read_text())
    [row] = [r for r in study["rows"] if r["workers"] == 2]
    assert "unsynchronised" in row["flags"], row
    diagnosis = diagnose(Path(row["run_dir"]))
    first = diagnosis["findings"][0]
    assert first["check"] == "unsynchronised", diagnosis
    assert "Accelerator(cpu=True)" in first["remedy"] and "process group of 2" in first["evidence"]
    assert diagnosis["verdict"].startswith("fix first: the 2 ranks never synchronised: they trained 2 independent")
    assert "duplicate_data" not in [f["check"] for f in diagnosis["findings"]]  # each copy rightly reads it all
