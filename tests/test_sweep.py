"""`paratrain sweep` end to end: real trial processes, a real journal file, a real SIGKILL, two
drivers sharing one study, a real PostgreSQL server, a built-in workload, the report in a browser."""

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import browser_page, free_port, write_trial_script

PARATRAIN = [sys.executable, "-m", "paratrain", "sweep"]

# One script, many behaviours: parameter `mode` picks how it reports, `x` what it reports.
SCRIPT = textwrap.dedent("""\
    import argparse, json, os, sys, time
    import paratrain
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, default=0.0)
    p.add_argument("--mode", default="report")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--batch_size", type=float, default=0.0)
    p.add_argument("--wait-for", default=None, help="a file to wait for (at most 2 minutes) before training")
    a, _ = p.parse_known_args()
    deadline = time.time() + 120
    while a.wait_for and not os.path.exists(a.wait_for) and time.time() < deadline:
        time.sleep(0.05)
    assert json.loads(os.environ["PARATRAIN_PARAMS"]).get("x", 0.0) == a.x, "argv and PARATRAIN_PARAMS disagree"
    score = 10 * (a.x + a.batch_size)
    for step in range(a.steps):
        time.sleep(a.sleep)
        paratrain.report(score=score + a.steps - step, step=step)
    if a.mode == "report":
        time.sleep(a.sleep)
        paratrain.report(score=score)
    elif a.mode == "equals":
        print(f"score={score}")
    elif a.mode == "colon":
        print(f"score: {score}")
        print("done")
    elif a.mode == "json":
        print(json.dumps({"score": score, "other": "text"}))
    elif a.mode == "crash":
        print("boom", file=sys.stderr)
        sys.exit(3)
    elif a.mode == "nan":
        paratrain.report(score=float("nan"))
    elif a.mode == "slow":
        time.sleep(60)
    with open(os.environ["FINISHED_LOG"], "a") as f:
        f.write(f"{a.x}\\n")
""")


@pytest.fixture
def script(tmp_path, monkeypatch):
    return write_trial_script(tmp_path, monkeypatch, SCRIPT)


def space(path: Path, parameters: dict, **spec) -> Path:
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


