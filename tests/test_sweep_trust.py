"""Sweeps that can be trusted (issue 15): validation by default, every metric shown, the sampler
named, --n-trials/--timeout, grids extended without redoing, the -j payoff, the heatmap."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_trial_script

from paratrain.runs.records import SweepResult

PARATRAIN = [sys.executable, "-m", "paratrain", "sweep"]

# score = 10 x + y, a second metric `loss2` = x - y, after TRIAL_SLEEP seconds; each finished trial
# appends x,y to FINISHED_LOG.
SCRIPT = textwrap.dedent("""\
    import argparse, os, time
    import paratrain
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--y", type=float, default=0.0)
    a, _ = p.parse_known_args()
    time.sleep(float(os.environ.get("TRIAL_SLEEP", 0)))
    paratrain.report(score=10 * a.x + a.y, loss2=a.x - a.y)
    with open(os.environ["FINISHED_LOG"], "a") as f:
        f.write(f"{a.x:g},{a.y:g}\\n")
""")


@pytest.fixture
def script(tmp_path, monkeypatch):
    return write_trial_script(tmp_path, monkeypatch, SCRIPT)


def grid(path: Path, parameters: dict, **spec) -> Path:
    path.write_text(
        json.dumps(
            {
                "algorithm": spec.pop("algorithm", "grid"),
                "parameters": parameters,
                "spec": {"metric": "score", "objective": "minimize", **spec},
            }
        )
    )
    return path


def sweep(*args, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*PARATRAIN, *map(str, args)], capture_output=True, text=True, timeout=180)
    if check and proc.returncode != 0:
        raise AssertionError(f"sweep failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def results(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def finished(tmp_path: Path) -> list[str]:
    log = tmp_path / "finished.log"
    return sorted(log.read_text().split()) if log.exists() else []


def test_a_two_parameter_grid_shows_every_metric_its_sampler_its_payoff_and_a_heatmap(tmp_path, script, monkeypatch):
    cfg = grid(
        tmp_path / "space.json",
        {"x": {"type": "discrete", "values": [1, 2]}, "y": {"type": "discrete", "values": [1, 2, 3]}},
    )
    out = tmp_path / "out"
    monkeypatch.setenv("TRIAL_SLEEP", "1")
    proc = sweep(cfg, "-j", 2, "--out", out, "--script", script, "--pruner", "none", "--quiet")
    result = results(out)
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 6

    # Every recorded metric: sweep.json names it, the terminal table and the report show it.
    assert result["recorded_metrics"] == ["score", "loss2", "time_s"]
    header = next(line for line in proc.stdout.splitlines() if "params" in line)
    assert "loss2" in header, proc.stdout
    row = next(line for line in proc.stdout.splitlines() if "x=2, y=1" in line)
    assert " 1 " in row.replace("│", " ") and " 21 " in row.replace("│", " "), row  # loss2 = 1, score = 21
    page = (out / "report.html").read_text()
    assert "<th>loss2</th>" in page

    # The sampler named for what it is.
    assert result["sampler"] == "grid" and "sampler: grid" in proc.stdout and "sampler: grid" in page
    assert "<td>sampler</td><td>grid</td>" in page  # the search space as values, not JSON

    # -j 2 paid off: six 1-s trials two at a time.
    par = result["parallelism"]
    assert par["trial_time_s"] == pytest.approx(sum(t["duration_s"] for t in trials))
    assert par["wall_time_s"] < 0.8 * par["trial_time_s"] and par["speedup"] == pytest.approx(
        par["trial_time_s"] / par["wall_time_s"]
    )
    line = (
        f"parallel speedup: {par['speedup']:.2f}x (sum of trial times {par['trial_time_s']:.1f} s "
        f"in {par['wall_time_s']:.1f} s of wall time)"
    )
    assert line in proc.stdout and line in page

    # The heatmap: x down, y across, the score in each cell; embedded in the report.
    from paratrain.reporting.plots import heatmap_cells

    assert heatmap_cells(SweepResult.model_validate(result), "score") == (
        [1, 2],
        [1, 2, 3],
        [[11.0, 12.0, 13.0], [21.0, 22.0, 23.0]],
    )
    assert (out / "sweep-heatmap.png").exists() and "alt='heatmap'" in page


def test_n_trials_and_timeout_stop_starting_trials_and_a_rerun_continues(tmp_path, script, monkeypatch):
    cfg = grid(tmp_path / "space.json", {"x": {"type": "discrete", "values": [1, 2, 3, 4, 5]}})
    out = tmp_path / "out"
    proc = sweep(cfg, "-j", 2, "--out", out, "--script", script, "--n-trials", 3, "--quiet")
    result = results(out)
    assert len(result["trials"]) == 3 and result["stopped_by"] == {"n_trials": 3}
    assert finished(tmp_path) == ["1,0", "2,0", "3,0"]
    assert "--n-trials 3 reached; 3 of 5 planned trial(s) finished; rerun" in proc.stdout

    # The timeout passes during the first trial: it finishes, no other starts.
    monkeypatch.setenv("TRIAL_SLEEP", "2.5")
    proc = sweep(cfg, "--out", out, "--script", script, "--timeout", 1, "--quiet")
    result = results(out)
    assert [t["state"] for t in result["trials"]] == ["COMPLETE"] * 4 and result["stopped_by"] == {"timeout": 1}
    assert finished(tmp_path) == ["1,0", "2,0", "3,0", "4,0"]

    monkeypatch.delenv("TRIAL_SLEEP")
    sweep(cfg, "--out", out, "--script", script, "--quiet")
    assert finished(tmp_path) == ["1,0", "2,0", "3,0", "4,0", "5,0"] and "stopped_by" not in results(out)


def test_a_finished_grid_extended_with_a_value_runs_only_the_new_combinations(tmp_path, script):
    values = {"x": {"type": "discrete", "values": [1, 2]}, "y": {"type": "discrete", "values": [1]}}
    cfg = grid(tmp_path / "space.json", values)
    out = tmp_path / "out"
    sweep(cfg, "--out", out, "--script", script, "--quiet")
    assert finished(tmp_path) == ["1,1", "2,1"]

    grid(cfg, {**values, "y": {"type": "discrete", "values": [1, 3]}})  # the user adds y = 3
    sweep(cfg, "--out", out, "--script", script, "--quiet")
    assert finished(tmp_path) == ["1,1", "1,3", "2,1", "2,3"], "the new combinations ran, the finished ones once"
    result = results(out)
    assert result["items"] == 4 and result["counts"]["COMPLETE"] == 4
    assert sorted(t["item"] for t in result["trials"]) == [0, 1, 2, 3]

    grid(cfg, {**values, "y": {"type": "discrete", "values": [3]}})  # a value removed: not an extension
    proc = sweep(cfg, "--out", out, "--script", script, "--quiet", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "different config" in proc.stderr and "adding numbers to a grid" in proc.stderr


def test_a_builtin_sweep_chooses_on_a_validation_split_by_default(tmp_path):
    cfg = grid(
        tmp_path / "space.json",
        {"lr": {"type": "discrete", "values": [0.05]}},
        metric="val_accuracy",
        objective="maximize",
    )
    out = tmp_path / "out"
    proc = sweep(
        cfg,
        "--out",
        out,
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        200,
        "--batch-size",
        50,
        "--epochs",
        2,
        "--lr-scaling",
        "none",
        "--quiet",
    )
    result = results(out)
    (trial,) = result["trials"]
    run = Path(trial["run_dir"]) / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_split"] == "val" and result["val_split"] == 0.1
    assert trial["value"] == summary["val_accuracy"]
    # The pruner saw the validation split's numbers, not the test split's.
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = {str(e["epoch"]): e["accuracy"] for e in evals if e.get("event") == "eval" and e["split"] == "val"}
    assert trial["intermediate"] == val
    assert result["recorded_metrics"][:4] == ["val_accuracy", "val_loss", "test_accuracy", "train_loss"]
    assert "val_* metrics: on a validation split of 10% of the training set" in proc.stdout


@pytest.mark.parametrize("case", ["val-split-0", "test-metric", "n-trials-0", "timeout-negative", "sampler-for-grid"])
def test_bad_sweep_input_is_one_line_exit_2_and_writes_nothing(tmp_path, script, case):
    good = grid(tmp_path / "space.json", {"x": {"type": "discrete", "values": [1]}})
    builtin = ["--workload", "synthetic-cnn", "--synthetic-samples", 200, "--lr-scaling", "none"]
    out = tmp_path / "out"
    args, expected = {
        "val-split-0": (
            [
                grid(tmp_path / "v.json", {"lr": {"type": "discrete", "values": [0.1]}}, metric="val_loss"),
                *builtin,
                "--val-split",
                0,
            ],
            "--val-split 0 leaves no validation split",
        ),
        "test-metric": (
            [
                grid(
                    tmp_path / "t.json",
                    {"lr": {"type": "discrete", "values": [0.1]}},
                    metric="test_accuracy",
                    objective="maximize",
                ),
                *builtin,
            ],
            "'test_accuracy' would choose on the test split",
        ),
        "n-trials-0": ([good, "--script", script, "--n-trials", 0], "--n-trials: "),
        "timeout-negative": ([good, "--script", script, "--timeout", -5], "--timeout: "),
        "sampler-for-grid": (
            [grid(tmp_path / "s.json", {"x": {"type": "discrete", "values": [1]}}, sampler="tpe"), "--script", script],
            'spec.sampler chooses the sampler of algorithm "bayes"',
        ),
    }[case]
    proc = sweep(*args, "--out", out, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in lines[0], lines[0]
    assert not out.exists(), "nothing written on bad input"


def _result(params: dict[str, list], metric: list[str], metrics_of) -> SweepResult:
    """A sweep.json of completed trials over every combination of `params`, as `report` reads it."""
    import itertools

    combos = [dict(zip(params, values)) for values in itertools.product(*params.values())]
    return SweepResult(
        name="trust",
        metric=metric,
        space={"parameters": {p: {"type": "discrete", "values": v} for p, v in params.items()}},
        trials=[
            {"number": i, "state": "COMPLETE", "params": c, "metrics": metrics_of(c)} for i, c in enumerate(combos)
        ],
    )


def test_sweep_plots_colour_by_the_second_parameter_and_show_test_beside_validation():
    from matplotlib.colors import to_hex

    from paratrain.reporting.plots import sweep_param_figure

    result = _result(
        {"lr": [0.01, 0.1], "batch_size": [16, 32]},
        ["val_accuracy"],
        lambda c: {"val_accuracy": c["lr"], "test_accuracy": c["lr"] / 2, "time_s": c["batch_size"] / 8},
    )
    fig = sweep_param_figure(result, "lr")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    # test_accuracy beside val_accuracy, each labelled with the split its values come from
    assert [ax.get_ylabel() for ax in panels] == ["val_accuracy", "test_accuracy", "trial time (s)"]
    assert list(panels[1].collections[0].get_offsets()[:, 1]) == [0.005, 0.005, 0.05, 0.05]
    # the trials at batch 16 share one colour, those at 32 another, in every panel
    for ax in panels:
        colours = [to_hex(c) for c in ax.collections[0].get_facecolors()]
        assert colours[0] == colours[2] != colours[1] == colours[3], colours
    legend = panels[0].get_legend()
    assert legend.get_title().get_text() == "batch_size" and [t.get_text() for t in legend.get_texts()] == ["16", "32"]
    assert [to_hex(h.get_color()) for h in legend.legend_handles] == [
        to_hex(c) for c in panels[0].collections[0].get_facecolors()[:2]
    ]


def test_a_continuous_second_parameter_gets_a_colorbar_and_a_lone_parameter_no_key():
    from paratrain.reporting.plots import DISTINCT_COLOURS, sweep_param_figure

    weights = [i / 100 for i in range(DISTINCT_COLOURS + 2)]
    fig = sweep_param_figure(
        _result(
            {"lr": [0.01, 0.1], "weight_decay": weights},
            ["score"],
            lambda c: {"score": c["lr"] + c["weight_decay"], "time_s": 1.0},
        ),
        "lr",
    )
    colorbars = [ax for ax in fig.axes if ax.get_ylabel() == "weight_decay"]
    assert len(colorbars) == 1 and not any(ax.get_legend() for ax in fig.axes)
    assert len({tuple(c) for c in fig.axes[0].collections[0].get_facecolors()}) == len(weights)

    alone = sweep_param_figure(
        _result({"lr": [0.01, 0.1]}, ["score"], lambda c: {"score": c["lr"], "time_s": 1.0}), "lr"
    )
    assert [ax.get_ylabel() for ax in alone.axes if ax.get_visible()] == ["score", "trial time (s)"]
    assert not any(ax.get_legend() for ax in alone.axes)
