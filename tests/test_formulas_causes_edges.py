"""The doctor's causes (doctor/causes.py) at their edges, on hand-made probe records, each case computed
by hand: float64's price with the recompute counted and a measured ratio under 1, DDP's buckets at exactly their
lines (4x the default's count, 2 above it, 5 % of the step saved) with the setting quoted, the link fitted only
to messages that span a factor 2, a whole dataset read at exactly 0.9 of it an epoch, and preparing batches at
exactly 15 % of the step with no core to spare."""

import json

import pytest
from test_formulas_causes import findings, step
from test_formulas_doctor import probed_run

from paratrain.doctor.causes import (
    BUCKET_EXCESS,
    BUCKET_SAVING,
    DATA_CPU_SHARE,
    data_preparation,
    ddp_buckets,
    duplicate_data,
    float64,
    link_fit,
    needless_recompute,
)
from paratrain.doctor.evidence import read_run


def evidence(tmp_path, ranks, strip=()):
    """The run of `ranks` as the doctor reads it; `strip`: keys left out of every rank's record."""
    run = probed_run(tmp_path, ranks)
    if strip:
        summary = json.loads((run / "summary.json").read_text())
        for r in summary["probe"]["ranks"]:
            for key in strip:
                del r[key]
        (run / "summary.json").write_text(json.dumps(summary))
    return read_run(run)


# -- float64 ---------------------------------------------------------------------------------------------------------

# a 1,000 ms step: forward 250, backward 250, recompute 125, optimizer 125 ms
F64_PHASES = {"forward": 0.25, "backward": 0.25, "recompute": 0.125, "optimizer": 0.125, "other": 0.25}


def test_float64s_price_counts_the_recompute_and_quotes_the_parameters_and_inputs(tmp_path):
    # at a measured 2x: (250 + 250 + 125) x 1/2 + 125 / 2 = 375 ms of 1,000
    rank = {
        "phases_s": F64_PHASES,
        "float64_penalty": 2.0,
        "param_dtypes": {"float64": 1000, "float32": 10},
        "input_dtypes": ["float64", "int64"],
    }
    found = float64(evidence(tmp_path / "f64", [rank] * 2))
    assert found.saving == pytest.approx(0.375)
    assert found.evidence == (
        "step 1,000 ms: forward and backward 625 ms, optimizer 125 ms; parameters 1,000 float64, 10 float32; inputs "
        "float64, int64; the model's own layers ran 2.0x slower in float64 than in float32 (timed in each rank)"
    )
    assert found.where == "the model's parameters and inputs (float64)"
    assert found.explains == {"forward": pytest.approx(0.125), "backward": pytest.approx(0.125)}
    # inputs the probe did not see are said to be unknown
    unseen = {k: v for k, v in rank.items() if k != "input_dtypes"}
    assert "; inputs unknown;" in float64(evidence(tmp_path / "unseen", [unseen] * 2)).evidence


def test_float64_layers_measured_no_slower_leave_only_the_optimizers_half(tmp_path):
    # 0.5x (a noisy timing of tiny layers): the layers save nothing, the optimizer still moves half the bytes:
    # 62.5 ms of 1,000
    rank = {"phases_s": F64_PHASES, "float64_penalty": 0.5, "param_dtypes": {"float64": 1000}}
    assert float64(evidence(tmp_path / "fast", [rank] * 2)).saving == pytest.approx(0.0625)


# -- DDP's buckets ---------------------------------------------------------------------------------------------------

# no collective of a MiB or more in the trace: the transfer is taken as free, and the gain is a bound
DDP = {"ddp": True, "gradient_bytes": 2**20, "bucket_cap_bytes": 2**17}


def test_ddp_buckets_at_exactly_five_percent_of_the_step_saved(tmp_path):
    assert BUCKET_SAVING == 0.05
    # 1 MiB of gradients (the default makes 1 bucket) in 11 a step, 55 ms exposed of 1,000: with 1 bucket
    # 5 ms, 50 ms (5 %) saved
    rank = {"phases_s": {"forward": 0.5, "backward": 0.445, "comm": 0.055}, "buckets_per_step": 11, **DDP}
    found = ddp_buckets(evidence(tmp_path / "edge", [rank] * 2))
    assert found.saving == pytest.approx(0.05) and found.bound
    assert found.explains == {"comm": pytest.approx(0.05)}
    assert found.where == "DistributedDataParallel(bucket_cap_mb=0.125)"
    assert found.remedy.endswith("drop bucket_cap_mb=0.125")
    # 54 ms exposed: 49.1 ms saved
    under = {**rank, "phases_s": {"forward": 0.5, "backward": 0.446, "comm": 0.054}}
    assert ddp_buckets(evidence(tmp_path / "under", [under] * 2)) is None


