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
    parametrization_recomputed
                        a parametrized tensor (torch.nn.utils.parametrize) read many times a forward, outside
                        parametrize.cached(): its parametrization, and the backward of it, run at every read
    debug_environment   a debugging switch left in the environment: TORCH_DISTRIBUTED_DEBUG=DETAIL checks every
                        collective with a barrier and an all-gather of its own, before it runs;
                        CUDA_LAUNCH_BLOCKING=1 makes every kernel launch wait for the kernel
    unfused_attention   attention written as its own operators: the sequence x sequence scores materialised,
                        masked and softmaxed in forward and backward, where scaled_dot_product_attention fuses them
    repeated_backward   more backward passes than training forwards: one backward per loss of a forward
                        (retain_graph=True), each walking the shared part of the graph, and under FSDP gathering and
                        reducing its parameters again
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path
from typing import Any

from paratrain.doctor.causes import _per_step, _phase, _script, _step, _training_loader, link_fit, trace_top
from paratrain.doctor.evidence import RunEvidence
from paratrain.doctor.finding import Finding
from paratrain.formatting import ms, pct, speedup
from paratrain.launch.trace_summary import PROBE_LABEL

AUTOCAST_SAVING = 0.05  # what autocast to bfloat16 would save, of the step, for a priced finding
PADDING_SHARE = 0.2  # positions beyond each batch's longest sample, of all the batches carry...
PADDING_SAVING = 0.05  # ...saving at least this share of the step
# Softmax over square score matrices, of forward, backward and recompute in the profiled steps, that names
# unfused attention, when the operators on the scores save at least ATTENTION_SAVING of the step
SCORES_SHARE, ATTENTION_SAVING = 0.15, 0.05
RECOMPUTED_CALLS = 2  # a parametrization's calls per forward, per tensor, from which it is recomputed...
RECOMPUTED_SAVING = 0.05  # ...and saving at least this share of the step
BACKWARDS_PER_FORWARD = 1.5  # backward passes per training forward from which they repeat...
BACKWARD_SAVING = 0.05  # ...and saving at least this share of the step
# On a GPU these slow every step by an amount this run cannot measure: advice.
GPU_SWITCHES = {
    "CUDA_LAUNCH_BLOCKING": "every CUDA kernel launch waits until the kernel has run: the CPU never runs ahead "
    "of the GPU, so the GPU idles between kernels",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "every tensor is allocated with cudaMalloc and freed with cudaFree, which "
    "synchronise the device, instead of reusing PyTorch's cached blocks",
}


PHASES_OF_WORK = ("forward", "backward", "recompute")


def _model_work(ev: RunEvidence) -> float:
    return sum(_phase(ev, p) for p in PHASES_OF_WORK)


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


def _traced_step(rank: dict[str, Any]) -> float:
    """Seconds of a profiled step (the phases the trace holds), the profiled steps' own scale."""
    return sum(p.get("s", 0.0) for p in ((rank.get("trace") or {}).get("phases") or {}).values())


