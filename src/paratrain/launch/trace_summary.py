"""What the profiled steps' trace says (RUN_DIR/probe/trace-rank<R>.json.gz, launch/probe/window.py): where
each phase's time went, in operators, Python functions, modules and lines of the user's code.

The trace is torch.profiler's Chrome trace: on the rank's main thread, `python_function` events (every
Python call, with its parent), `cpu_op` events (aten operators, with their input types and shapes) and
`user_annotation` ranges, among them the probe's `paratrain:<phase>`; on gloo's threads, the collectives'
own work. Every event on the main thread has an exclusive time (its duration less its children's), and
every exclusive second is charged to:
    the phase       the innermost `paratrain:` range around it (none: `other`)
    what ran        an operator with its first input's dtype (`aten::mkldnn_convolution float`), a built-in
                    function (`<built-in function collect>`), a Python function's own bytecode
    where           the innermost frame of the user's own code above it (`train.py(41): <module>`)
    call            what that frame called (`json/__init__.py(231): dumps`, `<built-in function collect>`)
    module          the module it ran in (`nn.Module: Sequential_0/Conv2d_1`)
The probe's own hooks (slower in the profiled steps) are charged to themselves. Backward runs outside the
modules and the user's code; each of its nodes (`autograd::engine::evaluate_function: MmBackward0`) carries the
sequence number of the forward operator that recorded it, so its time is charged to that operator's module and
line: backward's tables say whose backward it is.
Two patterns are kept apart, for the doctor to name: softmax over square score matrices (attention computed
unfused, the scores materialised), and the calls of parametrizations (torch.nn.utils.parametrize), which run
at every access of the tensor they compute.
HolisticTraceAnalysis reads the same traces, but for GPU kernels (idle time, kernel breakdown, overlap of
communication with computation): on a CPU trace its analyses have nothing to read, and it needs pandas.
This reads what a CPU rank's trace holds, in the standard library only. Figures are per profiled step.
"""

from __future__ import annotations

import bisect
import gzip
import importlib.util
import itertools
import json
import re
import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

PREFIX = "paratrain:"
TABLES = ("what", "where", "call", "module")
PROBE_CODE = "paratrain/launch/probe/"  # the probe's own Python, as the trace names it
PROBE_LABEL = "(the probe's own hooks)"
TOP = 6  # entries kept per table
BACKWARD_NODE = "autograd::engine::evaluate_function: "
SOFTMAX = ("aten::_softmax", "aten::_softmax_backward_data", "aten::_safe_softmax")
FUSED_ATTENTION = "aten::scaled_dot_product_attention"  # its math fallback runs a softmax of its own
MIN_SCORES = 128  # a softmax's last two dims, equal and at least this: attention scores (sequence x sequence)
PARAMETRIZATION = "ParametrizationList"
PRODUCTS = ("aten::bmm", "aten::baddbmm", "aten::mm", "aten::matmul")  # the scores' products: a fused kernel's too
MIN_SHARE = 0.01  # entries below this share of their phase are left out
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4}
LIBRARY_ROOTS = ("torch", "paratrain", "functorch", "triton")
# torch.distributed's own collective functions and their logging wrapper: what a library calls, never the library
C10D_ENTRY = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py")


@lru_cache(maxsize=4096)
def is_library(name: str) -> bool:
    """A Python function of a library (torch, an installed package, the standard library), not the user's
    code: the trace names files relative to their sys.path entry, so the first part is a top-level module."""
    if name.startswith("<") or name.startswith("nn.Module:"):
        return True
    first = name.split("(", 1)[0].split("/", 1)[0].removesuffix(".py")
    if first in LIBRARY_ROOTS or first in sys.stdlib_module_names:
        return True
    try:
        spec = importlib.util.find_spec(first)
    except (ImportError, ValueError):
        return False
    origin = (spec and spec.origin) or ""
    return "site-packages" in origin or "dist-packages" in origin or origin in ("built-in", "frozen")


def _dtype(event: dict[str, Any]) -> str | None:
    for kind in event.get("args", {}).get("Input type", []):
        if kind in DTYPE_BYTES and kind not in ("long int", "int"):
            return kind
    return None