def test_ddp_buckets_count_from_4x_the_defaults_and_more_than_2_above_it(tmp_path):
    assert BUCKET_EXCESS == 4
    phases = {"forward": 0.5, "backward": 0.25, "comm": 0.25}

    def found(name, buckets, gradient_bytes, ranks=2):
        rank = {"phases_s": phases, **DDP, "buckets_per_step": buckets, "gradient_bytes": gradient_bytes}
        return ddp_buckets(evidence(tmp_path / name, [rank] * ranks))

    # 1 MiB: the default makes 1 bucket; 3 a step is only 2 above it, 4 is 4x (saving 250 x 3/4 = 187.5 of 1,000 ms)
    assert found("three", 3, 2**20) is None
    assert found("four", 4, 2**20).saving == pytest.approx(0.1875)
    # 2 MiB: the default makes 2; 6 a step is 3x, 8 is 4x (saving 250 x 6/8 = 187.5 ms)
    assert found("six", 6, 2**21) is None
    assert found("eight", 8, 2**21).saving == pytest.approx(0.1875)
    # one rank has no all-reduce to shrink
    assert found("alone", 8, 2**21, ranks=1) is None


def test_ddp_buckets_from_a_record_without_the_gradients_size_or_the_cap(tmp_path):
    # no gradient_bytes: the default's single bucket; no bucket_cap_bytes: the cap is quoted as 0
    rank = {"phases_s": {"forward": 0.5, "backward": 0.25, "comm": 0.25}, "buckets_per_step": 8, **DDP}
    found = ddp_buckets(evidence(tmp_path / "older", [rank] * 2, strip=("gradient_bytes", "bucket_cap_bytes")))
    assert found.saving == pytest.approx(0.25 * 7 / 8)
    assert "0.0 MiB of gradients" in found.evidence and found.where == "DistributedDataParallel(bucket_cap_mb=0)"


# -- the link --------------------------------------------------------------------------------------------------------


class Traced:
    """The evidence link_fit reads: each rank's trace."""

    def __init__(self, *traces):
        self.probe_ranks = [{"phases_s": {}, "trace": t} for t in traces]


def test_the_link_without_collectives_is_a_tenth_of_a_millisecond_and_no_bandwidth():
    assert link_fit(Traced()) == (1e-4, None)
    assert link_fit(Traced(None, {"steps": 2, "phases": {}})) == (1e-4, None)  # no trace; a trace with no link


def test_the_bandwidth_is_fitted_only_to_large_messages_spanning_a_factor_2():
    # 1 MiB in 2 ms and 2 MiB in 3 ms: 1 ms per MiB; the latency is 2 ms less the MiB's transfer, 1 ms
    latency, bandwidth = link_fit(Traced({"link": [[2**20, 0.002], [2**21, 0.003]]}))
    assert bandwidth == pytest.approx(2**20 / 0.001) and latency == pytest.approx(0.001)
    # 1 and 1.5 MiB: too close in size to tell the bandwidth from the waits
    latency, bandwidth = link_fit(Traced({"link": [[2**20, 0.002], [1.5 * 2**20, 0.0025]]}))
    assert bandwidth is None and latency == pytest.approx(0.002)


# -- every rank reading the whole dataset ----------------------------------------------------------------------------

LOADER = {
    "dataset": "Images",
    "dataset_code": "data.py:12",
    "iterable": False,
    "length": 640,
    "sampler": "RandomSampler",
    "sampler_replicas": None,
    "batch_size": 32,
    "batches_per_epoch": 18,
    "workers": 0,
    "world": 2,
    "batches": 100,
    "dataset_sum": 0.25,
}
DATA_PHASES = {"forward": 0.5, "backward": 0.5}


def duplicate(tmp_path, *loaders):
    """duplicate_data on a run whose ranks each hold one of `loaders` (each rank its own first batch)."""
    ranks = [
        {"phases_s": DATA_PHASES, "loaders": [{**loader, "first_batch_sum": float(i)}]}
        for i, loader in enumerate(loaders)
    ]
    return duplicate_data(evidence(tmp_path, ranks))


