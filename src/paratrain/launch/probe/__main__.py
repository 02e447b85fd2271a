"""`python -m paratrain.launch.probe SCRIPT ARGS...`: run SCRIPT as `python SCRIPT ARGS...` would, probed."""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from typing import Any

from paratrain.launch.probe import RUN_DIR_ENV
from paratrain.launch.probe.clock import Probe
from paratrain.launch.probe.hooks import AfterTorchImport, install


def run(argv: list[str]) -> None:
    """Run the script `argv[0]` with arguments `argv[1:]` as `python script.py ...` would, probed."""
    rank = int(os.environ.get("RANK", "0"))
    folder = os.path.join(os.environ[RUN_DIR_ENV], "probe")
    os.makedirs(folder, exist_ok=True)
    probe = Probe(os.path.join(folder, f"rank{rank}.jsonl"), rank)

    def installed(torch: Any) -> None:
        try:
            install(probe, torch)
        except Exception as exc:
            probe.fail("install", exc)

    def last_flush() -> None:
        probe.workers.resume()
        probe.window.abandon()
        try:
            probe.flush()
        except OSError:
            pass

    if "torch" in sys.modules:
        installed(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, AfterTorchImport(installed))
    atexit.register(last_flush)
    script = os.path.abspath(argv[0])
    sys.argv = [argv[0], *argv[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run(sys.argv[1:])