ADDRESS = re.compile(r" of (?:pybind11_builtins\.\S+|\S+) object at 0x[0-9a-f]+| at 0x[0-9a-f]+")


def _what(event: dict[str, Any]) -> str:
    if event.get("cat") == "cpu_op":
        dtype = _dtype(event)
        return f"{event['name']} {dtype}" if dtype else event["name"]
    return ADDRESS.sub("", event["name"])


def _bytes(event: dict[str, Any]) -> int:
    """Bytes of a collective's tensors, from its input dims and types."""
    args = event.get("args", {})
    total = 0
    for dims, kind in zip(args.get("Input Dims", []), args.get("Input type", [])):
        tensors = dims if dims and isinstance(dims[0], list) else [dims]
        size = DTYPE_BYTES.get(kind, 4) if kind != "TensorList" else 4
        for shape in tensors:
            if shape:
                n = 1
                for d in shape:
                    n *= d
                total += n * size
    return total


def read_trace(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def summarise_trace(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per profiled step: each phase's seconds, and the tables of what ran and where (see the module's doc).
    None when the trace holds no probe phases (a script that never stepped inside the window)."""
    timed = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    main = _main_thread(timed)
    if main is None:
        return None
    mine = sorted((e for e in timed if e.get("tid") == main), key=lambda e: (e["ts"], -e["dur"]))
    steps = sum(1 for e in mine if e["name"] == PREFIX + "optimizer")
    if not steps:
        return None
    # The probe's phase ranges open in one hook and close in another, so they do not nest with the Python
    # calls: they are laid out on their own, as a timeline of the innermost phase at each instant.
    account = Account(PhaseTimeline([e for e in mine if e["name"].startswith(PREFIX)]))
    calls = [e for e in mine if not e["name"].startswith(PREFIX)]
    for event, children, ancestors in nested(calls):
        account.close(event, children, ancestors)
    return {
        "steps": steps,
        "phases": account.phases(steps),
        "dtypes_s": _dtype_seconds(calls, steps),
        "collectives": [
            {"name": name, "phase": phase, "issuer": issuer, "via": via, "calls": n / steps, "bytes": size / steps}
            for (name, phase, issuer, via), (n, size) in sorted(account.collectives.items(), key=lambda kv: -kv[1][0])
        ][:TOP],
        "link": _link(timed, main),
        "scores": account.scores_summary(steps),
        "parametrizations": account.parametrizations_summary(steps),
    }


def nested(calls: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], list[tuple[float, float]], list[Any]]]:
    """Each call once it has ended, with its children's spans and its open ancestors (outermost first). The
    calls come sorted by start, longest first; one that outlasts its parent by a rounding is clipped to it."""
    stack: list[tuple[dict[str, Any], list[tuple[float, float]]]] = []  # open calls and their children's spans
    for event in calls:
        while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= event["ts"] + 1e-3:
            done, children = stack.pop()
            yield done, children, [s[0] for s in stack]
        if stack:
            parent_end = stack[-1][0]["ts"] + stack[-1][0]["dur"]
            if event["ts"] + event["dur"] > parent_end:
                event = {**event, "dur": parent_end - event["ts"]}
            stack[-1][1].append((event["ts"], event["ts"] + event["dur"]))
        stack.append((event, []))
    while stack:
        done, children = stack.pop()
        yield done, children, [s[0] for s in stack]


class Account:
    """Each call's exclusive time, split by the phase timeline and charged to the tables; the collectives."""

    def __init__(self, timeline: PhaseTimeline):
        self.timeline = timeline
        self.tables: dict[str, dict[str, dict[str, float]]] = {}
        self.collectives: dict[tuple[str, str, str, str | None], list[float]] = {}
        self.outside = 0.0  # seconds before the first phase range or after the last: `other` too
        # a forward operator's sequence number: its frames, then (once asked for) its module and line
        self.creators: dict[int, Any] = {}
        # by the scores' sequence length: softmax over them outside SDPA, every other operator on them, their products
        self.scores: dict[int, dict[str, Any]] = {}
        self.parametrized: dict[str, int] = {}  # a parametrization's module path: its calls
        self.parametrization_s = 0.0  # in them, and in their backward

    def close(self, event: dict[str, Any], children: list[tuple[float, float]], ancestors: list[Any]) -> None:
        begin, end, timeline = event["ts"], event["ts"] + event["dur"], self.timeline
        frames = [*ancestors, event]
        self._remember_creator(event, frames)
        own = sum(b - a for a, b in _gaps(begin, end, children)) / 1e6
        if event["name"].startswith("nn.Module: ") and PARAMETRIZATION in event["name"]:
            path = _modules(frames)
            self.parametrized[path] = self.parametrized.get(path, 0) + 1
        origin = self._origin(frames)
        if PARAMETRIZATION in origin[0]:
            self.parametrization_s += own
        if (
            event.get("cat") == "cpu_op"
            and not event["name"].startswith("autograd::")
            and not any(a["name"] == FUSED_ATTENTION for a in ancestors)
        ):
            self._score_op(event, own, origin[0])
        for a, b in _gaps(begin, end, children):
            for phase, seconds in timeline.split(a, b):
                self.charge(phase, seconds, event, ancestors, origin)
            self.outside += (max(0.0, min(b, timeline.begin) - a) + max(0.0, b - max(a, timeline.end))) / 1e6
        if event.get("cat") == "cpu_op" and event["name"].startswith("c10d::"):
            users = [a["name"] for a in frames if a.get("cat") == "python_function" and not is_library(a["name"])]
            issuer = _modules(frames).rsplit("/", 1)[-1] or (users[-1] if users else "")
            key = (event["name"].removeprefix("c10d::").rstrip("_"), timeline.at(begin), issuer, _via(frames))
            entry = self.collectives.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += _bytes(event)

    def _score_op(self, event: dict[str, Any], own: float, module: str) -> None:
        """An operator on attention scores (an input whose last two dims are equal, MIN_SCORES or more): a
        softmax names them; every operator but the two products is what a fused kernel does not materialise."""
        shapes = [d for d in event.get("args", {}).get("Input Dims") or [] if _square(d)]
        if not shapes:
            return
        # kept per length: an image as wide as it is high (a 224 x 224 input) is no score matrix unless a softmax
        # runs over that length
        scores = self.scores.setdefault(
            shapes[0][-1], {"s": 0.0, "ops_s": 0.0, "products_s": 0.0, "shape": None, "module": ""}
        )
        if event["name"] in SOFTMAX:
            scores["s"] += own
            scores["shape"] = shapes[0]
            scores["module"] = scores["module"] or module
        scores["products_s" if event["name"] in PRODUCTS else "ops_s"] += own

    def _remember_creator(self, event: dict[str, Any], frames: list[dict[str, Any]]) -> None:
        """A forward operator's module and user line, under its sequence number (the first operator with a number
        is the one that recorded the node; later ones without a node of their own reuse it)."""
        number = event.get("args", {}).get("Sequence number")
        if event.get("cat") != "cpu_op" or number is None or number in self.creators:
            return
        if any(a["name"].startswith(BACKWARD_NODE) for a in frames):
            return  # an operator of backward itself (a double backward's node is rare enough to leave out)
        self.creators[number] = frames  # read when a backward node asks (most numbers are never asked for)

    def _origin(self, frames: list[dict[str, Any]]) -> tuple[str, str | None]:
        """The module path and user line a call is charged to: its own, or in backward those of the forward
        operator whose node it runs under, unless it runs in modules and code of its own below that node (a
        checkpoint's recompute)."""
        at = next((i for i in range(len(frames) - 1, -1, -1) if frames[i]["name"].startswith(BACKWARD_NODE)), None)
        if at is not None:
            below = frames[at + 1 :]
            created = self.creators.get(frames[at].get("args", {}).get("Sequence number"))
            own_code = any(a.get("cat") == "python_function" and not is_library(a["name"]) for a in below)
            if created is not None and not _modules(below) and not own_code:
                if isinstance(created, list):
                    python = [
                        a["name"] for a in created if a.get("cat") == "python_function" and not is_library(a["name"])
                    ]
                    created = (_modules(created), python[-1] if python else None)
                    self.creators[frames[at]["args"]["Sequence number"]] = created
                return created
        return _modules(frames), None

    def charge(
        self,
        phase: str,
        seconds: float,
        event: dict[str, Any],
        ancestors: list[dict[str, Any]],
        origin: tuple[str, str | None],
    ) -> None:
        table = self.tables.setdefault(phase, {key: {} for key in TABLES})
        frames = [*ancestors, event]
        python = [a for a in frames if a.get("cat") == "python_function"]
        mine = [i for i, a in enumerate(python) if not is_library(a["name"])]
        # The probe's own time: what runs below its innermost frame, unless that frame is a wrapper the user's
        # call passes through (`through_*`: backward, a collective, a batch's loading run below those).
        # (The probe's runner, above the script's own frames, is no hook.)
        under = python[mine[-1] + 1 :] if mine else python
        probe = [a for a in under if a["name"].startswith(PROBE_CODE)]
        if event["name"].startswith(PROBE_CODE) or (
            probe and not probe[-1]["name"].split(": ", 1)[-1].startswith("through_")
        ):
            what = where = call = PROBE_LABEL
            module = _modules(frames)
        else:
            below = [a for a in under if not a["name"].startswith(PROBE_CODE)]
            module, line = origin
            where = line or (python[mine[-1]]["name"] if mine else None)
            # what the user's code called: the first frame below its innermost one (json.dumps, gc.collect)
            call = ADDRESS.sub("", below[0]["name"]) if mine and below else None
            what = _what(event)
        for key, name in (("what", what), ("where", where), ("call", call), ("module", module)):
            if name:
                table[key][name] = table[key].get(name, 0.0) + seconds

    def scores_summary(self, steps: int) -> dict[str, Any] | None:
        """Softmax over square score matrices (and its backward), every other operator on them, and their
        products, seconds per step, with a shape and module: of the sequence length the softmax spent most on."""
        softmaxed = [scores for scores in self.scores.values() if scores["s"]]
        if not softmaxed:
            return None
        scores = max(softmaxed, key=lambda entry: entry["s"])
        return {**scores, **{key: round(scores[key] / steps, 6) for key in ("s", "ops_s", "products_s")}}

    def parametrizations_summary(self, steps: int) -> dict[str, Any] | None:
        """Parametrizations: how many, their calls per step and their seconds per step, forward and backward."""
        if not self.parametrized:
            return None
        return {
            "tensors": len(self.parametrized),
            "calls": sum(self.parametrized.values()) / steps,
            "s": round(self.parametrization_s / steps, 6),
            "module": max(self.parametrized, key=self.parametrized.get),
        }

    def phases(self, steps: int) -> dict[str, dict[str, Any]]:
        """Per phase, seconds per step and its tables' largest entries; time in a phase that no event covers
        is C++ outside any operator, or waiting."""
        totals = self.timeline.totals()
        totals["other"] = totals.get("other", 0.0) + self.outside
        out = {}
        for phase, total in totals.items():
            table = self.tables.get(phase, {key: {} for key in TABLES})
            untraced = total - sum(table["what"].values())
            if untraced > 0:
                table["what"]["(no Python call or operator: C++ work, or waiting)"] = untraced
            out[phase] = {"s": total / steps, **{key: _top(table[key], total, steps) for key in TABLES}}
        return out


class PhaseTimeline:
    """The probe's nested phase ranges flattened into consecutive spans, each labelled with its innermost
    phase; outside every range (between steps' phases) the phase is `other`. Times in the trace's µs."""

    def __init__(self, ranges: list[dict[str, Any]]):
        points = sorted({r["ts"] for r in ranges} | {r["ts"] + r["dur"] for r in ranges})
        self.starts: list[float] = []
        self.labels: list[str] = []
        for a, b in itertools.pairwise(points):
            middle = (a + b) / 2
            inner = [r for r in ranges if r["ts"] <= middle < r["ts"] + r["dur"]]
            label = max(inner, key=lambda r: r["ts"])["name"][len(PREFIX) :] if inner else "other"
            self.starts.append(a)
            self.labels.append(label)
        self.end = points[-1] if points else 0.0
        self.begin = points[0] if points else 0.0

    def at(self, t: float) -> str:
        i = bisect.bisect_right(self.starts, t) - 1
        return self.labels[i] if 0 <= i and t < self.end else "other"

    def split(self, a: float, b: float) -> list[tuple[str, float]]:
        """Seconds of [a, b) in each phase."""
        out: list[tuple[str, float]] = []
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        t = a
        while t < b:
            if t < self.begin or t >= self.end or i >= len(self.starts):
                nxt = self.begin if t < self.begin else b
                label = "other"
            else:
                nxt = self.starts[i + 1] if i + 1 < len(self.starts) else self.end
                label = self.labels[i]
                i += 1
            nxt = min(max(nxt, t), b)
            if nxt == t:
                nxt = b
            out.append((label, (nxt - t) / 1e6))
            t = nxt
        return out

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        bounds = [*self.starts, self.end]
        for i, label in enumerate(self.labels):
            out[label] = out.get(label, 0.0) + (bounds[i + 1] - bounds[i]) / 1e6
        return out


def _square(dims: Any) -> bool:
    return (
        isinstance(dims, list)
        and len(dims) >= 3
        and all(isinstance(d, int) for d in dims)
        and dims[-1] == dims[-2] >= MIN_SCORES
    )


def _gaps(begin: float, end: float, children: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [begin, end) that no child covers: the event's own time."""
    out, t = [], begin
    for a, b in sorted(children):
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if end > t:
        out.append((t, end))
    return out


def _via(frames: list[dict[str, Any]]) -> str | None:
    """The library function that issued a collective: its innermost named Python frame outside torch.distributed's
    own entry points and the probe (ZeroRedundancyOptimizer's _broadcast_params_from_rank, FSDP2's collectives),
    None when that frame is the user's own code (a `dist.all_reduce` in the script)."""
    for frame in reversed(frames):
        name = frame["name"]
        if frame.get("cat") != "python_function" or name.startswith(("<", "nn.Module:")) or "<genexpr>" in name:
            continue
        if name.startswith(PROBE_CODE) or name.split("(", 1)[0] in C10D_ENTRY:
            continue
        return name if is_library(name) else None
    return None


def _modules(frames: list[dict[str, Any]]) -> str:
    return "/".join(a["name"].removeprefix("nn.Module: ") for a in frames if a["name"].startswith("nn.Module:"))


def _main_thread(timed: list[dict[str, Any]]) -> Any:
    """The thread that ran the probe's phases."""
    counts: dict[Any, int] = {}
    for e in timed:
        if e["name"].startswith(PREFIX):
            counts[e.get("tid")] = counts.get(e.get("tid"), 0) + 1
    return max(counts, key=counts.get) if counts else None


def _top(table: dict[str, float], total: float, steps: int) -> list[list[Any]]:
    ranked = sorted(table.items(), key=lambda kv: -kv[1])
    return [[name, round(s / steps, 6)] for name, s in ranked[:TOP] if total > 0 and s >= MIN_SHARE * total]


def _dtype_seconds(mine: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """Seconds per step of the outermost operators, by their first floating input's dtype."""
    out: dict[str, float] = {}
    end = -1.0
    for e in mine:
        if e.get("cat") != "cpu_op" or e["ts"] < end:
            continue  # nested inside the operator before it
        end = e["ts"] + e["dur"]
        dtype = _dtype(e)
        if dtype:
            out[dtype] = out.get(dtype, 0.0) + e["dur"] / 1e6 / steps
    return {k: round(v, 6) for k, v in out.items()}


def _link(timed: list[dict[str, Any]], main: Any) -> list[list[float]]:
    """The collectives' own work on the backend's threads (gloo runs them there): [bytes, seconds] each, the
    link's latency and bandwidth as this run met them."""
    return [
        [float(_bytes(e)), round(e["dur"] / 1e6, 6)]
        for e in timed
        if e.get("tid") != main and e["name"].startswith(("gloo:", "nccl:"))
    ][:200]


def summarise_file(path: Path) -> dict[str, Any] | None:
    """The trace's summary, or None when the file is missing or unreadable (a rank killed mid-write)."""
    try:
        return summarise_trace(read_trace(path))
    except (OSError, ValueError, EOFError, KeyError, TypeError):
        return None
