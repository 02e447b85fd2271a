"""Properties (issue #58) of the doctor's predicted gains and remedies in every shape: a finding's gain is 1x
(nothing) when its phase is 0 and grows with its share; accumulation's model; the findings ranked by their
savings; the step's account; the remedies' caps (cores, sqrt(N), the noise scale) and the accumulated batch
they count; DDP's buckets and the link fitted to the collectives. Records are built as the formula tests
build them (`probed_run`, `built_run`)."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_formulas_doctor import probed_run
from test_formulas_doctor_runs import built_run, grown

from paratrain.doctor import ROOT_CAUSES, causes, checks, rank, verdict
from paratrain.doctor import script_checks as sc
from paratrain.doctor.evidence import RunEvidence, read_run
from paratrain.doctor.finding import Finding, accumulation
from paratrain.doctor.ledger import UNEXPLAINED_SHARE, unexplained
from paratrain.doctor.script_collectives import script_collectives

FEW = settings(max_examples=50, deadline=None)
MiB = 2**20


def probed(ranks: list[dict[str, Any]], probe: dict[str, Any] | None = None) -> RunEvidence:
    with tempfile.TemporaryDirectory() as d:
        return read_run(probed_run(Path(d) / "run", ranks, probe=probe))


def built(config: dict[str, Any] | None = None, summary: dict[str, Any] | None = None) -> RunEvidence:
    with tempfile.TemporaryDirectory() as d:
        return built_run(Path(d) / "run", config, summary)


# -- a finding's gain against its phase -------------------------------------------------------------------------

Base = dict[str, float]  # forward, backward, optimizer: the rest of the step


def _script(
    check: Callable[[RunEvidence], Finding | None],
    phases: Callable[[Base, float], dict[str, float]],
    extra: Callable[[float], dict[str, Any]],
):
    """A probed check whose phase is x on each of n identical ranks."""
    return lambda base, x, n: check(probed([{"phases_s": phases(base, x), **extra(x)} for _ in range(n)]))


def _with(**keys: Callable[[float], Any]) -> Callable[[float], dict[str, Any]]:
    return lambda x: {k: f(x) for k, f in keys.items()}


def _none(x: float) -> dict[str, Any]:
    return {}


def _built(check: Callable[[RunEvidence], Finding | None], phase: str):
    def run(base: Base, x: float, n: int) -> Finding | None:
        breakdown = {
            "data_s": 0.0,
            "compute_s": base["forward"] + base["backward"],
            "comm_s": 0.0,
            "optimizer_s": base["optimizer"],
            "other_s": 0.0,
        }
        return check(built({"workers": n}, {"workers": n, "breakdown": {**breakdown, phase: x}}))

    return run


GAINS = {
    "data_wait": _script(sc.data_wait, lambda b, x: {**b, "data": x}, extra=_none),
    "script_collectives": _script(script_collectives, lambda b, x: {**b, "collective": x}, extra=_none),
    "evaluation_share": _script(sc.evaluation, lambda b, x: {**b, "eval": x}, extra=_none),
    "checkpoint_share": _script(
        sc.checkpoints, lambda b, x: {**b, "checkpoint": x}, extra=_with(checkpoint_steps=lambda x: 9)
    ),
    "exposed_communication": _script(sc.exposed_communication, lambda b, x: {**b, "comm": x}, extra=_none),
    "no_sync_missing": _script(
        sc.all_reduce_every_micro_step,
        lambda b, x: {**b, "comm": x},
        extra=_with(rounds_per_step=lambda x: 4.0, micro_per_step=lambda x: 4.0),
    ),
    "find_unused_parameters": _script(
        sc.find_unused_parameters,
        lambda b, x: {**b, "other": x},
        extra=_with(find_unused_parameters=lambda x: True, unused_parameter_bytes=lambda x: 0, ddp_overhead_s=float),
    ),
    "host_syncs": _script(
        sc.host_syncs,
        lambda b, x: {**b, "other": x},
        extra=_with(syncs_per_step=lambda x: 2.0, sync_wait_s=float, device_phases_s=lambda x: {"forward": 0.01}),
    ),
    "garbage_collection": _script(
        causes.garbage_collection, lambda b, x: {**b, "other": x}, extra=_with(gc_s_per_step=float)
    ),
    "recompilation": _script(
        causes.recompilation,
        lambda b, x: {**b, "forward": b["forward"] + x},
        extra=_with(compile_s_per_step=float, compiles_per_step=lambda x: 1.0),
    ),
    "model_collectives": _script(
        causes.model_collectives,
        lambda b, x: {**b, "comm": x},
        extra=_with(model_comm_s_per_step=float, samples_per_step=lambda x: 32.0),
    ),
    "needless_recompute": _script(
        causes.needless_recompute,
        lambda b, x: {**b, "recompute": x},
        extra=_with(peak_memory_bytes=lambda x: 1, memory_limit_bytes=lambda x: 10),
    ),
    "data_preparation": _script(causes.data_preparation, lambda b, x: {**b, "data": x}, extra=_with(data_cpu_s=float)),
    "data_wait (built-in)": _built(checks.data_wait, "data_s"),
    "host_sync_stalls (built-in)": _built(checks.host_sync_stalls, "other_s"),
    "exposed_communication (built-in)": _built(checks.exposed_communication, "comm_s"),
}


@settings(max_examples=30, deadline=None)  # for each of the 16 checks
@given(
    n=st.integers(2, 16),
    base=st.fixed_dictionaries(
        {"forward": st.floats(0.005, 0.1), "backward": st.floats(0.005, 0.1), "optimizer": st.floats(0.0, 0.02)}
    ),
    xs=st.lists(st.floats(0.0, 0.3), min_size=2, max_size=2),
)
@pytest.mark.parametrize("check", sorted(GAINS))
def test_a_gain_is_nothing_when_its_phase_is_zero_and_grows_with_its_share(check, n, base, xs):
    """At phase 0 a check finds nothing, or predicts 1x; a larger phase (the rest as it was) is found wherever a
    smaller one was, with a saving as large or larger, and never the whole step."""
    gain = GAINS[check]
    zero = gain(base, 0.0, n)
    assert zero is None or zero.saving == pytest.approx(0.0, abs=1e-12), zero
    small, large = sorted(xs)
    before, after = gain(base, small, n), gain(base, large, n)
    if before is not None:
        assert after is not None and after.saving >= before.saving - 1e-12
    for found in (before, after):
        if found is not None and found.saving is not None:
            assert 0 <= found.saving < 1 and found.predicted_speedup >= 1


@FEW
@given(
    micro=st.just(0.0) | st.floats(1e-6, 1.0),
    per_step=st.just(0.0) | st.floats(1e-6, 1.0),
    comms=st.lists(st.just(0.0) | st.floats(1e-6, 1.0), min_size=2, max_size=2),
)
def test_accumulation_picks_the_fewest_micro_steps_that_hide_the_all_reduce_and_saves_more_as_it_grows(
    micro, per_step, comms
):
    """g is the first of 2, 4, 8 whose all-reduce is at most a tenth of g micro-steps (else 8); the saving is
    g steps' worth of all-reduce and optimizer less one, nothing when both are 0, and grows with the all-reduce."""
    assume(micro + per_step + min(comms) > 0)  # a step of no time has nothing to accumulate
    savings = []
    for comm in sorted(comms):
        g, new, saving = accumulation(micro, per_step, comm)
        hides = [k for k in (2, 4, 8) if comm <= 0.10 * (k * micro + per_step + comm)]
        assert g == (hides[0] if hides else 8)
        assert new == pytest.approx(g * micro + per_step + comm)
        assert saving == pytest.approx((g - 1) * (per_step + comm) / (g * (micro + per_step + comm)))
        assert 0 <= saving <= 1 - 1 / g + 1e-12
        assert (saving == 0) == (per_step + comm == 0)
        savings.append(saving)
    assert savings[1] >= savings[0] - 1e-12