def test_an_epoch_of_exactly_nine_tenths_of_the_dataset_reads_it_whole(tmp_path):
    # 18 batches of 32: 576 samples an epoch, 0.9 of 640
    found = duplicate(tmp_path / "edge", LOADER, LOADER)
    assert found.saving == found.share == pytest.approx(0.5)
    assert found.evidence == (
        "the training DataLoader (Images, 640 samples, sampler RandomSampler) gives each of the 2 ranks 576 samples "
        "an epoch: the whole dataset"
    )
    assert duplicate(tmp_path / "under", *[{**LOADER, "batches_per_epoch": 17}] * 2) is None
    # a batch sampler (no batch size) or no count of batches: the samples an epoch are unknown, not the whole
    assert duplicate(tmp_path / "sampler", *[{**LOADER, "batch_size": None, "batches_per_epoch": 640}] * 2) is None
    assert duplicate(tmp_path / "uncounted", *[{**LOADER, "length": 32, "batches_per_epoch": None}] * 2) is None


def test_the_world_is_the_loaders_own_else_the_ranks_recorded(tmp_path):
    # this node's 2 ranks of a 4-rank world: each reads the whole dataset, an epoch in a quarter of the steps
    assert duplicate(tmp_path / "four", *[{**LOADER, "world": 4}] * 2).saving == pytest.approx(0.75)
    assert duplicate(tmp_path / "unknown", *[{**LOADER, "world": None}] * 2).saving == pytest.approx(0.5)


# -- preparing batches in the rank itself ------------------------------------------------------------------------


def test_data_preparation_at_exactly_fifteen_percent_with_no_core_to_spare(tmp_path):
    assert DATA_CPU_SHARE == 0.15
    # 75 ms of CPU in the loader of a 500 ms step
    rank = {"phases_s": {"data": 0.125, "forward": 0.25, "backward": 0.125}, "data_cpu_s": 0.075}
    found = data_preparation(evidence(tmp_path / "edge", [rank] * 2))
    assert found.share == found.saving == pytest.approx(0.15) and found.explains == {"data": pytest.approx(0.075)}
    # no trace and no loader recorded: the place is the DataLoader
    assert found.where == "the DataLoader" and found.remedy.endswith("the dataset's __getitem__")
    # a record without the cores or the threads: one of each, no core to spare
    older = evidence(tmp_path / "older", [rank] * 2, strip=("cpu_affinity", "threads"))
    assert data_preparation(older).share == pytest.approx(0.15)
    # 2 cores for a rank of 1 thread (the default when unrecorded): a worker could take it
    spare = evidence(tmp_path / "spare", [{**rank, "cpu_affinity": 2}] * 2, strip=("threads",))
    assert data_preparation(spare) is None
    busy = {**rank, "cpu_affinity": 2, "threads": 2}
    assert data_preparation(evidence(tmp_path / "busy", [busy] * 2)).share == pytest.approx(0.15)


def test_data_preparation_names_where_the_profiled_steps_prepared_the_batches(tmp_path):
    data = {
        "s": 0.1,
        "where": [
            ["data.py(30): __getitem__", 0.0625],
            ["data.py(41): augment", 0.025],
            ["train.py(9): <module>", 0.01],
        ],
        "what": [["PIL/Image.py(900): convert", 0.05], ["aten::copy_", 0.03], ["aten::stack", 0.01]],
    }
    rank = {
        "phases_s": {"data": 0.125, "forward": 0.25, "backward": 0.125},
        "data_cpu_s": 0.075,
        "loaders": [{**LOADER, "dataset_code": "data.py:12"}],
        "trace": {"steps": 2, "phases": {"data": data}},
    }
    found = data_preparation(evidence(tmp_path / "traced", [rank] * 2))
    assert found.evidence == (
        "step 500 ms: 75.0 ms of CPU a step inside the DataLoader (Images, 0 workers); every core runs a rank; in "
        "the profiled steps it went to data.py(30): __getitem__, data.py(41): augment (PIL/Image.py(900): convert, "
        "aten::copy_)"
    )
    assert found.where == "data.py(30): __getitem__" and found.remedy.endswith("the dataset's code: data.py:12")
    # untraced: the dataset's code is the place
    untraced = {k: v for k, v in rank.items() if k != "trace"}
    assert data_preparation(evidence(tmp_path / "untraced", [untraced] * 2)).where == "data.py:12"


