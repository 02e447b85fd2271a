"""Where more devices stop paying at a fixed global batch, and why (issue #59).

At a fixed global batch each doubling of the devices halves every device's share of the compute, while a
step's collectives stay (FSDP gathers every parameter whatever the batch; DDP all-reduces every gradient)
and its fixed work stays too. The plan walks the fastest layout that fits at each doubling and names the
first count beyond which a doubling gains less than `FLAT`, with what the step at the doubled count is made
of: the communication its compute does not hide (step_time.py, overlap.py), a pipeline's bubble, or the
per-step work a small per-device batch cannot share out; then what would help, for that layout.
"""

from __future__ import annotations

from typing import Any

FLAT = 1.10  # a doubling of the devices that gains less than 10 % of the speed does not pay
# the layouts whose collectives are FSDP's gathers and reduce-scatters
SHARDED = ("fsdp", "hsdp", "fsdp+tp", "pp+fsdp", "pp+fsdp+tp")


def stops_paying(best: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first count of `best` (the fastest row that fits at each count, ascending) whose doubling (when `best`
    holds it) gains less than FLAT, with the step's make-up at the doubled count and what would help; None while
    every doubling pays."""
    by_count = {row["devices"]: row for row in best}
    for row in best:
        doubled = by_count.get(2 * row["devices"])
        if doubled is None or row["devices"] < 2:
            continue
        gain = doubled["samples_per_s"] / row["samples_per_s"]
        if gain < FLAT:
            return _why(row, doubled, gain)
    return None


def _why(row: dict[str, Any], doubled: dict[str, Any], gain: float) -> dict[str, Any]:
    time, strategy = doubled["time"], doubled["strategy"]
    step = doubled["step_time_s"]
    exposed = time["exposed_comm_s"] / step
    bubble = (doubled.get("bubble_fraction") or 0.0) * time["compute_s"] / step
    what = "gathers and reduce-scatters" if strategy in SHARDED else "communication"
    if exposed >= max(bubble, 0.2):
        cause = f"{exposed:.0%} of the step is {what} that the compute does not hide"
    elif bubble >= 0.2:
        cause = f"{bubble:.0%} of the step is the pipeline's bubble"
    else:
        cause = (
            f"{doubled['global_batch'] / doubled['data_parallel']:g} samples a replica leave the devices "
            f"little work beside a step's fixed costs ({exposed:.0%} of the step is {what} not hidden)"
        )
    remedies = _remedies(strategy, exposed, bubble, doubled)
    return {
        "devices": row["devices"],
        "doubled": doubled["devices"],
        "gain": gain,
        "exposed_share": exposed,
        "strategy": strategy,
        "remedies": remedies,
        "sentence": f"beyond {row['devices']} devices at this batch more devices stop paying: "
        f"{doubled['devices']} run {gain:.2f}x as fast as {row['devices']} with {strategy}, where {cause}; "
        f"what would help: {'; '.join(remedies)}",
    }


def _remedies(strategy: str, exposed: float, bubble: float, row: dict[str, Any]) -> list[str]:
    helps = []
    if strategy in SHARDED and exposed >= 0.2:
        if row["tp"] == 1:
            helps.append("tensor parallelism within a node (--tp), which divides the gathers' bytes")
        if strategy in ("fsdp", "fsdp+tp"):
            helps.append("HSDP (--dp-replicate R --dp-shard S): gathers within a node, an all-reduce across nodes")
        helps.append(
            "keeping the gathered parameters from forward to backward (--reshard-after-forward false), "
            "if the memory allows: a third fewer gathers"
        )
    if bubble >= 0.2:
        helps.append("more micro-batches per step (--microbatches): a smaller bubble")
    helps.append("a larger global batch (the LR scaled and warmed up): more compute to hide the rest behind")
    return helps
