"""benchmarks/goodput_bound.py: the bound docs/batch-size.md gives for how much sooner any batch schedule could
reach a run's end than a fixed batch (issue #30), on run directories written here with known readings."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "goodput_bound.py"


def _bound_module():
    spec = importlib.util.spec_from_file_location("goodput_bound", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fixed(root: Path, batch: int, samples_per_s: float) -> Path:
    run = root / f"fixed-{batch}"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"global_batch_size": batch, "samples_per_s": samples_per_s}))
    return run


def _grown(root: Path, readings: list[tuple[int, int, float]]) -> Path:
    """A run's noise events: (step, global batch, B_noise)."""
    run = root / "adaptive"
    run.mkdir()
    events = [{"event": "noise", "step": s, "global_batch": b, "noise_scale": n} for s, b, n in readings]
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, events)))
    return run


def _printed(monkeypatch, capsys, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", ["goodput_bound.py", *argv])
    _bound_module().main()
    return capsys.readouterr().out


def test_the_oracle_bound_against_a_fixed_batch_by_hand(tmp_path, monkeypatch, capsys):
    """Batch 8 runs 2x batch 4's samples a second. At B_noise 4 a sample at 8 counts (4 + 4) / (4 + 8) of one at
    4, so 8 makes 2 x 2/3 = 4/3 the progress a second; at B_noise 12, 2 x 16/20 = 1.6. The run spent 10 steps at
    batch 4 (40 samples, 4 s at batch 4's 10 samples/s), then 10 at 8 (80 samples, worth 80 x 16/20 = 64 at
    batch 4: 6.4 s). The oracle spends 4 / (4/3) + 6.4 / 1.6 = 7 s: 10.4 / 7 = 1.486x sooner than batch 4."""
    fixed = [_fixed(tmp_path, 4, 10.0), _fixed(tmp_path, 8, 20.0)]
    run = _grown(tmp_path, [(10, 4, 4.0), (20, 8, 12.0)])
    out = _printed(monkeypatch, capsys, "--against", "4", "--fixed", *map(str, fixed), "--", str(run))
    assert "an oracle schedule at most 1.49x sooner" in out
    assert "the best batch's goodput at most 1.60x (batch 8)" in out


def test_a_batch_that_is_no_faster_gains_nothing_whatever_the_noise(tmp_path, monkeypatch, capsys):
    fixed = [_fixed(tmp_path, 4, 10.0), _fixed(tmp_path, 8, 10.0)]
    run = _grown(tmp_path, [(10, 4, 1e6), (20, 4, 1e6)])
    out = _printed(monkeypatch, capsys, "--fixed", *map(str, fixed), "--", str(run))
    assert "an oracle schedule at most 1.00x sooner" in out


def test_a_fixed_batch_without_a_run_is_refused(tmp_path, monkeypatch, capsys):
    fixed = [_fixed(tmp_path, 4, 10.0)]
    run = _grown(tmp_path, [(10, 4, 4.0)])
    with pytest.raises(SystemExit) as refused:
        _printed(monkeypatch, capsys, "--against", "16", "--fixed", *map(str, fixed), "--", str(run))
    assert refused.value.code == 2 and "--against 16: no fixed run at that global batch" in capsys.readouterr().err