def test_a_recompute_under_five_percent_of_the_step_is_not_needless_however_roomy_the_memory(tmp_path):
    roomy = {"peak_memory_bytes": 2**30, "memory_limit_bytes": 16 * 2**30, "recomputes_per_step": 8}
    small = {"phases_s": {"forward": 0.25, "backward": 0.23, "recompute": 0.02}, **roomy}  # 20 of 500 ms: 4 %
    assert needless_recompute(evidence(tmp_path / "small", [small] * 2)) is None
    large = {"phases_s": {"forward": 0.25, "backward": 0.2, "recompute": 0.05}, **roomy}  # 10 %
    assert needless_recompute(evidence(tmp_path / "large", [large] * 2)).saving == pytest.approx(0.1)


def test_needless_recompute_at_exactly_its_lines_named_by_the_module_it_runs_again(tmp_path):
    # 25 ms of recompute in a 500 ms step: exactly 5 %; 2 of the 16 GiB a rank may hold
    memory = {"peak_memory_bytes": 2 * 2**30, "memory_limit_bytes": 16 * 2**30, "recomputes_per_step": 8}
    rank = {"phases_s": {"forward": 0.25, "backward": 0.225, "recompute": 0.025}, **memory}
    found = needless_recompute(evidence(tmp_path / "edge", [rank] * 2))
    assert found.share == found.saving == pytest.approx(0.05) and found.where == "torch.utils.checkpoint"
    # the recompute's module (the checkpointed block) is named over the code it ran
    recompute = {"s": 0.025, "module": [["Block (model.py:8)", 0.02]], "where": [["model.py(30): forward", 0.02]]}
    traced = {**rank, "trace": {"steps": 2, "phases": {"recompute": recompute}}}
    found = needless_recompute(evidence(tmp_path / "traced", [traced] * 2))
    assert found.where == "Block (model.py:8)" and found.evidence.endswith("; recomputed in Block (model.py:8)")
    by_code = {**rank, "trace": {"steps": 2, "phases": {"recompute": {**recompute, "module": []}}}}
    assert needless_recompute(evidence(tmp_path / "code", [by_code] * 2)).where == "model.py(30): forward"
    # at exactly half the memory a rank may hold, checkpointing may be what keeps it there
    half = {**rank, "peak_memory_bytes": 8 * 2**30}
    assert needless_recompute(evidence(tmp_path / "half", [half] * 2)) is None
    # one rank's peak unknown: no claim of room to spare
    unknown = [rank, {**rank, "peak_memory_bytes": None}]
    assert needless_recompute(evidence(tmp_path / "unknown", unknown)) is None


def test_a_float64_ratio_under_1_accounts_for_none_of_forward_and_backward(tmp_path):
    # layers measured faster in float64 (noise on tiny layers): no time of theirs is explained, none negative,
    # which the ledger would add back to the model's excess over its layers
    rank = {"phases_s": F64_PHASES, "float64_penalty": 0.5, "param_dtypes": {"float64": 1000}}
    found = float64(evidence(tmp_path / "fast", [rank] * 2))
    assert found.explains == {"forward": 0.0, "backward": 0.0}, found.explains


NEEDLESS = {"forward": 0.04, "backward": 0.08, "comm": 0.04, "other": 0.04}  # a 200 ms step
# the link as the profiled steps saw it: 1 ms more per MiB from 1 to 2 MiB, 2**20 / 0.001 bytes a second
LINK = {"trace": {"steps": 2, "phases": {}, "link": [[2**20, 0.002], [2**21, 0.003]]}}


