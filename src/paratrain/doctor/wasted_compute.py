"""Work the model need not do, read from what the probe saw (launch/probe/facts.py): a speed-up the script asked
for that never took effect, and positions of a batch that are only padding. None of them fails or warns where a
user looks: the steps run, just slower than the script was written to run.

    autocast_disabled   torch.autocast asked for a device the run does not use (a GPU script on CPU ranks) or a
                        dtype that device's autocast lacks, and turned itself off with one warning: forward runs in
                        float32; the model's own layers timed under autocast to bfloat16 give the price
    compile_unused      torch.compile was called, yet the steps ran no compiled frame: what it returned is not what
                        the loop calls (`torch.compile(model)` on a line of its own)
    padding             batches padded beyond their longest sample (to the dataset's longest, a fixed max_length):
                        forward and backward compute on positions that are only padding
"""

from __future__ import annotations

import statistics
from typing import Any

from paratrain.doctor.causes import _phase, _script, _step, _training_loader
from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, speedup

AUTOCAST_SAVING = 0.05  # what autocast to bfloat16 would save, of the step, for a priced finding
PADDING_SHARE = 0.2  # positions beyond each batch's longest sample, of all the batches carry...
PADDING_SAVING = 0.05  # ...saving at least this share of the step


def _model_work(ev: RunEvidence) -> float:
    return _phase(ev, "forward") + _phase(ev, "backward") + _phase(ev, "recompute")


def _disabling_warning(rank: dict[str, Any]) -> dict[str, str] | None:
    return next((w for w in rank.get("warnings") or [] if "Disabling autocast" in w.get("message", "")), None)


def autocast_disabled(ev: RunEvidence) -> Finding | None:
    """torch.autocast turned itself off: `torch.autocast("cuda", ...)` on ranks without CUDA says so once, in a
    warning, and every operator of the forward the script wrote in a low precision runs in float32. The probe
    timed the model's layers alone in float32 and under autocast to bfloat16 on the rank's device (twins.py):
    the step with forward and backward at that ratio is the prediction. Where bfloat16 is no faster here
    (a CPU without bfloat16 instructions), the finding is advice."""
    ranks = [r for r in ev.probe_ranks if _disabling_warning(r)]
    if not ranks:
        return None
    warning = _disabling_warning(ranks[0]) or {}
    penalties = [r["autocast_penalty"] for r in ranks if r.get("autocast_penalty")]
    penalty = statistics.median(penalties) if penalties else None
    step, work = _step(ev), _model_work(ev)
    saved = work * (1 - 1 / penalty) if penalty and penalty > 1 else 0.0
    priced = saved / step >= AUTOCAST_SAVING
    timed = (
        f"the model's own layers ran {penalty:.2f}x as fast under autocast to bfloat16 as in float32 (each rank's)"
        if penalty
        else "the model's layers could not be timed under autocast"
    )
    return Finding(
        "autocast_disabled",
        "torch.autocast disabled itself: the forward written for mixed precision runs in float32"
        + (f", {pct(saved / step)} of every step" if priced else ""),
        f"step {ms(step)}: forward and backward {ms(work)}; torch warned at {warning.get('where', 'unknown')}: "
        f'"{warning.get("message", "")}"; {timed}',
        'torch.autocast(device_type, ...) casts only on the device it names: asked for "cuda" on ranks without '
        "CUDA (a script written on a GPU box), or for a dtype that device's autocast does not support, it warns once "
        "and does nothing, and every matrix product runs in float32",
        f"code change in {_script(ev)} at {warning.get('where', 'the autocast line')}: name the device the tensors "
        'are on, torch.autocast(device_type=x.device.type, dtype=torch.bfloat16) ("cpu" on CPU ranks)',
        f"{speedup(saved / step)}: forward and backward {penalty:.2f}x faster (the layers' measured ratio)"
        if priced
        else "no gain predicted on this machine: its layers are not faster in bfloat16"
        if penalty
        else "not priced: the layers could not be timed under autocast",
        saved / step if priced else None,
        where=warning.get("where"),
        share=work / step if step else None,
        explains={
            "forward": _phase(ev, "forward") * (1 - 1 / penalty) if priced and penalty else 0.0,
            "backward": _phase(ev, "backward") * (1 - 1 / penalty) if priced and penalty else 0.0,
        },
    )


