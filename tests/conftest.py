import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Decoded datasets go to a cache shared by the session's tests, never the user's."""
    monkeypatch.setenv("PARATRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True, scope="session")
def _ranks_forked_as_the_cli_forks_them():
    """Every run the tests start through the Python API forks its ranks from one fork server, as
    `paratrain train` and `scale` do (paratrain/forkserver.py), instead of spawning interpreters
    that import torch again: about 5 s less for each multi-rank run, a third of the suite. The
    spawn path keeps its own tests (test_fast_launch.py; --memory-limit always spawns)."""
    from paratrain import forkserver

    with forkserver.serving(True):
        yield


def start_ranks(fn, args: tuple, nprocs: int, join: bool = True):
    """torch.multiprocessing.start_processes(fn, args, nprocs) with the ranks forked from the suite's
    fork server (torch already imported) instead of spawned, each taking the environment the test has
    set since the server started before it calls `fn(rank, *args)`, as paratrain's forked ranks do."""
    import torch.multiprocessing as mp

    from paratrain import forkserver

    changes = forkserver.environ_changes()
    return mp.start_processes(
        _in_the_tests_environment, args=(fn, changes, args), nprocs=nprocs, join=join, start_method="forkserver"
    )


def _in_the_tests_environment(rank: int, fn, changes: dict[str, str | None], args: tuple) -> None:
    from paratrain import forkserver

    forkserver.apply_environ_changes(changes)
    fn(rank, *args)


def write_trial_script(tmp_path: Path, monkeypatch, text: str) -> Path:
    """A sweep trial script in tmp_path; each finished trial appends to $FINISHED_LOG."""
    path = tmp_path / "train.py"
    path.write_text(text)
    monkeypatch.setenv("FINISHED_LOG", str(tmp_path / "finished.log"))
    return path


def synthetic(tmp_path: Path, **overrides):
    """A small, quick training config on the synthetic dataset (1 thread per worker, CPU ranks even
    on a GPU host: the equivalence tests compare CPU arithmetic, where TF32 never applies)."""
    cfg = dict(
        workload="synthetic-cnn",
        device="cpu",
        synthetic_samples=512,
        epochs=2,
        batch_size=32,
        lr=0.01,
        threads_per_worker=1,
        quiet=True,
        run_dir=tmp_path / "run",
        log_every=4,
    )
    cfg.update(overrides)
    return cfg