# -- ranking ---------------------------------------------------------------------------------------------------

PLAIN = ("data_wait", "host_syncs", "garbage_collection", "float64", "straggler", "evaluation_share", "small_batch")


@FEW
@given(
    findings=st.lists(
        st.tuples(st.sampled_from((*PLAIN, *ROOT_CAUSES, "slow_rank")), st.none() | st.floats(0.0, 0.99)),
        min_size=1,
        max_size=12,
    ),
    data=st.data(),
)
def test_findings_are_ranked_by_their_savings_whatever_order_they_come_in(findings, data):
    """Root causes first (in their order), then the run's time findings by saving, largest first, then a slower
    machine's, then advice; the verdict's 'biggest' is the largest plain saving, whatever the input's order."""
    made = [
        Finding(check, f"{check} {i}", "", "", "", f"{i}x: ...", saving) for i, (check, saving) in enumerate(findings)
    ]
    shuffled = data.draw(st.permutations(made))
    ranked = rank(shuffled)

    def tier(f: Finding) -> int:
        if f.check in ROOT_CAUSES:
            return ROOT_CAUSES.index(f.check)  # oversubscription, then loader workers, whatever their savings
        if f.saving is None:
            return len(ROOT_CAUSES) + 2
        return len(ROOT_CAUSES) + (f.check == "slow_rank")

    tiers = [tier(f) for f in ranked]
    assert tiers == sorted(tiers)
    for t in set(tiers):
        savings = [f.saving for f in ranked if tier(f) == t and f.saving is not None]
        assert savings == sorted(savings, reverse=True)
    plain = [f for f in made if tier(f) == len(ROOT_CAUSES)]
    if not any(f.check in ROOT_CAUSES for f in made) and plain:
        biggest = max(f.saving for f in plain)
        assert (
            verdict(ranked).split("the biggest: ")[1].startswith(next(f.finding for f in ranked if f.saving == biggest))
        )


