"""Property-based tests (#25) for what users feed paratrain: sizes, worker lists, Comet-style sweep
configs and run directories with keys added or left out by other versions."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paratrain.config import ScaleConfig, parse_size, validate
from paratrain.doctor.evidence import read_run
from paratrain.errors import UsageError
from paratrain.runs import RunDir, steady_epoch_time
from paratrain.sweep.space import parse_space

FEW = settings(max_examples=60, deadline=None)
UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}  # binary units, by hand


# -- sizes ---------------------------------------------------------------------------------------
@FEW
@given(
    n=st.integers(1, 10**6),
    unit=st.sampled_from(list(UNIT)),
    suffix=st.sampled_from(["", "B", "iB"]),
    lower=st.booleans(),
)
def test_size_integer_forms_round_trip(n, unit, suffix, lower):
    text = f"{n}{unit}{suffix if unit else ''}"
    assert parse_size(text.lower() if lower else text) == n * UNIT[unit]  # e.g. 1150M -> 1150 * 2**20


@FEW
@given(a=st.integers(1, 10**5), b=st.integers(1, 10**5), unit=st.sampled_from(list(UNIT)))
def test_size_is_monotone(a, b, unit):
    lo, hi = sorted((a, b))
    assert parse_size(f"{lo}{unit}") <= parse_size(f"{hi}{unit}")
    # one step up the units is 1024 times as many bytes: 1G == 1024M
    assert parse_size(f"{lo}G") == parse_size(f"{lo * 1024}M")


@FEW
@given(text=st.text(max_size=12))
def test_size_rejects_or_parses_but_never_crashes_otherwise(text):
    try:
        assert parse_size(text) >= 0
    except ValueError:
        pass


@pytest.mark.parametrize("text", ["0", "0M", "-1G", "1X", "G", "1.5.5M", ""])
def test_size_rejects_non_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


# -- worker lists ----------------------------------------------------------------------------------
@FEW
@given(counts=st.lists(st.integers(1, 512), min_size=1, max_size=8, unique=True), spaces=st.booleans())
def test_worker_list_parses_to_sorted_counts(counts, spaces):
    text = (", " if spaces else ",").join(map(str, counts))
    cfg = validate(ScaleConfig, {"workers": text, "out": "/tmp/x"})
    assert cfg.workers == sorted(counts)


@FEW
@given(counts=st.lists(st.integers(-5, 8), min_size=1, max_size=6))
def test_worker_list_bad_counts_are_usage_errors(counts):
    text = ",".join(map(str, counts))
    if min(counts) <= 0 or len(set(counts)) != len(counts):
        with pytest.raises(UsageError):
            validate(ScaleConfig, {"workers": text, "out": "/tmp/x"})
    else:
        assert validate(ScaleConfig, {"workers": text, "out": "/tmp/x"}).workers == sorted(counts)


# -- Comet-style sweep configs -----------------------------------------------------------------------
_numbers = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def parameter(draw):
    kind = draw(st.sampled_from(["integer", "float", "double", "discrete", "categorical"]))
    if kind == "categorical":
        return {
            "type": kind,
            "values": draw(st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=4, unique=True)),
        }
    if kind == "discrete":
        return {"type": kind, "values": draw(st.lists(st.integers(-50, 50), min_size=1, max_size=5, unique=True))}
    if kind == "integer":
        lo, hi = sorted(draw(st.lists(st.integers(-100, 100), min_size=2, max_size=2)))
    else:
        lo, hi = sorted(draw(st.lists(_numbers, min_size=2, max_size=2)))
    return {"type": kind, "min": lo, "max": hi}


@st.composite
def config(draw):
    names = draw(st.lists(st.text("abcdefgh_", min_size=1, max_size=6), min_size=1, max_size=4, unique=True))
    return {
        "algorithm": draw(st.sampled_from(["grid", "random", "bayes"])),
        "parameters": {n: draw(parameter()) for n in names},
        "spec": {"metric": "loss", "objective": draw(st.sampled_from(["minimize", "maximize"]))},
    }


@FEW
@given(cfg=config())
def test_valid_sweep_configs_parse(cfg):
    space = parse_space(cfg)
    assert len(space.parameters) == len(cfg["parameters"])


_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.parametrize("path", ["algorithm", "parameters", "spec", "param", "extra"])
@settings(max_examples=40, deadline=None)
@given(cfg=config(), junk=_junk)
def test_broken_sweep_configs_are_usage_errors_not_tracebacks(cfg, path, junk):
    if path == "param":
        name = next(iter(cfg["parameters"]))
        cfg["parameters"][name] = junk if not isinstance(junk, dict) else {**cfg["parameters"][name], **junk}
    elif path == "extra":
        cfg["not_a_key"] = junk
    else:
        cfg[path] = junk
    try:
        parse_space(cfg)
    except UsageError:
        pass


# -- run directories -------------------------------------------------------------------------------
_extra = st.dictionaries(st.text("qwxz_", min_size=1, max_size=8).map(lambda k: "zz_" + k), _junk, max_size=4)


@FEW
@given(
    extra=_extra,
    times=st.lists(st.floats(0.1, 100), min_size=0, max_size=5),
    drop=st.sampled_from([None, "epoch_times_s", "status", "samples_per_s"]),
)
def test_run_dirs_from_other_versions_read(extra, times, drop):
    """Any release's summary (every one wrote `status`; other keys come and go) reads; a file without
    `status` is no paratrain summary: one line naming it, not a traceback."""
    summary = {"status": "completed", "samples_per_s": 10.0, "epoch_times_s": times, **extra}
    if drop:
        summary.pop(drop)
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir(Path(tmp))
        run.config.write_text(json.dumps({"workers": 1, **extra}))
        run.summary.write_text(json.dumps(summary))
        if drop == "status":
            with pytest.raises(UsageError, match=rf"^{run.summary} is not a paratrain summary: status: Field required"):
                read_run(Path(tmp))
            return
        ev = read_run(Path(tmp))
        steady = steady_epoch_time(ev.epoch_times) if ev.epoch_times else None
        if drop == "epoch_times_s" or not times:
            assert steady is None
        else:
            # the median of the epochs after the first (all of them with one epoch)
            rest = sorted(times[1:] or times)
            mid = len(rest) // 2
            expected = rest[mid] if len(rest) % 2 else (rest[mid - 1] + rest[mid]) / 2
            assert steady == pytest.approx(expected)