def free_port() -> int:
    """A TCP port nothing listens on now, the kernel's pick."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_spawned(rank: int, out: Path, ports: Sequence[int], runs: dict[str, tuple[dict, dict]]) -> None:
    """On one of two ranks started with torch.multiprocessing: each named run of `runs` ({name:
    (config overrides, placement)}) in out/name, one after another, each on a port of its own (a
    port is not reused at once after a process group closes); rank 0 writes the configuration and
    the summary, as the launcher would. A run of `workers=1` is rank 0's alone: rank 1 waits for its
    summary before the next run of both (dialled earlier, the store's client backs off and the pair
    starts up to a second late)."""
    from paratrain.config import TrainConfig
    from paratrain.engine.loop import run_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), LOCAL_RANK=str(rank))
    alone = None  # the summary of rank 0's last run alone, for rank 1 to wait for
    for port, (name, (overrides, placement)) in zip(ports, runs.items()):
        run_dir = Path(out) / name
        workers = overrides.get("workers", 2)
        if rank >= workers:
            alone = run_dir / "summary.json"
            continue
        while alone is not None and not alone.exists():
            time.sleep(0.01)
        alone = None
        os.environ.update(WORLD_SIZE=str(workers), MASTER_PORT=str(port))
        cfg = TrainConfig.model_validate(synthetic(Path(out), run_dir=run_dir, **overrides)).model_dump(mode="json")
        summary = run_rank(cfg, placement, str(run_dir))
        if rank == 0:
            (run_dir / "config.json").write_text(json.dumps(cfg))
            (run_dir / "summary.json").write_text(json.dumps(summary))


BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def browser_page(page_path: Path) -> Iterator[Any]:
    """The page opened from disk in Debian's headless chromium (Playwright); on exit, asserts that
    every image rendered and that nothing was fetched from anywhere but the page itself."""
    import shutil

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if not chromium:
        pytest.skip("BROWSER TEST SKIPPED: Debian's chromium is not installed (make test installs it as root)")
    html_text = page_path.read_text()
    assert "http://" not in html_text and "https://" not in html_text, "the page must not fetch anything"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        page = browser.new_page()
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_path.as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate("[...document.images].map(i => [i.complete, i.naturalWidth])")
        assert images and all(done and width > 100 for done, width in images), images
        yield page
        page.screenshot(path=str(page_path.with_suffix(".png")), full_page=True)
        browser.close()
    assert all(url.startswith(("file:", "data:")) for url in requests), requests


# -- nothing left running (issue #25) ----------------------------------------------------------
# A process the suite started that outlives it (a rank, a sweep driver, slurmstepd and its job's
# srun, slurmctld/slurmd/munged, postgres) keeps cores busy and ports bound for whatever runs next,
# and once left a real-SLURM job running 10 minutes after pytest ended. At the end of the session
# the run fails if one survives: a descendant of this pytest process, or any process whose command
# line or environment names this session's temporary directory (daemons detach from pytest, but
# they are all given paths under it, and jobs inherit PARATRAIN_CACHE / SLURM_CONF pointing there).
# multiprocessing's own helpers (the forkserver paratrain's CLI starts in-process, the resource
# tracker) live as long as the interpreter by design and exit with it: they are not counted.
LEFTOVER_GRACE_S = 15
_INTERPRETER_HELPERS = ("multiprocessing.forkserver import main", "multiprocessing.resource_tracker import main")


def leftover_processes(basetemp: Path | None, descendants: bool = True) -> list[Any]:
    """Live processes naming `basetemp` (command line or environment), and with `descendants` this
    process's children too, less multiprocessing's helpers."""
    import re

    import psutil

    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    named = re.compile(re.escape(str(basetemp)) + r"(?![\w.-])") if basetemp else None
    found = {p.pid: p for p in me.children(recursive=True)} if descendants else {}
    if named is not None:
        for process in psutil.process_iter(["pid", "cmdline"]):
            if process.pid in mine or process.pid in found:
                continue
            try:
                text = " ".join(process.info["cmdline"] or [])
                if not named.search(text):
                    text = " ".join(process.environ().values())
            except (psutil.Error, OSError):
                continue
            if named.search(text):
                found[process.pid] = process
    alive = []
    for process in found.values():
        try:
            cmdline = " ".join(process.cmdline())
            if process.status() == psutil.STATUS_ZOMBIE or any(h in cmdline for h in _INTERPRETER_HELPERS):
                continue
            alive.append(process)
        except psutil.Error:
            continue
    return alive


def pytest_sessionfinish(session, exitstatus):
    import psutil

    factory = getattr(session.config, "_tmp_path_factory", None)
    try:
        basetemp = factory.getbasetemp() if factory is not None and factory._basetemp is not None else None
    except Exception:
        basetemp = None
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    alive = leftover_processes(basetemp)
    while alive and time.monotonic() < deadline:  # a process stopped at teardown may take a moment to exit
        time.sleep(0.5)
        alive = leftover_processes(basetemp)
    if not alive:
        return
    lines = []
    for process in alive:
        try:
            lines.append(f"  pid {process.pid}: {' '.join(process.cmdline())[:200]}")
        except psutil.Error:
            continue
    # Fail the run, and stop them so that they do not also spoil whatever runs next.
    for process in alive:
        try:
            for child in process.children(recursive=True):
                child.kill()
            process.kill()
        except psutil.Error:
            pass
    session.config.get_terminal_writer().line(
        f"\nLEFT RUNNING: {len(lines)} process(es) the suite started outlived it (killed now):\n" + "\n".join(lines),
        red=True,
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def probe(tmp_path):
    """The rank-side probe installed in this process, its hooks on torch (launch/probe/hooks.py), removed after."""
    import torch

    from paratrain.launch.probe import hooks
    from paratrain.launch.probe.clock import Probe

    installed = Probe(str(tmp_path / "rank0.jsonl"), 0)
    hooks.install(installed, torch)
    yield installed
    for undo in reversed(installed.restore):
        undo()


@pytest.fixture
def fake_world():
    """This process as one rank of a world of `size` on torch's fake backend (collectives do nothing)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def join(rank: int, size: int) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)

    yield join
    if dist.is_initialized():
        dist.destroy_process_group()


# The doctor's findings from a probed run, checked in every formula test that diagnoses one: a time finding names
# where its time goes, and accounts only for phases the probe measured, never for more than was measured there
# (the checks of doctor/checks.py a probed run still gets, read from the monitor, name no place).
MONITOR_CHECKS = {"contended", "rank0_alone", "first_epoch_overhead", "idle_devices"}


def _findings_account_for_measured_time(ev: Any, findings: Sequence[Any]) -> None:
    from statistics import mean

    from paratrain.launch.probe import PHASES

    if not ev.probe_ranks:
        return
    measured = {p: mean(r["phases_s"].get(p, 0.0) for r in ev.probe_ranks) for p in PHASES}
    measured["ddp_forward"] = mean(r.get("ddp_overhead_s", 0.0) for r in ev.probe_ranks)
    for f in findings:
        assert isinstance(f.explains, dict), (f.check, f.explains)
        for phase, seconds in f.explains.items():
            assert phase in measured, (f.check, phase)
            assert -1e-12 <= seconds <= measured[phase] + 1e-9, (f.check, phase, seconds, measured[phase])
        # the ledger's unexplained time names a place only where a trace was recorded
        if f.saving is not None and f.check not in MONITOR_CHECKS and not f.check.startswith("unexplained_"):
            assert isinstance(f.where, str) and f.where, (f.check, f.where)


@pytest.fixture(autouse=True)
def _doctor_invariants(request, monkeypatch):
    if not request.module.__name__.startswith("test_formulas_"):
        yield
        return
    import paratrain.doctor as doctor

    diagnose_run = doctor.diagnose_run

    def checked(ev):
        findings = diagnose_run(ev)
        _findings_account_for_measured_time(ev, findings)
        return findings

    monkeypatch.setattr(doctor, "diagnose_run", checked)
    yield
