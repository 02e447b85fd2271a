"""The trial side of the script protocol: `paratrain.report(val_loss=0.4, step=3)`.

Only the standard library: a trial script pays nothing for importing it. Each call appends one
JSON line to the file the sweep named in PARATRAIN_REPORT_FILE; the sweep reads it while the
trial runs (intermediate values, for pruning) and after it ends (the final value: the last one).
Outside a sweep the call prints `name=value` lines, which a sweep would also understand.
`paratrain launch` names the file the same way (launch/script.py), so this module sits below both
the launcher and the sweep in the layers (pyproject.toml's import-linter contract).
"""

from __future__ import annotations

import json
import math
import os
import time

REPORT_FILE_ENV = "PARATRAIN_REPORT_FILE"
PARAMS_ENV = "PARATRAIN_PARAMS"
# `paratrain launch --batch-schedule`'s choices, as JSON, for the script's paratrain.batch_schedule(...).
BATCH_SCHEDULE_ENV = "PARATRAIN_BATCH_SCHEDULE"


def report(step: int | None = None, **metrics: float) -> None:
    """Report metric values of this trial, optionally at a step (epoch) for pruning."""
    if not metrics:
        raise TypeError("report() needs at least one metric, e.g. paratrain.report(val_loss=0.42, step=3)")
    values = {name: float(value) for name, value in metrics.items()}
    path = os.environ.get(REPORT_FILE_ENV)
    if path is None:
        print(" ".join(f"{name}={value}" for name, value in values.items()), flush=True)
        return
    line = json.dumps(
        {
            "step": step,
            "time": time.time(),
            "metrics": {k: (v if math.isfinite(v) else str(v)) for k, v in values.items()},
        }
    )
    with open(path, "a") as f:  # one write of one line: appends from one process never interleave
        f.write(line + "\n")


def params() -> dict:
    """This trial's hyperparameters (also passed as command-line arguments)."""
    return json.loads(os.environ.get(PARAMS_ENV, "{}"))