def parametrization_recomputed(ev: RunEvidence) -> Finding | None:
    """A parametrization (torch.nn.utils.parametrize: orthogonal, weight_norm, spectral_norm, the user's own)
    runs each time its tensor is read: a weight read at every time step of a loop recomputes it that many
    times, and backward runs back through each of them. The profiled steps count its calls and time it, forward
    and (charged to it by the trace) backward; under parametrize.cached() it runs once a forward per tensor, so
    the prediction removes all calls but those."""
    ranks = [r for r in ev.probe_ranks if (r.get("trace") or {}).get("parametrizations") and _traced_step(r)]
    if not ranks:
        return None
    found = ranks[0]["trace"]["parametrizations"]
    forwards = max(1.0, ranks[0].get("micro_per_step", 1.0))
    needed = found["tensors"] * forwards
    if found["calls"] < RECOMPUTED_CALLS * needed:
        return None
    share = statistics.mean(r["trace"]["parametrizations"]["s"] / _traced_step(r) for r in ranks)
    saving = share * (1 - needed / found["calls"])
    if saving < RECOMPUTED_SAVING:
        return None
    step = _step(ev)
    module = found["module"]
    lines = [name for name, _ in trace_top(ev, "forward") if name != PROBE_LABEL]
    return Finding(
        "parametrization_recomputed",
        f"a parametrization runs {found['calls'] / needed:.0f} times a forward per tensor: {pct(share)} of every "
        "step computes it and its backward",
        f"step {ms(step)}; in the profiled steps {found['tensors']} parametrized tensor(s) ({module}) were computed "
        f"{found['calls']:.0f} times a step, in {forwards:.0f} forward(s); those calls and their backward took "
        f"{pct(share)} of the step" + (f"; read at {lines[0]}" if lines else ""),
        "torch.nn.utils.parametrize computes a parametrized tensor (orthogonal, spectral_norm, weight_norm) "
        "afresh at every read of it: a weight read inside a loop (an RNN's time steps, a shared layer) is "
        "recomputed at every read, and backward differentiates every one",
        f"code change in {_script(ev)}: run the forward under `with torch.nn.utils.parametrize.cached():` (one "
        "computation per tensor per forward, cached until the block ends), or read the weight once into a "
        "local before the loop",
        f"{speedup(saving)}: the parametrization computed once per tensor and forward instead of "
        f"{found['calls'] / needed:.0f} times",
        saving,
        where=lines[0] if lines else module,
        share=share,
        # the parametrization's whole share (the calls that stay are its work, not unexplained), in forward's and
        # backward's shares of the model's work
        explains=_in_model_work(ev, share * step),
    )


def _in_model_work(ev: RunEvidence, seconds: float) -> dict[str, float]:
    """Seconds a step of the model's work, split over forward, backward and recompute in their measured shares."""
    work = _model_work(ev)
    return {p: _phase(ev, p) * min(seconds, work) / work if work else 0.0 for p in PHASES_OF_WORK}


def _transfer_s(ev: RunEvidence) -> float | None:
    """Seconds a step the run's collectives need on this link: their bytes at its bandwidth and a latency per
    call (the link as the trace met it; without a bandwidth fit, the largest message's best rate). None
    without a trace of the link."""
    points = [p for r in ev.probe_ranks for p in (r.get("trace") or {}).get("link", [])]
    if not points:
        return None
    latency, bandwidth = link_fit(ev)
    if bandwidth is None:
        largest = max(nbytes for nbytes, _ in points)
        bandwidth = largest / min(s for nbytes, s in points if nbytes == largest)
    calls = statistics.mean(r.get("inner_calls_per_step", 0.0) + r.get("buckets_per_step", 0.0) for r in ev.probe_ranks)
    moved = statistics.mean(
        r.get("inner_bytes_per_step", 0.0) + r.get("bucket_bytes_per_step", 0.0) for r in ev.probe_ranks
    )
    return moved / bandwidth + calls * latency


def _setting_line(ev: RunEvidence, name: str) -> str | None:
    """The script's line that names an environment variable in its code (os.environ["NAME"] = ...; not a
    docstring or comment that mentions it), when it does."""
    try:
        tree = ast.parse(Path(_script(ev)).read_text())
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    lines = sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == name)
    return f"{_script(ev)}:{lines[0]}" if lines else None