def test_gradients_no_optimizer_holds_are_priced_by_their_layers_backward_and_their_bytes_on_the_link(tmp_path):
    # 3 of the 4 MiB of gradients are in no optimizer: their layers' backward 50 ms, their 3 MiB on the link 3 ms
    # (under 3/4 of the 40 ms exposed); 53 ms of 200, up to 1.36x
    held = {"needless_grad_params": 12, "needless_grad_bytes": 3 * 2**20, "graded_bytes": 4 * 2**20, **LINK}
    found = findings(probed_run(tmp_path / "frozen", [step(NEEDLESS, needless_backward_s=0.05, **held)] * 2))
    found = found["needless_gradients"]
    assert found["saving"] == pytest.approx(0.265) and found["bound"]
    assert found["explains"] == {"backward": pytest.approx(0.05), "comm": pytest.approx(0.003)}
    assert "12 parameters (3.0 MiB, 75% of the gradients)" in found["evidence"], found["evidence"]
    assert found["predicted_gain"].startswith("up to 1.36x")
    # a slow link: 3 MiB would take 300 ms, more than their share of what is exposed, 30 ms: 80 ms of 200
    slow = {**held, "trace": {"steps": 2, "phases": {}, "link": [[2**20, 0.2], [2**21, 0.3]]}}
    capped = findings(probed_run(tmp_path / "slow", [step(NEEDLESS, needless_backward_s=0.05, **slow)] * 2))
    assert capped["needless_gradients"]["saving"] == pytest.approx(0.4)
    # no link measured: the backward alone; timed above the whole backward's 80 ms, it counts no more than that
    unlinked = {k: v for k, v in held.items() if k != "trace"}
    over = findings(probed_run(tmp_path / "over", [step(NEEDLESS, needless_backward_s=0.1, **unlinked)] * 2))
    assert over["needless_gradients"]["saving"] == pytest.approx(0.4)
    # 5.5 ms of backward more is 5.25 % of the step (1 MiB on the link: 1 ms), 4.5 ms is 4.75 %
    few = {"needless_grad_params": 1, "needless_grad_bytes": 2**20, "graded_bytes": 8 * 2**20, **LINK}
    named = findings(probed_run(tmp_path / "named", [step(NEEDLESS, needless_backward_s=0.0095, **few)] * 2))
    assert named["needless_gradients"]["saving"] == pytest.approx(0.0525)
    under = findings(probed_run(tmp_path / "under", [step(NEEDLESS, needless_backward_s=0.0085, **few)] * 2))
    assert "needless_gradients" not in under
    # no layer holding only those parameters ran alone: nothing to price
    untimed = findings(probed_run(tmp_path / "untimed", [step(NEEDLESS, needless_backward_s=None, **held)] * 2))
    assert "needless_gradients" not in untimed


def test_the_steps_that_began_an_epoch_are_named_with_the_loaders_workers_or_the_scripts_rebuild(tmp_path):
    # a 100 ms step of the run, 20 ms of it the epoch starts' own excess (3 starts in 90 steady steps: 600 ms each),
    # 5 ms of it waiting for data and 15 ms the script's own code; the training loader's 2 workers not persistent
    loader = {**LOADER, "workers": 2, "persistent_workers": False}
    rank = step(
        {"forward": 0.04, "backward": 0.04, "data": 0.005, "other": 0.015},
        epoch_starts=3,
        epoch_start_excess_s=0.02,
        epoch_start_phases_s={"data": 0.005, "other": 0.015},
        loaders=[loader],
    )
    found = findings(probed_run(tmp_path / "workers", [rank] * 2))["epoch_start"]
    assert found["finding"] == "each epoch's start costs 600 ms beyond a plain step: 20% of the run's step time"
    assert found["saving"] == pytest.approx(0.2) and found["predicted_gain"].startswith("1.25x")
    assert "persistent_workers=True" in found["remedy"] and found["explains"] == {
        "data": pytest.approx(0.005),
        "other": pytest.approx(0.015),
    }
    assert found["where"] == "the DataLoader's workers (persistent_workers=False)"
    # one worker started again is a restart too
    one = {**rank, "loaders": [{**loader, "workers": 1}]}
    assert "persistent_workers=True" in findings(probed_run(tmp_path / "one", [one] * 2))["epoch_start"]["remedy"]
    # persistent workers, none, or a count not recorded: the script builds its loader again
    for case, kept_loader in {
        "kept": {**loader, "persistent_workers": True},
        "none": {**loader, "workers": 0},
        "unrecorded": {**loader, "workers": None},
    }.items():
        again = findings(probed_run(tmp_path / case, [{**rank, "loaders": [kept_loader]}] * 2))["epoch_start"]
        assert "outside the epoch loop" in again["remedy"] and again["where"] == "between epochs", case
    # a rank that recorded no epoch start, or none of its phases there, spent nothing there: the least is 0
    quiet = {k: v for k, v in rank.items() if k not in ("epoch_starts", "epoch_start_phases_s")}
    assert "epoch_start" not in findings(probed_run(tmp_path / "quiet", [rank, quiet]))
    unphased = {k: v for k, v in rank.items() if k != "epoch_start_phases_s"}
    assert "epoch_start" not in findings(probed_run(tmp_path / "unphased", [rank, unphased]))
    # 6.25 ms of a 125 ms step is 5 %: named; 6.1 ms is not
    phases = {"forward": 0.0625, "backward": 0.03125, "other": 0.03125}
    edge = {**rank, "phases_s": phases, "epoch_start_excess_s": 0.00625, "epoch_start_phases_s": {"other": 0.00625}}
    assert "epoch_start" in findings(probed_run(tmp_path / "edge", [edge] * 2))
    under = {**edge, "epoch_start_phases_s": {"other": 0.0061}}
    assert "epoch_start" not in findings(probed_run(tmp_path / "under", [under] * 2))
    # a rank that waits at each epoch's start for the other (its data and other 20 ms over, the other's 1 ms): the
    # wait is the other rank's doing, not work between epochs; the least of the ranks' own, 1 ms, is under the line
    waiting = {**rank, "epoch_start_phases_s": {"data": 0.0, "other": 0.001}}
    assert "epoch_start" not in findings(probed_run(tmp_path / "waiting", [rank, waiting]))


