"""`paratrain launch` (any torchrun-style script on N ranks) and `paratrain scale --script`."""

import json
import os
from pathlib import Path

import pytest
import torch

import paratrain.launch.probe as paratrain_probe
from paratrain.cli import main
from paratrain.measure.monitor import SYSTEM_FILE
from paratrain.reporting.verdict import run_verdict
from paratrain.runs import RunDir

# A plain DDP script as users write them for torchrun: gloo, a tiny Linear, a few steps; it knows
# nothing of paratrain but report(). Rank FAIL_RANK exits 3 at the end.
DDP_SCRIPT = """\
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import paratrain

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print("argv", sys.argv[1:], "rank", rank, "local", os.environ["LOCAL_RANK"], "cores", sorted(os.sched_getaffinity(0)),
      "threads", torch.get_num_threads(), "mode", os.environ.get("PARATRAIN_SCALE_MODE"), flush=True)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 8)
for epoch in range(3):
    started = time.perf_counter()
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    paratrain.report(step=epoch, samples=10 * 32 * world, epoch_time_s=time.perf_counter() - started)
del model, opt     # DDP before its process group: torch 2.13 can abort at exit otherwise (docs/launch.md)
dist.destroy_process_group()
# os._exit: the exit status is what these tests check, and interpreter teardown after DDP can still
# abort now and then on torch 2.13 (docs/launch.md).
sys.stdout.flush()
os._exit(3 if os.environ.get("FAIL_RANK") == str(rank) else 0)
"""


@pytest.fixture(scope="module")
def ddp_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("script") / "ddp_train.py"
    path.write_text(DDP_SCRIPT)
    return path


@pytest.fixture(scope="module")
def launched(ddp_script, tmp_path_factory):
    """`paratrain launch -n 2 ddp_train.py --flag value` (the CLI's main, whose return value is the
    command's exit status), run once for several tests."""
    run_dir = tmp_path_factory.mktemp("launch") / "run"
    status = main(
        ["launch", "-n", "2", "--run-dir", str(run_dir), "--monitor-hz", "5", str(ddp_script), "--flag", "value"]
    )
    return status, run_dir