def sweep(*args, check=True, timeout=240) -> subprocess.CompletedProcess:
    proc = subprocess.run([*PARATRAIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"sweep failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def results(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def _failures(trials: list[dict]) -> list[tuple]:
    """What went wrong, for an assertion message: pytest cuts long reprs, so only the bad trials."""
    return [(t["number"], t["params"], t["state"], t["reason"]) for t in trials if t["state"] != "COMPLETE"]


def finished(tmp_path: Path) -> list[float]:
    log = tmp_path / "finished.log"
    return sorted(float(x) for x in log.read_text().split()) if log.exists() else []


def test_grid_runs_every_combination_once_through_every_report_protocol(tmp_path, script):
    modes = ["report", "equals", "colon", "json"]
    cfg = space(
        tmp_path / "space.json",
        {"x": {"type": "discrete", "values": [1, 2, 3]}, "mode": {"type": "categorical", "values": modes}},
    )
    out = tmp_path / "out"
    proc = sweep(cfg, "-j", 2, "--out", out, "--script", script, "--quiet")
    result = results(out)
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 12, _failures(trials)
    assert sorted((t["params"]["x"], t["params"]["mode"]) for t in trials) == sorted(
        itertools.product([1, 2, 3], modes)
    )
    for t in trials:
        assert t["value"] == 10 * t["params"]["x"]
        for key in ("number", "params", "value", "state", "duration_s", "run_dir"):
            assert key in t
        assert (Path(t["run_dir"]) / "stdout.log").exists() and (Path(t["run_dir"]) / "command.txt").exists()
    assert result["best"]["value"] == 10 and result["best"]["params"]["x"] == 1
    assert (out / "report.html").exists() and (out / "sweep-history.png").exists() and (out / "study.journal").exists()
    assert "best: trial" in proc.stdout


def test_a_finished_trial_keeps_its_exit_code_while_another_slot_starts_one(tmp_path, monkeypatch):
    """Regression: CI saw a trial fail with 'exit status 255'. Process.start() polls every live
    child; when it polled a finished trial at the moment that trial's own slot thread did, CPython's
    forkserver Popen let both read the exit code, and the loser's EOF became 255 (gh-130895).
    A slowed-down read makes that window certain instead of rare."""
    from multiprocessing import forkserver
    from multiprocessing.connection import wait

    from paratrain.sweep.trial import ScriptCommand, Slot, TrialProcess

    quick = _write(tmp_path / "quick.sh", '#!/bin/sh\necho "score=$2"\n')
    quick.chmod(0o755)
    slot = Slot(0, tuple(sorted(os.sched_getaffinity(0))))
    first = TrialProcess(ScriptCommand(str(quick)), {"x": 1}, tmp_path / "a", slot, 0, 1, 0)
    assert wait([first.process.sentinel], 30), "the trial did not finish"
    read_signed = forkserver.read_signed

    def slow_read(fd: int) -> int:
        time.sleep(0.3)
        return read_signed(fd)

    monkeypatch.setattr(forkserver, "read_signed", slow_read)
    poller = threading.Thread(target=first.running)  # the trial's own slot thread polling
    poller.start()
    time.sleep(0.05)
    second = TrialProcess(ScriptCommand(str(quick)), {"x": 2}, tmp_path / "b", slot, 0, 1, 1)  # polls `first` too
    poller.join()
    outcome = first.outcome(["score"])
    assert (outcome.state, outcome.values, outcome.reason) == ("COMPLETE", [1.0], None)
    second.wait(30)
    assert second.outcome(["score"]).values == [2.0]


def test_failing_trials_are_recorded_with_their_reason_and_the_sweep_goes_on(tmp_path, script):
    cfg = tmp_path / "space.json"
    cfg.write_text(
        json.dumps(
            {
                "algorithm": "grid",
                "parameters": {"mode": {"type": "categorical", "values": ["crash", "nan", "silent", "slow", "report"]}},
                "spec": {"metric": "score", "objective": "minimize", "retryLimit": 1},
            }
        )
    )
    out = tmp_path / "out"
    sweep(cfg, "-j", 2, "--out", out, "--script", script, "--trial-timeout", 3, "--quiet")
    trials = results(out)["trials"]
    by_mode: dict = {}
    for t in trials:
        by_mode.setdefault(t["params"]["mode"], []).append(t)
    assert [t["state"] for t in by_mode["report"]] == ["COMPLETE"]
    assert [t["attempt"] for t in by_mode["crash"]] == [0, 1], "retryLimit 1: one retry"
    assert all(t["state"] == "FAIL" for m in ("crash", "nan", "silent", "slow") for t in by_mode[m])
    assert by_mode["crash"][0]["reason"] == "exit status 3: boom"
    assert "score = nan" in by_mode["nan"][0]["reason"]
    assert "never reported 'score'" in by_mode["silent"][0]["reason"]
    assert by_mode["slow"][0]["reason"] == "timed out after 3 s"
    assert results(out)["best"]["params"]["mode"] == "report"


def test_median_pruner_stops_trials_worse_than_the_median(tmp_path, script):
    cfg = space(tmp_path / "space.json", {"x": {"type": "discrete", "values": list(range(9))}})
    out = tmp_path / "out"
    # A grid prunes only when asked: it is run to see every combination.
    sweep(
        cfg,
        "-j",
        2,
        "--out",
        out,
        "--script",
        script,
        "--pruner",
        "median",
        "--quiet",
        "--",
        "--steps",
        4,
        "--sleep",
        0.3,
    )
    trials = results(out)["trials"]
    pruned = [t for t in trials if t["state"] == "PRUNED"]
    assert pruned, [(t["params"], t["state"]) for t in trials]
    assert all(t["reason"].startswith("pruned at step") and t["params"]["x"] >= 4 for t in pruned)
    assert all(t["intermediate"] for t in trials)


@pytest.mark.parametrize("algorithm", ["grid", "random"])
def test_default_flags_never_prune_a_grid_or_by_batch(tmp_path, script, algorithm):
    """#27: a grid over batch sizes 8..512 lost both batch-512 trials "at step 0". Here a larger
    batch_size is worse at every step (as a large batch is at an equal early epoch), so a median
    pruner would stop the upper half: the grid must not prune by default, and a random sweep, which
    does prune by default, must not prune by batch."""
    cfg = space(
        tmp_path / "space.json",
        {"batch_size": {"type": "discrete", "values": list(range(9))}},
        algorithm=algorithm,
        maxCombo=9,
    )
    out = tmp_path / "out"
    sweep(cfg, "-j", 2, "--out", out, "--script", script, "--quiet", "--", "--steps", 4, "--sleep", 0.3)
    trials = results(out)["trials"]
    assert len(trials) == 9 and all(t["state"] == "COMPLETE" for t in trials), [
        (t["params"], t["state"]) for t in trials
    ]


def test_sigkill_and_rerun_loses_and_repeats_nothing(tmp_path, script):
    cfg = space(tmp_path / "space.json", {"x": {"type": "discrete", "values": list(range(6))}})
    out = tmp_path / "out"
    args = [
        *PARATRAIN,
        str(cfg),
        "-j",
        "2",
        "--out",
        str(out),
        "--script",
        str(script),
        "--quiet",
        "--",
        "--sleep",
        "1.5",
    ]
    driver = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(finished(tmp_path)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the next trials are under way
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    before = finished(tmp_path)
    assert 2 <= len(before) < 6
    time.sleep(2.0)
    survivors = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert not survivors, "trials outlived their killed sweep"

    subprocess.run(args, check=True, capture_output=True, timeout=120)
    assert finished(tmp_path) == [0, 1, 2, 3, 4, 5], "every combination finished exactly once over both runs"
    trials = results(out)["trials"]
    complete = sorted(t["params"]["x"] for t in trials if t["state"] == "COMPLETE")
    assert complete == [0, 1, 2, 3, 4, 5]
    for t in trials:
        if t["state"] != "COMPLETE":
            assert t["state"] == "FAIL" and t["reason"].startswith("interrupted"), t
    assert len(trials) - len(complete) >= 1, "the trials running at the kill are on record as interrupted"


def test_two_drivers_share_one_study(tmp_path, script):
    cfg = space(tmp_path / "space.json", {"x": {"type": "discrete", "values": list(range(6))}})
    out = tmp_path / "out"
    first = subprocess.Popen(
        [*PARATRAIN, str(cfg), "--out", str(out), "--script", str(script), "--quiet", "--", "--sleep", "0.8"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not (out / "trials").exists() and time.time() < deadline:
        time.sleep(0.1)
    second = sweep("--join", out, "--quiet")
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert "best: trial" in second.stdout
    trials = results(out)["trials"]
    assert sorted(t["params"]["x"] for t in trials) == [0, 1, 2, 3, 4, 5]  # each item once: no duplicates
    assert all(t["state"] == "COMPLETE" for t in trials)
    assert finished(tmp_path) == [0, 1, 2, 3, 4, 5]
    pids = _owner_pids(out)
    assert len(pids) == 2, f"both drivers ran trials: {pids}"


def _owner_pids(out: Path) -> set[int]:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "study.journal")))
    study = optuna.load_study(study_name="sweep", storage=storage)
    return {t.user_attrs["owner"]["pid"] for t in study.trials}


def test_multi_objective_finds_a_pareto_front(tmp_path):
    script = tmp_path / "mo.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser(); p.add_argument('--width', type=int)\n"
        "w = p.parse_args().width\nprint(f'val_accuracy={1 - 1 / w} time_s={w * w}')\n"
    )
    cfg = tmp_path / "space.json"
    cfg.write_text(
        json.dumps(
            {
                "algorithm": "random",
                "parameters": {"width": {"type": "integer", "min": 1, "max": 40}},
                "spec": {
                    "metric": ["val_accuracy", "time_s"],
                    "objective": ["maximize", "minimize"],
                    "maxCombo": 8,
                    "seed": 1,
                },
            }
        )
    )
    out = tmp_path / "out"
    sweep(cfg, "-j", 2, "--out", out, "--script", script, "--quiet")
    result = results(out)
    front = result["best"]["pareto_front"]
    done = [t for t in result["trials"] if t["state"] == "COMPLETE"]
    assert len(done) == 8 and front
    # Accuracy rises and time rises with width: every distinct width is Pareto-optimal.
    assert sorted({t["params"]["width"] for t in front}) == sorted({t["params"]["width"] for t in done})
    assert (out / "sweep-pareto.png").exists()


def test_builtin_workload_sweep_with_derived_lr(tmp_path):
    cfg = tmp_path / "space.json"
    cfg.write_text(
        json.dumps(
            {
                "algorithm": "grid",
                "parameters": {"batch_size": {"type": "discrete", "values": [16, 64]}},
                "spec": {"metric": "val_accuracy", "objective": "maximize"},
                "lr_scaling": {"rule": "linear", "base_batch_size": 16, "base_lr": 0.01},
            }
        )
    )
    out = tmp_path / "out"
    sweep(
        cfg,
        "-j",
        2,
        "--out",
        out,
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        512,
        "--epochs",
        2,
        "--pruner",
        "none",
        "--quiet",
    )
    result = results(out)
    assert [t["state"] for t in result["trials"]] == ["COMPLETE", "COMPLETE"]
    for t in result["trials"]:
        summary = json.loads((Path(t["run_dir"]) / "run" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["batch_size"] == t["params"]["batch_size"]
        assert summary["lr"] == pytest.approx(0.01 * t["params"]["batch_size"] / 16)
        assert t["value"] == summary["val_accuracy"] and t["launch_overhead_s"] is not None
        assert list(t["intermediate"]) == ["0", "1"]
    from paratrain.formatting import seconds

    with browser_page(out / "report.html") as page:
        assert page.evaluate("document.querySelectorAll('#trials tbody tr').length") == 2
        assert page.evaluate("document.querySelectorAll('#best tbody tr').length") == 1
        # the verdict first: the best configuration, then what the searched parameter did to accuracy and time
        lines = page.evaluate("[...document.querySelectorAll('#verdict .headline')].map(e => e.innerText)")
        best = result["best"]
        assert lines[0] == (
            f"best: trial {best['number']} (batch_size={best['params']['batch_size']}, lr={best['params']['lr']:.3g}): "
            f"val_accuracy {best['value']:.1%} in {seconds(best['metrics']['time_s'])}"
        )
        assert lines[1].startswith("batch_size 16 -> 64: val_accuracy ") and ", trial time " in lines[1]


# -- PostgreSQL -------------------------------------------------------------------------------


@pytest.fixture
def postgres(tmp_path):
    """A throwaway PostgreSQL server on a free port, run as the `postgres` user."""
    initdb = (
        next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))), None)
        if Path("/usr/lib/postgresql").exists()
        else None
    )
    if initdb is None:
        pytest.skip("POSTGRESQL TEST SKIPPED: Debian's postgresql is not installed (make test installs it as root)")
    bin_dir = initdb.parent
    as_postgres = [] if os.getuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if os.getuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("POSTGRESQL TEST SKIPPED: no postgres user to run the server as")
    # pytest's tmp dirs are private to root; the server's data dir must be reachable by its user.
    home = Path(tempfile.mkdtemp(prefix="paratrain-pg-"))
    data = home / "data"
    data.mkdir()
    if os.getuid() == 0:
        shutil.chown(home, "postgres")
        shutil.chown(data, "postgres")
    port = free_port()
    subprocess.run(
        [*as_postgres, str(initdb), "-D", str(data), "-A", "trust", "-U", "postgres"], check=True, capture_output=True
    )
    started = subprocess.run(
        [
            *as_postgres,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(data / "log"),
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        pytest.skip(f"POSTGRESQL TEST SKIPPED: the server did not start: {started.stderr.strip()[:200]}")
    try:
        subprocess.run(
            [*as_postgres, str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "sweeps"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql://postgres@127.0.0.1:{port}/sweeps"
    finally:
        subprocess.run(
            [*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(home, ignore_errors=True)


def test_postgresql_storage_shared_by_two_drivers(tmp_path, script, postgres):
    cfg = space(tmp_path / "space.json", {"x": {"type": "discrete", "values": list(range(4))}})

    def driver(*args) -> subprocess.Popen:
        return subprocess.Popen(
            [*PARATRAIN, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_for(path: Path, seconds: float) -> None:
        deadline = time.time() + seconds
        while not path.exists() and time.time() < deadline:
            time.sleep(0.1)

    # The first driver's trials wait for "go", which is given once the second driver has a trial of its own:
    # with a fixed sleep instead, the first finished all four before a slow machine's second driver had joined.
    go = tmp_path / "go"
    first = driver(
        cfg, "--out", tmp_path / "a", "--storage", postgres, "--script", script, "--quiet", "--", "--wait-for", go
    )
    wait_for(tmp_path / "a" / "trials", 60)
    joined = driver("--join", postgres, "--out", tmp_path / "b", "--quiet")
    wait_for(tmp_path / "b" / "trials", 120)
    go.touch()
    _, first_stderr = first.communicate(timeout=120)
    assert first.returncode == 0, first_stderr
    _, joined_stderr = joined.communicate(timeout=120)
    assert joined.returncode == 0, joined_stderr
    trials = results(tmp_path / "a")["trials"]
    assert sorted(t["params"]["x"] for t in trials) == [0, 1, 2, 3] and all(t["state"] == "COMPLETE" for t in trials)
    dirs = {Path(t["run_dir"]).parent.parent.name for t in trials}
    assert dirs == {"a", "b"}, "both drivers ran trials, each into its own --out"
    assert "storage" in results(tmp_path / "b") and "postgresql://postgres@" in joined_stderr + json.dumps(
        results(tmp_path / "b")
    )


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "malformed",
        "no-script",
        "not-executable",
        "bad-param",
        "oversubscribe",
        "bad-join",
        "bad-metric",
        "bad-data-dir",
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, script, case):
    good = space(tmp_path / "space.json", {"x": {"type": "discrete", "values": [1, 2]}})
    out = tmp_path / "out"
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho score=1\n")
    args = {
        "missing": [tmp_path / "nope.json", "--out", out, "--script", script],
        "malformed": [
            _write(tmp_path / "bad.json", '{"algorithm": "grid",\n "parameters": {"x": }}'),
            "--out",
            out,
            "--script",
            script,
        ],
        "no-script": [good, "--out", out, "--script", tmp_path / "nope.py"],
        "not-executable": [good, "--out", out, "--script", plain],
        "bad-param": [
            space(tmp_path / "s2.json", {"hidden": {"type": "integer", "min": 1, "max": 2}}, metric="val_loss"),
            "--out",
            out,
        ],
        "oversubscribe": [good, "-j", os.cpu_count() + 1, "--out", out, "--script", script],
        "bad-join": ["--join", tmp_path / "nowhere"],
        "bad-metric": [
            space(tmp_path / "s3.json", {"batch_size": {"type": "discrete", "values": [8]}}, metric="f1"),
            "--out",
            out,
            "--lr-scaling",
            "none",
        ],
        "bad-data-dir": [
            space(tmp_path / "s4.json", {"lr": {"type": "discrete", "values": [0.1]}}, metric="val_loss"),
            "--out",
            out,
            "--data-dir",
            tmp_path / "no-data",
        ],
    }[case]
    proc = sweep(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists(), "nothing written on bad input"
    expected = {
        "missing": "does not exist",
        "malformed": "line 2, column 22: expected value",
        "no-script": "does not exist",
        "not-executable": "not executable",
        "bad-param": "'hidden' is not a train option",
        "oversubscribe": "cores",
        "bad-join": "no sweep there",
        "bad-metric": "'f1' is not in",
        "bad-data-dir": "no-data",
    }[case]
    assert expected in lines[0], lines[0]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_bayes_search_with_repeats(tmp_path, script, sampler):
    cfg = tmp_path / "space.json"
    cfg.write_text(
        json.dumps(
            {
                "algorithm": "bayes",
                "trials": 2,
                "parameters": {"x": {"type": "float", "min": -1.0, "max": 1.0}},
                "spec": {"metric": "score", "objective": "minimize", "maxCombo": 4, "sampler": sampler},
            }
        )
    )
    out = tmp_path / "out"
    sweep(cfg, "-j", 2, "--out", out, "--script", script, "--quiet")
    trials = results(out)["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 8, _failures(trials)
    by_item = sorted(trials, key=lambda t: t["item"])
    assert [t["item"] for t in by_item] == list(range(8))
    for first, second in zip(by_item[::2], by_item[1::2]):  # repeats of a combination share its values
        assert (first["repeat"], second["repeat"]) == (0, 1) and first["params"] == second["params"]
    assert len({t["params"]["x"] for t in trials}) == 4


def test_each_builtin_trial_can_be_data_parallel(tmp_path):
    cfg = space(tmp_path / "space.json", {"lr": {"type": "discrete", "values": [0.05]}}, metric="val_loss")
    out = tmp_path / "out"
    sweep(
        cfg,
        "--workers-per-trial",
        2,
        "--out",
        out,
        "--workload",
        "synthetic-cnn",
        "--synthetic-samples",
        256,
        "--epochs",
        1,
        "--quiet",
    )
    (trial,) = results(out)["trials"]
    assert trial["state"] == "COMPLETE", trial["reason"]
    summary = json.loads((Path(trial["run_dir"]) / "run" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["strategy"] == "ddp"


def test_grid_with_repeats_runs_every_combination_times_repeats_exactly_once(tmp_path, script):
    cfg = tmp_path / "space.json"
    cfg.write_text(
        json.dumps(
            {
                "algorithm": "grid",
                "trials": 2,
                "parameters": {"x": {"type": "discrete", "values": [1, 2, 3]}},
                "spec": {"metric": "score", "objective": "minimize"},
            }
        )
    )
    out = tmp_path / "out"
    sweep(cfg, "-j", 2, "--out", out, "--script", script, "--pruner", "none", "--quiet")
    result = results(out)
    trials = result["trials"]
    assert result["items"] == 6 and [t["state"] for t in trials] == ["COMPLETE"] * 6, _failures(trials)
    # item i is repeat i % trials of combination i // trials
    assert sorted((t["item"], t["params"]["x"], t["repeat"]) for t in trials) == [
        (0, 1, 0),
        (1, 1, 1),
        (2, 2, 0),
        (3, 2, 1),
        (4, 3, 0),
        (5, 3, 1),
    ]
    assert finished(tmp_path) == [1, 1, 2, 2, 3, 3], "each combination ran once per repeat"


# `paratrain sweep` whose slot thread raises while it watches the trial with x == 2, a second into
# it: by then the other slot has long started its trial.
FAILING_SLOT = textwrap.dedent("""\
    import json, sys
    from paratrain.cli import main
    from paratrain.sweep.trial import TrialProcess
    reports = TrialProcess.new_reports
    def fail_on_x2(self):
        if json.loads((self.trial_dir / "params.json").read_text())["x"] == 2 and self.elapsed() > 1:
            raise RuntimeError("storage on fire\\nsecond line")
        return reports(self)
    TrialProcess.new_reports = fail_on_x2
    sys.exit(main(sys.argv[1:]))
""")


def test_an_exception_in_a_slot_thread_fails_the_sweep_and_records_what_ran(tmp_path, script):
    """A slot thread that dies must stop the sweep with one line and exit 1, the trial it ran and
    the one on the other slot stopped and recorded as interrupted; a rerun then finishes the budget."""
    cfg = space(tmp_path / "space.json", {"x": {"type": "discrete", "values": [1, 2, 3, 4]}})
    out = tmp_path / "out"
    args = [cfg, "-j", 2, "--out", out, "--script", script, "--pruner", "none", "--quiet", "--", "--sleep", 3]
    proc = subprocess.run(
        [sys.executable, "-c", FAILING_SLOT, "sweep", *map(str, args)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, proc.stderr
    assert [line for line in lines if "failed" in line] == [lines[-1]], proc.stderr
    assert "slot-" in lines[-1] and "RuntimeError: storage on fire" in lines[-1] and "second line" not in lines[-1]

    result = results(out)
    failure = result["failure"]
    assert failure["error"] == "RuntimeError: storage on fire" and "fail_on_x2" in failure["traceback"]
    assert failure["trial"]["params"] == {"x": 2} and failure["trial"]["number"] in failure["running"]
    states = {t["params"]["x"]: (t["state"], t["reason"]) for t in result["trials"]}
    assert states[2] == ("FAIL", "interrupted: the sweep failed (RuntimeError: storage on fire)")
    assert states[1] == ("FAIL", "interrupted: the sweep was stopped"), "the other slot's trial is stopped too"
    assert set(states) == {1, 2}, "no trial starts after the failure"
    assert finished(tmp_path) == [], "the running trials were stopped, not left to finish"

    sweep(*args)
    rerun = results(out)
    assert "failure" not in rerun
    assert sorted(t["params"]["x"] for t in rerun["trials"] if t["state"] == "COMPLETE") == [1, 2, 3, 4]
    assert finished(tmp_path) == [1, 2, 3, 4]


TORCH_SCRIPT = textwrap.dedent("""\
    import argparse, time
    import torch
    import paratrain

    class SlowDisk(torch.utils.data.Dataset):       # each sample takes 2 ms to read
        def __len__(self):
            return 128

        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(4)

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float)
    lr = p.parse_args().lr
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for x in torch.utils.data.DataLoader(SlowDisk(), batch_size=16):
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    paratrain.report(score=loss.item())
""")


def test_script_trials_run_under_the_probe_unless_told_not_to(tmp_path):
    # A .py --script trial starts as launch's ranks do, through the probe: its steps are timed by phase
    # in TRIAL_DIR/probe/rank0.jsonl (docs/doctor.md), and the doctor reads the best trial's; --no-probe
    # runs the script untouched.
    script = tmp_path / "train.py"
    script.write_text(TORCH_SCRIPT)
    config = space(tmp_path / "space.json", {"lr": {"type": "discrete", "values": [0.01, 0.1]}})
    for flags, out in (([], tmp_path / "probed"), (["--no-probe"], tmp_path / "bare")):
        sweep(config, "--out", out, "--script", script, *flags)
        assert all(t["state"] == "COMPLETE" for t in results(out)["trials"]), _failures(results(out)["trials"])
    for trial in sorted((tmp_path / "probed" / "trials").iterdir()):
        records = [json.loads(line) for line in (trial / "probe" / "rank0.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["kind"] == "step"]
        assert len(steps) == 8 and all(s["samples"] == 16 and s["forward"] > 0 for s in steps), records
    assert not list((tmp_path / "bare" / "trials").glob("*/probe"))
    doctor = subprocess.run(
        [sys.executable, "-m", "paratrain", "doctor", str(tmp_path / "probed"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    findings = {f["check"]: f for f in json.loads(doctor.stdout)["findings"]}
    assert findings["data_wait"]["finding"].startswith("best trial"), findings
    assert str(script) in findings["data_wait"]["remedy"]