def test_recompilation_quotes_its_graph_breaks_and_explains_forward_up_to_its_time(tmp_path):
    # 0.5 compilations and 25 ms compiling a step of 250 ms (10 %), the forward 100 ms: it accounts for 25 ms of it
    phases = {"forward": 0.1, "backward": 0.125, "other": 0.025}
    rank = step(phases, compiles_per_step=0.5, compile_s_per_step=0.025, graph_breaks=3, compiled_frames=7)
    found = findings(probed_run(tmp_path / "re", [rank, {**rank, "graph_breaks": 1, "compiled_frames": 2}]))
    found = found["recompilation"]
    assert "(7 frames compiled in all, 3 graph breaks)" in found["evidence"], found["evidence"]
    assert found["where"] == "torch.compile (TORCH_LOGS=recompiles)"
    assert found["share"] == found["saving"] == pytest.approx(0.1)
    assert found["explains"] == {"forward": pytest.approx(0.025)}
    # compiling longer than the forward: no more than the forward is explained
    long = step({"forward": 0.01, "backward": 0.1, "other": 0.14}, compiles_per_step=1, compile_s_per_step=0.05)
    assert findings(probed_run(tmp_path / "long", [long] * 2))["recompilation"]["explains"] == {
        "forward": pytest.approx(0.01)
    }
    # exactly 5 % of the step (binary fractions: 1/32 of 5/8 s) is named; none compiled (0 a step) is not, however
    # long the step's compile time reads
    edge = step({"forward": 0.5, "other": 0.125}, compiles_per_step=0.25, compile_s_per_step=0.03125)
    assert "recompilation" in findings(probed_run(tmp_path / "edge", [edge] * 2))
    none = {**edge, "compiles_per_step": 0}
    assert "recompilation" not in findings(probed_run(tmp_path / "none", [none] * 2))


def test_needless_gradients_name_the_first_ranks_count_where_and_the_line_of_five_percent(tmp_path):
    # rank 0 counts 12 such parameters and rank 1 13 (their layers differ in nothing here but the count quoted)
    held = {"needless_grad_params": 12, "needless_grad_bytes": 3 * 2**20, "graded_bytes": 4 * 2**20, **LINK}
    ranks = [step(NEEDLESS, needless_backward_s=0.05, **held), step(NEEDLESS, needless_backward_s=0.05, **held)]
    ranks[1]["needless_grad_params"] = 13
    found = findings(probed_run(tmp_path / "two", ranks))["needless_gradients"]
    assert "; 12 parameters (3.0 MiB" in found["evidence"] and found["where"] == (
        "parameters with requires_grad=True in no optimizer"
    )
    # no count of every graded byte: the needless bytes are all of them (a share of 1), the link's 3 ms stands
    bare = {k: v for k, v in held.items() if k != "graded_bytes"}
    alone = findings(probed_run(tmp_path / "bare", [step(NEEDLESS, needless_backward_s=0.05, **bare)] * 2))
    assert alone["needless_gradients"]["saving"] == pytest.approx(0.265)
    assert "100% of the gradients" in alone["needless_gradients"]["evidence"]
    # exactly 5 %: 10 ms of a 200 ms step (1 MiB on the link: 1 ms, backward 9 ms, in binary-exact halves)
    few = {"needless_grad_params": 1, "needless_grad_bytes": 2**20, "graded_bytes": 8 * 2**20, **LINK}
    phases = {"forward": 0.0625, "backward": 0.0625, "comm": 0.0625, "other": 0.0625}  # a 250 ms step
    exact = step(phases, needless_backward_s=0.0125 - 2**20 / (2**20 / 0.001), **few)
    assert findings(probed_run(tmp_path / "exact", [exact] * 2))["needless_gradients"]["saving"] == pytest.approx(0.05)