def debug_environment(ev: RunEvidence) -> Finding | None:
    """A debugging switch left on. TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the process group: before each
    collective, a monitored barrier and an all-gather of the collective's fingerprint on a helper group, run
    in the caller's thread, so every call waits for every rank and two round trips. The collectives' time a step
    is set against what their bytes need on the link the trace measured; the gain is a bound, since
    without the checks the collectives still wait for the slowest rank. CUDA and allocator switches on a GPU are
    named with what they do: this run cannot time them."""
    ranks = [r for r in ev.probe_ranks if r.get("debug_environment")]
    if not ranks:
        return None
    settings = ranks[0]["debug_environment"]
    step = _step(ev)
    if settings.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL":
        comm = _phase(ev, "comm") + _phase(ev, "collective")
        transfer = _transfer_s(ev)
        saved = max(0.0, comm - transfer) if transfer is not None else 0.0
        share = saved / step if saved else None
        where = _setting_line(ev, "TORCH_DISTRIBUTED_DEBUG") or "the environment the ranks were launched with"
        return Finding(
            "debug_environment",
            "TORCH_DISTRIBUTED_DEBUG=DETAIL is set: every collective is checked across ranks before it runs"
            + (f", {pct(share)} of every step" if share else ""),
            f"step {ms(step)}; torch's distributed debug level is DETAIL (set at {where}); collectives {ms(comm)} a "
            "step" + (f", where their bytes need {ms(transfer)} on this link" if transfer is not None else ""),
            "TORCH_DISTRIBUTED_DEBUG=DETAIL, meant for finding a hang or a mismatched collective, wraps the process "
            "group: each collective first runs a monitored barrier and an all-gather of its shapes and type on a "
            "helper group, waiting for every rank, in the caller's thread",
            f"configuration: remove TORCH_DISTRIBUTED_DEBUG=DETAIL (at {where}) once the hang is found (OFF is the "
            "default)",
            # A bound: without the checks the collectives still wait for the slowest rank (on an AVX2 VM this priced
            # 2.45x where removing DETAIL gained 1.19x: docs/doctor.md)
            f"up to {speedup(share)} if the collectives took what their bytes need on this link (a bound: without "
            "the checks they still wait for the slowest rank)"
            if share
            else "not priced: the link was not traced, or the collectives take no more than their bytes need",
            share,
            where=where,
            share=share,
            bound=True,
            explains={"comm": saved},
        )
    found = [name for name in GPU_SWITCHES if settings.get(name, "0") not in ("0", "")]
    if not found or ev.on_cpu:
        return None
    name = found[0]
    where = _setting_line(ev, name) or "the environment the ranks were launched with"
    return Finding(
        "debug_environment",
        f"{name}={settings[name]} is set: a debugging switch that slows every step on a GPU",
        f"{name}={settings[name]} in the ranks' environment (set at {where})",
        GPU_SWITCHES[name],
        f"configuration: unset {name} (at {where}) once debugging is done",
        "not measured: this run cannot time the GPU without the switch; measure a run without it",
        None,
        severity="high",
        where=where,
    )