def compile_unused(ev: RunEvidence) -> Finding | None:
    """torch.compile was called, yet after the steps dynamo had compiled no frame: torch.compile compiles when what
    it returns is first called, so a result nobody calls (`torch.compile(model)` on a line of its own, a
    compiled copy the loop never uses) leaves every step eager. What compiling would gain depends on the model
    (element-wise operators fused, Python's dispatch gone) and is not measured: the finding is advice."""
    ranks = [r for r in ev.probe_ranks if r.get("compile_calls") and not r.get("compiled") and r.get("steps", 0) >= 2]
    if not ranks or len(ranks) < len(ev.probe_ranks):
        return None
    calls = ranks[0]["compile_calls"]
    step, work = _step(ev), _model_work(ev)
    return Finding(
        "compile_unused",
        f"torch.compile was called but the steps run eager: nothing was compiled in {ranks[0]['steps']} steps",
        f"torch.compile called at {'; '.join(calls)}; dynamo compiled no frame on any rank; forward and backward "
        f"{ms(work)} of the {ms(step)} step ran in eager mode",
        "torch.compile(model) returns a new, compiled module and leaves `model` as it was: called on a line of its "
        "own, or its result kept but not the module the loop calls, it compiles nothing",
        f"code change in {_script(ev)}: model = torch.compile(model) (or model.compile(), which compiles in place) "
        "before wrapping the model in DDP or FSDP, and call that module in the loop",
        "not predicted: what compiling gives depends on the model (fused element-wise operators, no Python dispatch); "
        "measure a run with the fix (its first steps compile)",
        None,
        severity="medium",
        where=calls[0].split(": ", 1)[0],
        share=work / step if step else None,
    )


def padding(ev: RunEvidence) -> Finding | None:
    """Batches padded beyond their longest sample: the training loader's batches carried `padded_positions`
    (rows x width) where padding each to its own longest sample would carry `longest_positions` (the probe reads
    the trailing columns every row holds the pad value in). Forward and backward shrink with the positions they
    compute on (attention's part, quadratic in the length, more), so the prediction is linear in them."""
    loaders = [_training_loader(r) for r in ev.probe_ranks]
    carried = sum((loader or {}).get("padded_positions", 0) for loader in loaders)
    longest = sum((loader or {}).get("longest_positions", 0) for loader in loaders)
    if not carried:
        return None
    share = 1 - longest / carried
    step, work = _step(ev), _model_work(ev)
    saved = work * share
    if share < PADDING_SHARE or saved / step < PADDING_SAVING:
        return None
    first = next(loader for loader in loaders if loader)
    batches = sum((loader or {}).get("batches", 0) for loader in loaders)
    where = first.get("collate_fn") or f"the collate_fn of the DataLoader of {first['dataset']}"
    return Finding(
        "padding",
        f"batches are padded beyond their longest sample: {pct(share)} of the positions forward and backward "
        "compute on are padding",
        f"step {ms(step)}: forward and backward {ms(work)}; the training batches carried {carried:,} positions "
        f"in {batches:,} batches, {longest:,} of them up to each batch's longest sample (the rest is the same pad "
        "value in every row, to the batches' full width)",
        "a collate_fn (or tokenizer) that pads every batch to one fixed width (the dataset's longest sample, "
        'padding="max_length") makes every step as long as the longest sample; the attention mask keeps the '
        "result right, not the work small",
        f"code change at {where}: pad each batch to its own longest sample (width = max(len(s) for s in batch); "
        'torch.nn.utils.rnn.pad_sequence; Hugging Face: padding="longest" or DataCollatorWithPadding); batching '
        "samples of similar length (Trainer(group_by_length=True), a length-bucketed sampler) cuts more",
        f"{speedup(saved / step)}: forward and backward on {pct(1 - share)} of the positions (linear in them; "
        "attention's share, quadratic in the length, saves more)",
        saved / step,
        where=where,
        share=saved / step,
        explains={"forward": _phase(ev, "forward") * share, "backward": _phase(ev, "backward") * share},
    )


WASTED_COMPUTE = (autocast_disabled, compile_unused, padding)
