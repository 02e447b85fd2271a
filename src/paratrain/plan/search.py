"""`paratrain plan --search`: the fastest predicted layout that fits N devices, the runner-up, and why.

The space, for the largest device count planned: every strategy of `--strategy` (ddp, zero1, fsdp,
pipeline, hybrid), tensor parallelism of each degree 2, 4, 8, ... that divides the count and stays
within a node (`tp` alone on a node, `fsdp+tp` over several groups, and the pipelines of
`--strategy` with their stages split: `pp+tp`, `pp+fsdp+tp`; degrees the model's plan refuses are
skipped, with the reason), and activation checkpointing none, every second block, every
block by operator (what torchtitan's selective op checkpointing keeps) and every block. Each
checkpointing choice and each degree is measured as `plan` measures one (the model built on the meta
device, wrapped and split as `train` would), so the search costs one profile per choice and per
degree; every layout is then priced by the same memory and step-time model as the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from paratrain.errors import UsageError
from paratrain.formatting import rate, size
from paratrain.plan.profile import ModelProfile


class Checkpointing(NamedTuple):
    """One activation-checkpointing choice: its name and the train flags that make it."""

    label: str
    activation_checkpointing: str
    checkpoint_activations: bool
    checkpoint_activations_every: int = 1
    checkpoint_activations_ops: bool = False


CHECKPOINTING = (
    Checkpointing("none", "none", False),
    Checkpointing("every 2nd block", "selective", True, 2),
    Checkpointing("every block, by operator", "selective", True, 1, True),
    Checkpointing("every block", "full", True),
)


# Two layouts planned closer than this are a close call, which the plan does not rank reliably: of the three pairs of
# published layouts it put within 5 % of each other (docs/planner.md, "Against published LLM training runs"), two
# ran in the other order (planned 2.4 % and 0.1 % apart) and one as planned (3.7 %).
CLOSE_CALL = 0.05


def close_call(faster: dict[str, Any], slower: dict[str, Any]) -> bool:
    """Whether two planned rows are too near for the plan to say which runs faster."""
    return faster["samples_per_s"] / slower["samples_per_s"] - 1 < CLOSE_CALL


def tensor_parallel_degrees(devices: int, per_node: int) -> list[int]:
    """Degrees 2, 4, 8, ...: dividing the devices, at most a node's (a split layer waits on every all-reduce,
    which the network between nodes would make the step's longest wait)."""
    return [t for t in (2**i for i in range(1, per_node.bit_length())) if t <= per_node and devices % t == 0]


def search(
    devices: int,
    per_node: int,
    profiles: Callable[[Checkpointing], ModelProfile],
    split: Callable[[Checkpointing, int], Any],
    rows: Callable[[ModelProfile, int, int], list[dict[str, Any]]],
    usable_bytes: float,
) -> dict[str, Any]:
    """The candidates at `devices`, fastest first, and the pick. `profiles(choice)` measures the model under a
    checkpointing choice; `split(choice, degree)` its tensor-parallel share (UsageError when the plan refuses
    the degree); `rows(profile, degree, devices)` the table's rows of that profile (tp rows for `degree` > 1)."""
    candidates: list[dict[str, Any]] = []
    skipped: dict[int, str] = {}
    for choice in CHECKPOINTING:
        profile = profiles(choice)
        chosen = {"checkpointing": choice.label, "activation_checkpointing": choice.activation_checkpointing}
        candidates += [{**row, **chosen} for row in rows(profile, 1, devices)]
        for degree in tensor_parallel_degrees(devices, per_node):
            if degree in skipped:
                continue
            try:
                measured = split(choice, degree)
            except UsageError as exc:
                skipped[degree] = str(exc)
                continue
            tp_rows = rows(replace(profile, tensor_parallel=measured), degree, devices)
            candidates += [{**row, **chosen} for row in tp_rows if row["tp"] > 1]
    candidates.sort(key=lambda r: -r["samples_per_s"])
    fitting = [r for r in candidates if r["fits"]]
    result: dict[str, Any] = {
        "devices": devices,
        "candidates": [_brief(r) for r in candidates],
        "skipped_tp": skipped,
        "best": None,
        "runner_up": None,
        "close_call": False,
    }
    if not fitting:
        least = min(candidates, key=lambda r: r["memory_per_device_bytes"])
        result["why"] = (
            f"nothing fits {devices} devices: the least memory, {describe(least)}, needs "
            f"{size(least['memory_per_device_bytes'])} ({size(usable_bytes)} usable)"
        )
        return result
    best = fitting[0]
    runner_up = next((r for r in fitting if _layout(r) != _layout(best)), None)
    result["best"], result["runner_up"] = _brief(best), _brief(runner_up) if runner_up else None
    result["close_call"] = runner_up is not None and close_call(best, runner_up)
    result["why"] = _why(best, runner_up, candidates, usable_bytes)
    return result


def describe(row: dict[str, Any]) -> str:
    """A layout as a person names it: 'fsdp+tp (8 x tp 8), checkpointing every block'."""
    if row["stages"] > 1:
        split = f" x tp {row['tp']}" if row["tp"] > 1 else ""
        shape = f"{row['data_parallel']} x {row['stages']} stages{split}, M = {row['microbatches']}"
    elif row["tp"] > 1:
        shape = f"{row['data_parallel']} x tp {row['tp']}"
    elif row["strategy"] == "hsdp":
        shape = f"{row['layout']['dp_replicate']} replicas x {row['layout']['dp_shard']} shards"
    elif row["layout"]["dp_shard"] > 1:  # fsdp: shards of one model, not replicas
        shape = f"{row['data_parallel']} shards"
    else:
        shape = f"{row['data_parallel']} replicas"
    checkpointing = row["checkpointing"]
    return f"{row['strategy']} ({shape}), checkpointing {checkpointing if checkpointing != 'none' else 'nothing'}"


def _layout(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["strategy"], row["data_parallel"], row["stages"], row["tp"]


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "strategy",
        "layout",
        "data_parallel",
        "stages",
        "microbatches",
        "tp",
        "checkpointing",
        "activation_checkpointing",
        "samples_per_s",
    )
    return {
        **{k: row[k] for k in keep},
        "step_time_s": row["step_time_s"],
        "memory_per_device_bytes": row["memory_per_device_bytes"],
        "fits": row["fits"],
        "description": describe(row),
    }


def _why(
    best: dict[str, Any], runner_up: dict[str, Any] | None, candidates: list[dict[str, Any]], usable: float
) -> str:
    parts = [
        f"{describe(best)}: {rate(best['samples_per_s'])} samples/s in {size(best['memory_per_device_bytes'])} "
        f"of {size(usable)} usable"
    ]
    if runner_up is not None:
        ahead = best["samples_per_s"] / runner_up["samples_per_s"] - 1
        parts.append(
            f"{ahead:.0%} faster than the runner-up, {describe(runner_up)} "
            f"({rate(runner_up['samples_per_s'])} samples/s, {size(runner_up['memory_per_device_bytes'])})"
            + (
                f": a close call (within {CLOSE_CALL:.0%}, nearer than the plan ranks reliably): "
                "run a few steps of each"
                if close_call(best, runner_up)
                else ""
            )
        )
    faster = [r for r in candidates if r["samples_per_s"] > best["samples_per_s"] and not r["fits"]]
    if faster:
        top = faster[0]
        parts.append(f"the fastest of all, {describe(top)}, would need {size(top['memory_per_device_bytes'])} a device")
    return "; ".join(parts)