def unfused_attention(ev: RunEvidence) -> Finding | None:
    """Attention computed as its own operators: the (batch, heads, sequence, sequence) scores materialised, masked,
    softmaxed (and dropped out, averaged over heads) in forward, again in a checkpoint's recompute, and in
    backward, where the fused kernel (scaled_dot_product_attention) computes the same in blocks that never leave
    the cache. The profiled steps time every operator on the scores; the fused kernel still does the two
    products' work, so the prediction removes the rest. The remedy is the switch the module offers."""
    ranks = [r for r in ev.probe_ranks if (r.get("trace") or {}).get("scores") and _traced_step(r)]
    if not ranks:
        return None
    trace = ranks[0]["trace"]
    scores = trace["scores"]
    work = sum((trace["phases"].get(p) or {}).get("s", 0.0) for p in ("forward", "backward", "recompute"))
    saving = statistics.mean(r["trace"]["scores"].get("ops_s", 0.0) / _traced_step(r) for r in ranks)
    if not work or scores["s"] < SCORES_SHARE * work or saving < ATTENTION_SAVING:
        return None
    module = scores.get("module") or "the model's attention"
    shape = "x".join(str(d) for d in scores.get("shape") or [])
    if "MultiheadAttention" in module:
        remedy = (
            "call nn.MultiheadAttention with need_weights=False where the weights are not used (the default "
            "need_weights=True computes the attention unfused, to return them): it then runs "
            "scaled_dot_product_attention"
        )
    else:
        remedy = (
            "compute attention with torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., "
            'is_causal=...); a Hugging Face model: attn_implementation="sdpa" (not "eager") in from_config or '
            "from_pretrained"
        )
    step = _step(ev)
    # The products stay (the fused kernel computes them too) but are attention's own work, not work beyond the
    # model's layers: accounted for here, so the layers-alone comparison does not count them again.
    products = statistics.mean(r["trace"]["scores"].get("products_s", 0.0) / _traced_step(r) for r in ranks)
    return Finding(
        "unfused_attention",
        f"attention is computed unfused: the {shape} score matrices are materialised, {pct(saving)} of every step "
        "beyond their products",
        f"step {ms(step)}; in the profiled steps a softmax over {shape} scores took {pct(scores['s'] / work)} of "
        f"forward and backward, and every operator on the scores but their products {pct(saving)} of the step "
        f"(in {module})",
        "attention written as its own operators (a score product, a mask, a softmax, a dropout, a product with "
        "the values) keeps the whole sequence x sequence score matrix in memory and passes over it several times, "
        "forward and backward; the fused kernel computes it in blocks",
        f"code change in {_script(ev)}: {remedy}",
        f"{speedup(saving)}: every operator on the scores gone but the two products, which the fused kernel "
        "still computes",
        saving,
        where=module,
        share=saving,
        explains=_in_model_work(ev, (saving + products) * step),
    )


def repeated_backward(ev: RunEvidence) -> Finding | None:
    """Backward run several times per forward (the probe counts torch.autograd.backward calls and training
    forwards, per step): a loss.backward(retain_graph=True) per task's loss walks the shared trunk's graph once per
    loss, where backward of their sum walks it once with the same gradients. The prediction keeps one backward per
    forward: backward and the collectives in the step (under FSDP each backward gathers and reduces again) by
    forwards over backwards. A bound: the collectives of forward are in that share too."""
    backwards, forwards = _per_step(ev, "backwards"), _per_step(ev, "micro")
    if not forwards or backwards < BACKWARDS_PER_FORWARD * forwards:
        return None
    step, kept = _step(ev), forwards / backwards
    repeated = {p: _phase(ev, p) * (1 - kept) for p in ("backward", "comm")}
    saving = sum(repeated.values()) / step
    if saving < BACKWARD_SAVING:
        return None
    return Finding(
        "repeated_backward",
        f"backward runs {backwards / forwards:.0f} times per forward: {backwards:.0f} backward passes a step "
        f"for {forwards:.0f} training forward(s)",
        f"step {ms(step)}: backward {ms(_phase(ev, 'backward'))}, collectives in forward and backward "
        f"{ms(_phase(ev, 'comm'))}; {backwards:.0f} calls of backward() a step, {forwards:.0f} forward(s)",
        "one backward per loss of the same forward (loss.backward(retain_graph=True) for each task or term) walks "
        "the shared part of the graph once per loss, and under FSDP gathers and reduces its parameters again "
        "each time; the gradients add up to those of the losses' sum",
        f"code change in {_script(ev)}: add the losses and call backward once: "
        "(loss_a + loss_b + loss_c).backward(), weighted as before; no retain_graph",
        f"up to {speedup(saving)}: one backward per forward, its collectives with it (a bound: forward's "
        "collectives are in that share)",
        saving,
        where="the script's backward() calls, one per loss",
        share=saving,
        bound=True,
        explains=repeated,
    )


WASTED_COMPUTE = (
    autocast_disabled,
    compile_unused,
    padding,
    parametrization_recomputed,
    debug_environment,
    unfused_attention,
    repeated_backward,
)