# -- the step's account (doctor/ledger.py) ------------------------------------------------------------------------


@FEW
@given(
    others=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=16),
    forward=st.floats(0.01, 0.1),
    explained=st.lists(st.floats(0.0, 0.02), max_size=4),
)
def test_what_no_finding_explains_in_other_is_the_ranks_mean_less_every_explanation(others, forward, explained):
    """Unexplained `other` is the ranks' mean less what the findings explain of it, named from a tenth of the
    step; explaining more never makes it larger."""
    ev = probed([{"phases_s": {"forward": forward, "other": o}} for o in others])
    step = forward + sum(others) / len(others)
    left = sum(others) / len(others)
    previous = math.inf
    for i in range(len(explained) + 1):
        said = [Finding("x", "", "", "", "", "", 0.1, explains={"other": e}) for e in explained[:i]]
        rest = left - sum(explained[:i])
        found = [f for f in unexplained(ev, said) if f.check == "unexplained_other"]
        assume(abs(rest / step - UNEXPLAINED_SHARE) > 1e-9)
        if rest / step >= UNEXPLAINED_SHARE:
            assert found[0].saving == pytest.approx(rest / step)
            assert found[0].saving <= previous
            previous = found[0].saving
        else:
            assert found == []
            previous = 0.0


# -- the remedies' bounds and the batch they count ---------------------------------------------------------------


@FEW
@given(workers=st.integers(1, 64), threads=st.integers(1, 16), cores=st.integers(1, 128))
def test_oversubscriptions_remedy_fits_the_cores_with_no_more_ranks(workers, threads, cores):
    found = checks.oversubscription(
        built(
            {"workers": workers, "resolved": {"threads_per_worker": threads}},
            {"workers": workers, "machine_load": {"cores": cores}},
        )
    )
    if workers * threads <= cores:
        assert found is None
    else:
        fixed_workers = found.rerun.get("workers", workers)
        fixed_threads = found.rerun["threads_per_worker"]
        assert fixed_workers * fixed_threads <= cores and 1 <= fixed_workers <= workers and fixed_threads >= 1


@FEW
@given(
    batch=st.integers(1, 64),
    accum=st.integers(1, 8),
    workers=st.integers(2, 16),
    compute=st.floats(0.1, 10.0),
)
def test_oversubscriptions_prediction_counts_the_accumulated_batch(batch, accum, workers, compute):
    """A rank's step computes batch x accum samples: splitting them into more micro-batches leaves the prediction."""

    def saving(batch: int, accum: int) -> float:
        ev = built(
            {"workers": workers, "batch_size": batch, "grad_accum": accum, "resolved": {"threads_per_worker": 2}},
            {
                "workers": workers,
                "batch_size": batch,
                "grad_accum": accum,
                "flops_per_sample": 1e6,
                "mfu_peak": {"per_device": 1e10},
                "machine_load": {"cores": workers},
                "breakdown": {"data_s": 0.0, "compute_s": compute, "comm_s": 0.0, "optimizer_s": 0.0, "other_s": 0.0},
            },
        )
        return checks.oversubscription(ev).saving

    assert saving(batch, accum) == pytest.approx(saving(batch * accum, 1))


@FEW
@given(
    workers=st.integers(2, 16),
    threads=st.integers(1, 8),
    more=st.integers(2, 4),
    cores=st.integers(2, 64),
    compute=st.floats(0.1, 10.0),
)
def test_oversubscriptions_prediction_reads_the_peak_per_thread_it_was_measured_with(
    workers, threads, more, cores, compute
):
    """The audit's survivor class (#58, a wrong base): the peak in the summary was measured on the rank's own
    threads, so the rate a thread gets is peak / threads, whatever the machine's cores. A run with `more` times
    the threads and a peak measured `more` times higher has the same rate per thread: the same prediction."""
    assume(workers * threads > cores)

    def saving(threads_per_worker: int, peak: float) -> float:
        ev = built(
            {"workers": workers, "batch_size": 32, "resolved": {"threads_per_worker": threads_per_worker}},
            {
                "workers": workers,
                "batch_size": 32,
                "flops_per_sample": 1e6,
                "mfu_peak": {"per_device": peak},
                "machine_load": {"cores": cores},
                "breakdown": {"data_s": 0.0, "compute_s": compute, "comm_s": 0.0, "optimizer_s": 0.0, "other_s": 0.0},
            },
        )
        return checks.oversubscription(ev).saving

    assert saving(threads, 1e9 * threads) == pytest.approx(saving(threads * more, 1e9 * threads * more))