def test_launch_runs_a_ddp_script_on_two_pinned_ranks(launched):
    status, run_dir = launched
    assert status == 0, [(run_dir / "logs" / f"rank{r}.log").read_text()[-4000:] for r in (0, 1)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["exit_code"] == 0 and summary["workers"] == 2
    assert summary["wall_time_s"] > 0
    # what the script reported: samples of one epoch over both ranks and the epoch times, read back
    assert summary["reported"]["samples"] == 640 and len(summary["epoch_times_s"]) == 3
    assert summary["samples_per_s"] == pytest.approx(640 / summary["epoch_time_s"])
    run = RunDir(run_dir)  # the run's page says whose figure it is: the script's own
    assert "samples/s reported" in run_verdict(run.summary_record(), run.read_config())[0]
    logs = {r: (run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1)}
    # each rank: its own log, the script's arguments, its own core, one thread
    assert "argv ['--flag', 'value'] rank 0 local 0" in logs[0] and "rank 1 local 1" in logs[1]
    cores = [logs[r].split("cores ")[1].split(" threads")[0] for r in (0, 1)]
    assert cores[0] != cores[1] and all(len(json.loads(c)) == 1 for c in cores)
    assert all("threads 1" in logs[r] for r in (0, 1))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["command"][-3:] == [config["script"], "--flag", "value"] and config["workers"] == 2
    ranks = [json.loads(line) for line in (run_dir / SYSTEM_FILE).read_text().splitlines()]
    assert {r["rank"] for r in ranks if r["kind"] == "rank"} == {0, 1}


def test_launch_returns_the_exit_status_of_a_failing_rank(ddp_script, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("FAIL_RANK", "1")
    assert main(["launch", "-n", "2", "--run-dir", str(run_dir), str(ddp_script)]) == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 3 and summary["failed_rank"] == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("paratrain launch: rank 1 failed with exit status 3: ")
    assert err[0].endswith(f"(see {run_dir / 'logs' / 'rank1.log'})")  # the last line of that rank's log between


def test_a_rank_killed_by_a_signal_is_named_with_the_python_line_it_was_running(tmp_path, capsys):
    """A segfault in native code leaves no Python traceback of its own: every rank runs with Python's fault
    handler (PYTHONFAULTHANDLER), and the command's one line names the fatal error and the innermost line."""
    script = tmp_path / "crash.py"
    script.write_text("import ctypes, os\nif os.environ['RANK'] == '1':\n    ctypes.string_at(0)\n")
    run_dir = tmp_path / "run"
    assert main(["launch", "-n", "2", "--no-probe", "--run-dir", str(run_dir), str(script)]) == 128 + 11
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("paratrain launch: rank 1 failed with killed by SIGSEGV: Segmentation fault in __init__")
    assert "(string_at), called from crash.py:3 (<module>) (see " in err[0]  # ctypes, then the script


def test_a_fatal_error_inside_the_probe_s_profiler_says_how_to_run_without_it(tmp_path):
    """What the fault handler wrote when torch.profiler's stop crashed in a rank (the probe's trace window)."""
    from paratrain.launch.script import _fatal_error

    probe_dir = Path(paratrain_probe.__file__).parent
    log = tmp_path / "rank0.log"
    log.write_text(
        "epoch 1\nFatal Python error: Segmentation fault\n\n"
        'Thread 0x00007e (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
        "Current thread 0x00007f (most recent call first):\n"
        f'  File "{Path(torch.__file__).parent / "profiler" / "profiler.py"}", line 230 in stop\n'
        f'  File "{probe_dir / "window.py"}", line 77 in _stop\n'
        f'  File "{probe_dir / "clock.py"}", line 160 in end_step\n'
        '  File "/home/u/train.py", line 30 in <module>\n\nExtension modules: numpy.core (total: 1)\n'
    )
    said = _fatal_error(log)
    assert said.startswith("Segmentation fault in profiler.py:230 (stop), called from window.py:77 (_stop); it crashed")
    assert said.endswith("PARATRAIN_PROBE_TRACE=0 turns it off")
    log.write_text(log.read_text().replace(str(probe_dir), "/home/u/lib"))
    assert _fatal_error(log) == "Segmentation fault in profiler.py:230 (stop), called from window.py:77 (_stop)"


def test_launch_names_the_rank_that_failed_not_the_one_it_stopped(tmp_path, capsys):
    """Rank 1 exits 3 while rank 0 is still working: the agent stops rank 0 (SIGTERM) and torch lists it
    among the failures too. The command's status and line are rank 1's, never 143 (128 + SIGTERM)."""
    script = tmp_path / "one_fails.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n")
    run_dir = tmp_path / "run"
    assert main(["launch", "-n", "2", "--no-probe", "--run-dir", str(run_dir), str(script)]) == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 3 and summary["failed_rank"] == 1
    assert capsys.readouterr().err.startswith("paratrain launch: rank 1 failed with exit status 3")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["launch", "missing.py"], "missing.py does not exist; pass the path of your training script"),
        (["launch", "-n", "0", "SCRIPT"], "--workers: Input should be greater than 0 (got 0)"),
        (["launch", "--monitor-hz", "0", "SCRIPT"], "--monitor-hz: Input should be greater than 0 (got 0.0)"),
        (
            ["scale", "--script", "SCRIPT", "--workers", "1,2", "--epochs", "2", "--out", "study"],
            "train flags (--epochs) apply to built-in workloads; with --script pass your script's own arguments after "
            "--",
        ),
    ],
)
def test_bad_launch_input_is_one_line_and_writes_nothing(argv, message, ddp_script, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([str(ddp_script) if a == "SCRIPT" else a for a in argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"paratrain {argv[0]}: error: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_scale_script_builds_the_scaling_table(ddp_script, tmp_path, capsys):
    """`scale --script` on 1 and 2 workers: the study's rows, speedup from what the script reported,
    the mode passed to the script, and the same table and report as built-in workloads."""
    out = tmp_path / "study"
    assert main(["scale", "--script", str(ddp_script), "--workers", "1,2", "--mode", "strong", "--out", str(out)]) == 0
    result = json.loads((out / "scaling.json").read_text())
    rows = {(r["workers"], r["point"]): r for r in result["rows"]}
    assert set(rows) == {(1, "scaling"), (2, "scaling"), (1, "all_cores_reference")}
    one, two = rows[(1, "scaling")], rows[(2, "scaling")]
    assert one["workload"] == "ddp_train.py" and one["speedup"] == 1.0 and one["speedup_basis"] == "samples_per_s"
    assert two["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert rows[(1, "all_cores_reference")]["threads_per_worker"] == len(os.sched_getaffinity(0))
    assert "mode strong" in (Path(two["run_dir"]) / "logs" / "rank1.log").read_text()
    table = capsys.readouterr().out
    assert (
        "ddp_train.py" in table
        and "speedup" in table
        and (out / "report.html").exists()
        and (out / "speedup.png").exists()
    )


def test_scale_script_that_reports_no_throughput_says_how(tmp_path, capsys):
    script = tmp_path / "silent.py"
    script.write_text("print('trained')\n")
    assert main(["scale", "--script", str(script), "--workers", "1", "--out", str(tmp_path / "study")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the study's banner
    assert last.startswith("paratrain scale: error: --script silent.py reported no throughput")
    assert "paratrain.report(samples_per_s=...)" in last