@FEW
@given(
    replicas=st.integers(1, 64),
    batch=st.integers(1, 256),
    accum=st.integers(1, 16),
    n_train=st.integers(1, 10**6),
)
def test_the_sqrt_n_remedy_keeps_the_global_batch_under_the_bound_it_names(replicas, batch, accum, n_train):
    """Where replicas alone fit under sqrt(N), the rerun's global batch (replicas x batch x micro-steps) does."""
    g = replicas * batch * accum
    assume(replicas <= math.isqrt(n_train) < g)
    found = checks.global_batch_sqrt_n(
        built(
            {"workers": replicas, "batch_size": batch, "grad_accum": accum, "resolved": {"train_samples": n_train}},
            {"workers": replicas, "batch_size": batch, "grad_accum": accum, "global_batch_size": g},
        )
    )
    after = replicas * found.rerun.get("batch_size", batch) * found.rerun.get("grad_accum", accum)
    assert after <= math.sqrt(n_train), (found.rerun, after)
    assert found.global_batch_factor == pytest.approx(after / g)


@FEW
@given(start=st.integers(8, 512), doublings=st.integers(1, 5), above=st.floats(2.0, 64.0))
def test_a_capped_adaptive_batch_is_told_a_cap_of_its_doublings_within_the_noise(start, doublings, above):
    """The raised cap is the largest of the doublings from the cap the noise scale reaches: at least twice the cap,
    never above the noise scale."""
    final = start * 2**doublings
    noise = above * final
    found = checks.batch_growth_capped(built({}, grown("adaptive", start, final, final, (final, final), noise)))
    raised = found.rerun["max_global_batch"]
    assert 2 * final <= raised <= noise and math.log2(raised / final).is_integer()


# -- DDP's buckets and the link --------------------------------------------------------------------------------


@FEW
@given(gradient_bytes=st.integers(1, 4 * 10**9))
def test_ddps_default_buckets_are_the_fewest_that_hold_the_gradients(gradient_bytes):
    k = causes.default_buckets(gradient_bytes)
    capacity = causes.DDP_FIRST_BUCKET + (k - 1) * causes.DDP_BUCKET
    assert capacity >= gradient_bytes
    assert k == 1 or capacity - causes.DDP_BUCKET < gradient_bytes


@FEW
@given(
    sizes=st.sets(st.integers(MiB, 64 * MiB), min_size=2, max_size=8),
    latency=st.floats(1e-5, 1e-2),
    bandwidth=st.floats(1e8, 1e11),
    waits=st.lists(st.floats(0.0, 0.1), max_size=8),
    ranks=st.integers(1, 8),
)
def test_the_link_is_the_least_time_per_message_size_on_any_rank(sizes, latency, bandwidth, waits, ranks):
    """On collectives whose least times lie on latency + bytes / bandwidth (others waited for a rank) the fit
    returns that latency and bandwidth, however the messages are spread over the ranks' traces."""
    sizes = sorted(sizes)
    assume(sizes[-1] >= 2 * sizes[0])
    link = [[float(s), latency + s / bandwidth] for s in sizes]
    link += [
        [float(sizes[i % len(sizes)]), latency + sizes[i % len(sizes)] / bandwidth + w] for i, w in enumerate(waits)
    ]
    traces = [{"trace": {"link": link[r::ranks]}, "phases_s": {"forward": 0.01}} for r in range(ranks)]
    fitted_latency, fitted_bandwidth = causes.link_fit(probed(traces))
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-4)
    assert fitted_latency == pytest.approx(latency, rel=1e-3)


@FEW
@given(world=st.integers(2, 64))
def test_every_rank_reading_the_whole_dataset_costs_all_but_one_nth_of_an_epoch(world):
    loader = {"dataset": "D", "length": 1024, "batch_size": 32, "batches_per_epoch": 32, "batches": 32}
    ranks = [{"phases_s": {"forward": 0.01}, "loaders": [{**loader, "world": world}]}] * world
    found = causes.duplicate_data(probed(ranks))
    assert found.saving == pytest.approx(1 - 1 / world)
