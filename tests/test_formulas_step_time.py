"""The planner's step-time model and its calibration, pinned exactly (issue #25).

The accuracy of the model against real runs is a benchmark (benchmarks/planner_step_time.py,
docs/planner.md): its verdict rests on this machine's timing noise. Here every term is checked on
hand-computed cases with round numbers, so a change to any term (fixed cost, per-rank overhead,
efficiency per rank count, the collectives, overlap, the optimizer's traffic, the pipeline's slots)
changes an expected value. The arithmetic is written out in the comments; no figure was copied
from the code's output.
"""

from dataclasses import replace

import pytest

from paratrain.errors import UsageError
from paratrain.plan import calibrate
from paratrain.plan.calibrate import _compute_line, _cost_line
from paratrain.plan.devices import Device
from paratrain.plan.links import GlooLinks, Link
from paratrain.plan.memory import Layout
from paratrain.plan.profile import ModelProfile, TensorParallelProfile
from paratrain.plan.step_time import (
    Efficiency,
    LayoutCost,
    Topology,
    allgather_s,
    allreduce_s,
    bubble_fraction,
    layout_key,
    ring_allgather_s,
    ring_allreduce_s,
    step_time,
)
from paratrain.runs.records import Summary

# 1e8 B/s, 0.1 ms a ring step, 1 ms a collective; across nodes 1e7 B/s, 1 ms a step, 10 ms a collective.
INTRA = Link("intra", 1e8, 1e-4, "test", base_latency=1e-3)
INTER = Link("inter", 1e7, 1e-3, "test", base_latency=1e-2)
TWO_PER_NODE = Topology(per_node=2, intra=INTRA, inter=INTER)
FOUR_PER_NODE = Topology(per_node=4, intra=INTRA, inter=INTER)


def device(overlap: bool) -> Device:
    # 1 GFLOP/s peak, 1 GB/s of memory bandwidth.
    return Device("test", {"fp32": 1e9}, 1e10, 1e9, "intra", {"fp32": 0.5}, overlap=overlap)


# each pipeline unit saving as much for backward as the others (what a stage's activations are a share of)
SAVED_ALIKE = dict(saved_bytes_per_sample=1e3, input_saved_bytes_per_sample=0)


def profile(param_bytes: float = 4e6) -> ModelProfile:
    # Four pipeline units of 1 MFLOP a sample each; the second's output is what a 2-stage cut hands on.
    units = [
        dict(name=f"u{i}", param_bytes=p, flops_per_sample=1e6, output_bytes_per_sample=o, **SAVED_ALIKE)
        for i, (p, o) in enumerate([(1e6, 100), (2e6, 5e5), (5e5, 300), (5e5, 400)])
    ]
    # one FSDP unit holding every parameter and FLOP, beside an empty root: three whole-model collectives a step
    # with resharding (test_fsdp_units_... below prices four units of their own)
    return ModelProfile(
        "toy",
        int(param_bytes / 4),
        int(param_bytes),
        10,
        0,
        int(1e6),
        0.0,
        0.0,
        int(1e6),
        units,
        fsdp_units=((0.0, 0.0), (param_bytes, 1.0)),
    )


# Efficiency per rank count: 0.5 on one rank, 0.4 on two or more; fixed compute 1 ms and 3 ms a
# step; overhead 2 ms and 5 ms a step.
EFF = Efficiency(
    compute=0.9,
    overhead_s=0.1,
    by_devices=((1, 0.5), (2, 0.4)),
    fixed_by_devices=((1, 1e-3), (2, 3e-3)),
    overhead_by_devices=((1, 2e-3), (2, 5e-3)),
)


def whole(strategy: str, devices: int, batch: int = 100, reshard: bool = True) -> Layout:
    return Layout(strategy, devices, devices, 1, 1, batch, reshard_after_forward=reshard)


def test_ring_collectives_on_hand_computed_cases():
    # all-reduce of 4 MB on 2 ranks: 1 ms + 2(1)(0.1 ms) + 2(1)/2 x 4e6/1e8 = 1 + 0.2 + 40 ms
    assert ring_allreduce_s(4e6, 2, INTRA) == pytest.approx(0.0412, rel=1e-12)
    # on 4 ranks: 1 ms + 6 x 0.1 ms + 6/4 x 40 ms = 1 + 0.6 + 60 ms
    assert ring_allreduce_s(4e6, 4, INTRA) == pytest.approx(0.0616, rel=1e-12)
    # all-gather of 4 MB in all on 2 ranks: 1 ms + 0.1 ms + 1/2 x 40 ms; on 4: 1 + 0.3 + 30 ms
    assert ring_allgather_s(4e6, 2, INTRA) == pytest.approx(0.0211, rel=1e-12)
    assert ring_allgather_s(4e6, 4, INTRA) == pytest.approx(0.0313, rel=1e-12)
    # one rank, or nothing to send: free (not even the base latency)
    assert ring_allreduce_s(4e6, 1, INTRA) == ring_allgather_s(4e6, 1, INTRA) == 0.0
    assert ring_allreduce_s(0, 2, INTRA) == ring_allgather_s(0, 2, INTRA) == 0.0


def test_hierarchical_collectives_across_nodes():
    # one node holds all 4 ranks: the plain ring
    assert allreduce_s(4e6, 4, 4, FOUR_PER_NODE) == pytest.approx(0.0616, rel=1e-12)
    # 4 ranks, 2 a node: reduce-scatter + all-gather in the node (2 x 21.1 ms), all-reduce of the
    # node's half (2 MB) across 2 nodes: 10 ms + 2 x 1 ms + 2e6/1e7 = 212 ms
    assert allreduce_s(4e6, 4, 2, TWO_PER_NODE) == pytest.approx(2 * 0.0211 + 0.212, rel=1e-12)
    # all-gather: 21.1 ms in the node + all-gather of 2 MB across 2 nodes: 10 + 1 + 1/2 x 200 ms
    assert allgather_s(4e6, 4, 2, TWO_PER_NODE) == pytest.approx(0.0211 + 0.111, rel=1e-12)
    # 3 ranks at 2 a node need 2 nodes (rounded up), the same as 4
    assert allreduce_s(4e6, 3, 2, TWO_PER_NODE) == pytest.approx(2 * 0.0211 + 0.212, rel=1e-12)
    assert allgather_s(4e6, 2, 2, TWO_PER_NODE) == pytest.approx(0.0211, rel=1e-12)


def test_efficiency_takes_the_largest_measured_count_at_most_n():
    eff = Efficiency(
        compute=0.9,
        overhead_s=0.1,
        by_devices=((2, 0.4), (8, 0.3)),
        fixed_by_devices=((2, 3e-3),),
        overhead_by_devices=((2, 5e-3), (4, 7e-3)),
    )
    assert [eff.compute_for(n) for n in (1, 2, 7, 8, 64)] == [0.9, 0.4, 0.4, 0.3, 0.3]
    assert [eff.fixed_compute_s(n) for n in (1, 2, 3)] == [0.0, 3e-3, 3e-3]
    assert [eff.overhead_for(n) for n in (1, 2, 3, 4, 5)] == [0.1, 5e-3, 5e-3, 7e-3, 7e-3]


def test_one_device_step():
    t = step_time(profile(), whole("single", 1), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # compute: 1 ms fixed + 1e6 FLOPs x 100 / (1e9 x 0.5) = 201 ms; SGD: 5 x 4e6 B / 1e9 B/s = 20 ms;
    # overhead 2 ms (the one-rank figure)
    assert t["compute_s"] == pytest.approx(0.201, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.020, rel=1e-12)
    assert t["overhead_s"] == 2e-3
    assert t["comm_s"] == t["exposed_comm_s"] == 0.0
    assert t["step_time_s"] == pytest.approx(0.223, rel=1e-12)
    # Adam moves 7 bytes per parameter byte: 28 ms
    adam = step_time(profile(), whole("single", 1), device(False), "fp32", "adam", TWO_PER_NODE, EFF)
    assert adam["optimizer_s"] == pytest.approx(0.028, rel=1e-12)


def test_ddp_on_cpu_ranks_exposes_the_whole_all_reduce():
    t = step_time(profile(), whole("ddp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # compute on 2 ranks: 3 ms + 1e8 / (1e9 x 0.4) = 253 ms; all-reduce 41.2 ms, all exposed;
    # SGD 20 ms (every rank steps all parameters); overhead 5 ms (the two-rank figure)
    assert t["compute_s"] == pytest.approx(0.253, rel=1e-12)
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(0.0412, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.020, rel=1e-12)
    assert t["step_time_s"] == pytest.approx(0.253 + 0.0412 + 0.020 + 0.005, rel=1e-12)


def test_ddp_overlap_hides_each_bucket_behind_the_backward_after_it_fills():
    big = profile(param_bytes=1e8)  # 100 MB of gradients
    # DDP's buckets: 1 MiB first, then 3 of 25 MiB (78,643,200 B), the last 20,308,224 B; each all-reduce on 2
    # ranks of a node 1 ms + 0.2 ms + its bytes / 1e8: 5 x 1.2 ms + 1 s in all
    full, last = 1.2e-3 + 25 * 2**20 / 1e8, 1.2e-3 + 20_308_224 / 1e8
    # batch 2000: backward = 2/3 x (3 ms + 5 s) = 3.335 s, a full bucket filling every 0.87 s and taking 0.26 s:
    # only the last, which fills as backward ends, is exposed
    slow = step_time(big, whole("ddp", 2, batch=2000), device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert slow["comm_s"] == pytest.approx(5 * 1.2e-3 + 1.0, rel=1e-12)
    assert slow["exposed_comm_s"] == pytest.approx(last, rel=1e-12)
    # batch 100: backward = 2/3 x 253 ms; the first full bucket fills after (1 MiB + 25 MiB) / 1e8 of it, and from
    # then on the link is never idle: the three full buckets and the last run back to back, past backward's end
    fast = step_time(big, whole("ddp", 2), device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    backward = 2 / 3 * 0.253
    first_full_filled = backward * (2**20 + 25 * 2**20) / 1e8
    assert fast["exposed_comm_s"] == pytest.approx(first_full_filled + 3 * full + last - backward, rel=1e-12)


def test_only_the_parameters_that_train_are_all_reduced_and_stepped():
    # a quarter of the 4 MB trains: DDP all-reduces 1 MB on 2 ranks, 1 ms + 0.2 ms + 1e6/1e8 = 11.2 ms, all
    # exposed; SGD moves 5 x 1 MB: 5 ms; zero1 broadcasts the 1 MB updated, 1 ms + 0.1 ms + 5 ms, steps 0.5 MB
    frozen = replace(profile(), trainable_share=0.25)
    t = step_time(frozen, whole("ddp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(0.0112, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.005, rel=1e-12)
    z = step_time(frozen, whole("zero1", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert z["comm_s"] == pytest.approx(0.0112 + 0.0061, rel=1e-12)
    assert z["optimizer_s"] == pytest.approx(0.0025, rel=1e-12)


def test_zero1_adds_an_exposed_parameter_broadcast_and_shards_the_optimizer():
    t = step_time(profile(), whole("zero1", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # all-reduce 41.2 ms + all-gather of the parameters 21.1 ms; SGD on half: 10 ms
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(0.0623, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.010, rel=1e-12)
    assert t["step_time_s"] == pytest.approx(0.253 + 0.0623 + 0.010 + 0.005, rel=1e-12)
    on_gpu = step_time(profile(), whole("zero1", 2), device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    # the 4 MB in two buckets: 1 MiB, hidden, and the last 2,951,424 B, 1.2 ms + 29.51424 ms, all-reduced once
    # backward ends; the broadcast after the step, exposed too
    assert on_gpu["comm_s"] == pytest.approx(2 * 1.2e-3 + 0.04 + 0.0211, rel=1e-12)
    assert on_gpu["exposed_comm_s"] == pytest.approx(1.2e-3 + 0.02951424 + 0.0211, rel=1e-12)


def test_fsdp_gathers_twice_with_resharding_and_a_single_unit_hides_nothing():
    reshard = step_time(profile(), whole("fsdp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # reduce-scatter + two all-gathers, 21.1 ms each; SGD on half the parameters: 10 ms
    assert reshard["comm_s"] == reshard["exposed_comm_s"] == pytest.approx(3 * 0.0211, rel=1e-12)
    assert reshard["optimizer_s"] == pytest.approx(0.010, rel=1e-12)
    assert reshard["step_time_s"] == pytest.approx(0.253 + 3 * 0.0211 + 0.010 + 0.005, rel=1e-12)
    kept = step_time(profile(), whole("fsdp", 2, reshard=False), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert kept["comm_s"] == pytest.approx(2 * 0.0211, rel=1e-12)
    overlapped = step_time(profile(), whole("fsdp", 2), device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    # one unit: its forward waits for its gather, its backward for the gather again, and the reduce-scatter
    # comes after the last of the compute: nothing runs beside any of them
    assert overlapped["comm_s"] == pytest.approx(3 * 0.0211, rel=1e-12)
    assert overlapped["exposed_comm_s"] == pytest.approx(3 * 0.0211, rel=1e-12)


def four_units() -> ModelProfile:
    """The toy as FSDP wraps it: the root (1 MB) and three units (2, 0.5 and 0.5 MB), a quarter of the FLOPs
    each."""
    return replace(profile(), fsdp_units=((1e6, 0.25), (2e6, 0.25), (5e5, 0.25), (5e5, 0.25)))


# Collectives of 2 ranks in a node of TWO_PER_NODE, 1 ms + 0.1 ms + bytes / 2e8 each: the root's 1 MB 6.1 ms, the
# first unit's 2 MB 11.1 ms, the others' 0.5 MB 3.6 ms. At batch 100 the compute is 253 ms: a unit's forward
# 253 / 12 ms, its backward 253 / 6 ms.
ROOT, FIRST, SMALL = 0.0061, 0.0111, 0.0036
FORWARD, BACKWARD = 0.253 / 12, 0.253 / 6


def test_fsdp_units_hide_their_collectives_behind_the_compute_beside_them():
    reshard = step_time(four_units(), whole("fsdp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # CPU ranks: every collective exposed; the root gathered once (FSDP2 keeps it to its backward), the units
    # twice; each reduce-scattered once
    assert (
        reshard["comm_s"] == reshard["exposed_comm_s"] == pytest.approx(2 * ROOT + 3 * FIRST + 2 * 3 * SMALL, rel=1e-12)
    )
    kept = step_time(four_units(), whole("fsdp", 2, reshard=False), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert kept["comm_s"] == pytest.approx(2 * ROOT + 2 * FIRST + 2 * 2 * SMALL, rel=1e-12)
    # on GPUs: the root's gather and the first unit's, with nothing before them to hide them (the root computes
    # after the units: its head); in backward each unit's gather and reduce-scatter run beside another unit's
    # backward, 42 ms, but the first unit's reduce-scatter and the root's come after the last compute
    gpu = step_time(four_units(), whole("fsdp", 2), device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert gpu["exposed_comm_s"] == pytest.approx(ROOT + FIRST + FIRST + ROOT, rel=1e-12)
    # at 10 samples a rank the compute is 3 ms + 25 ms: each unit's forward 28 / 12 ms, shorter than a gather
    small = step_time(four_units(), whole("fsdp", 2, batch=10), device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert small["exposed_comm_s"] > 10 * gpu["exposed_comm_s"] * (28 / 253)


def test_a_calibrated_layout_cost_is_added_to_its_layouts_overhead_only():
    # fsdp's measured 30 ms a step + 0.1 ms a sample (whole("fsdp", 2): 100 samples a rank) on top of the 5 ms
    costs = (LayoutCost("fsdp", 2, 0.03, 1e-4), LayoutCost("hsdp", 2, 1.0, 0.0))
    calibrated = replace(EFF, layout_costs=costs)
    plain = step_time(profile(), whole("fsdp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    t = step_time(profile(), whole("fsdp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, calibrated)
    assert t["overhead_s"] == pytest.approx(0.005 + 0.03 + 0.01, rel=1e-12)
    assert t["step_time_s"] == pytest.approx(plain["step_time_s"] + 0.04, rel=1e-12)
    ddp = step_time(profile(), whole("ddp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, calibrated)
    assert ddp["overhead_s"] == pytest.approx(0.005, rel=1e-12)


def test_hsdp_collects_over_its_shard_group_and_all_reduces_its_shard_across_replicas():
    """--dp-replicate 2 --dp-shard 2 (torch's HSDP): fsdp's collectives over the 2 ranks of a shard group, then
    the all-reduce of each rank's half of the gradients between the 2 replicas."""
    hsdp = Layout("fsdp", 4, 4, 1, 1, 100, shard=2)
    t = step_time(profile(), hsdp, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # a shard group fills a node of 2: reduce-scatter and two gathers of 4 MB in it, 21.1 ms each; its replicas
    # are on two nodes: all-reduce of 2 MB across them, 10 ms + 2 x 1 ms + 2 x 1/2 x 2e6 / 1e7 = 212 ms; SGD on
    # half the parameters 10 ms
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(3 * 0.0211 + 0.212, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.010, rel=1e-12)
    assert t["step_time_s"] == pytest.approx(0.253 + 3 * 0.0211 + 0.212 + 0.010 + 0.005, rel=1e-12)
    # 4 a node: the replicas share it, 1 ms + 0.2 ms + 2e6 / 1e8 = 21.2 ms
    near = step_time(profile(), hsdp, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    assert near["comm_s"] == pytest.approx(3 * 0.0211 + 0.0212, rel=1e-12)
    # on GPUs, four units: each unit's reduce-scatter is followed by the all-reduce of its half across the two
    # nodes, 10 ms + 2 ms + its bytes / 2e7: 62 ms for the root, 112 ms for the first unit, 37 ms for the others.
    # The forward as without replicas (the root's gather, then the first unit's, 17.2 ms before the units'
    # four forwards); backward: the root's, then the last unit's, each hiding the gather prefetched beside it;
    # the last unit's scatter (40.6 ms) outlasts the middle unit's backward, so the first unit's prefetched gather
    # (11.1 ms) starts after it and the first unit waits for it; then its backward, its scatter (123.1 ms) and the
    # root's (68.1 ms)
    gpu = step_time(four_units(), hsdp, device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    start = 0.0172 + 4 * FORWARD + 2 * BACKWARD + 0.0406 + 0.0111  # the first unit's backward starts
    assert gpu["exposed_comm_s"] == pytest.approx(start + BACKWARD + 0.1231 + 0.0681 - 0.253, rel=1e-12)


def test_hsdp_of_split_layers_and_of_sharded_stages_adds_the_replicas_all_reduce():
    # fsdp+tp, 2 replicas of groups sharded 2 ways (8 ranks, 4 a node): the 13.6 ms of tensor parallel and the
    # 40.8 ms of fsdp over 2 ranks as on 4 ranks, and the rank's half of its 2.5 MB share, 1.25 MB, all-reduced
    # across replicas 4 ranks apart, on two nodes: 10 ms + 2 ms + 1.25e6 / 1e7 = 137 ms
    split = Layout("fsdp+tp", 8, 4, 1, 1, 50, shard=2, tp=2)
    t = step_time(split_profile(), split, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    assert t["comm_s"] == pytest.approx(0.0136 + 0.0408 + 0.137, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.00625, rel=1e-12)
    # pp+fsdp, 2 replicas of stages sharded 2 ways (8 ranks): the 4-rank layout's collectives and half the
    # heavier stage's 3 MB all-reduced between replicas on two nodes: 10 ms + 2 ms + 1.5e6 / 1e7 = 162 ms
    staged = step_time(
        profile(), Layout("pp+fsdp", 8, 4, 2, 4, 8, shard=2), device(False), "fp32", "sgd", FOUR_PER_NODE, EFF
    )
    alone = step_time(
        profile(), Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2), device(False), "fp32", "sgd", FOUR_PER_NODE, EFF
    )
    assert staged["comm_s"] - alone["comm_s"] == pytest.approx(0.162, rel=1e-9)
    assert staged["compute_s"] == alone["compute_s"] and staged["optimizer_s"] == alone["optimizer_s"]


def test_fsdp_in_bf16_gathers_half_the_bytes_and_reduce_scatters_float32():
    bf16 = Device("test", {"fp32": 1e9, "bf16": 1e9}, 1e10, 1e9, "intra", {"fp32": 0.5, "bf16": 0.5}, overlap=True)
    t = step_time(profile(), whole("fsdp", 2), bf16, "bf16", "sgd", TWO_PER_NODE, EFF)
    # two all-gathers of 2 MB (bf16): 1 ms + 0.1 ms + 1/2 x 2e6 / 1e8 = 11.1 ms each; the reduce-scatter
    # of the float32 gradients 21.1 ms
    assert t["comm_s"] == pytest.approx(2 * 0.0111 + 0.0211, rel=1e-12)
    # four units: gathers of half the bytes (root 3.6 ms, first unit 6.1 ms, the others 2.35 ms), float32
    # reduce-scatters as in fp32; exposed as in fp32, the root's and the first unit's gathers, the first unit's
    # and the root's reduce-scatters
    units = step_time(four_units(), whole("fsdp", 2), bf16, "bf16", "sgd", TWO_PER_NODE, EFF)
    assert units["comm_s"] == pytest.approx(0.0036 + ROOT + 2 * 0.0061 + FIRST + 2 * (2 * 0.00235 + SMALL), rel=1e-12)
    assert units["exposed_comm_s"] == pytest.approx(0.0036 + 0.0061 + FIRST + ROOT, rel=1e-12)


def test_one_rank_of_a_data_parallel_strategy_communicates_nothing():
    t = step_time(profile(), whole("ddp", 1), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert t["comm_s"] == t["exposed_comm_s"] == 0.0


def test_pipeline_slots_sends_and_the_heaviest_stage():
    layout = Layout("pipeline", 2, 1, 2, 4, 8)  # 2 stages, 4 micro-batches of 2
    cpu = step_time(profile(), layout, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # stages cut by FLOPs: units 0-1 and 2-3, 2 MFLOPs a sample each. A slot: 3 ms / 2 stages +
    # 2e6 x 2 / (1e9 x 0.4) = 1.5 + 10 ms; (M + K - 1) = 5 slots
    assert cpu["compute_s"] == pytest.approx(5 * 0.0115, rel=1e-12)
    # handed on: unit 1's 5e5 B a sample x 2 = 1 MB a hop: 1 ms + 0.1 ms + 10 ms. On CPU every slot
    # sends and receives: 2 x 5 hops
    assert cpu["comm_s"] == cpu["exposed_comm_s"] == pytest.approx(10 * 0.0111, rel=1e-12)
    # the heavier stage holds 1 + 2 MB: SGD 5 x 3e6 / 1e9
    assert cpu["optimizer_s"] == pytest.approx(0.015, rel=1e-12)
    assert cpu["step_time_s"] == pytest.approx(5 * 0.0115 + 10 * 0.0111 + 0.015 + 0.005, rel=1e-12)
    # where the device overlaps, only the fill and drain send: 2 (K - 1) hops
    gpu = step_time(profile(), layout, device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert gpu["exposed_comm_s"] == pytest.approx(2 * 0.0111, rel=1e-12)


def test_a_pipelines_slots_take_the_efficiency_calibrated_without_the_wait():
    eff = replace(EFF, without_waiting_by_devices=((1, 0.6, 0.0), (2, 0.5, 2e-3)))
    layout = Layout("pipeline", 2, 1, 2, 4, 8)  # 2 stages, 4 micro-batches of 2
    t = step_time(profile(), layout, device(False), "fp32", "sgd", TWO_PER_NODE, eff)
    # a slot: 2 ms / 2 stages + 2e6 x 2 / (1e9 x 0.5) = 1 + 8 ms (with the wait: 1.5 + 10 ms, above); 5 slots
    assert t["compute_s"] == pytest.approx(5 * 0.009, rel=1e-12)
    # a whole-step layout keeps the efficiency with the wait in
    ddp = whole("ddp", 2)
    assert step_time(profile(), ddp, device(False), "fp32", "sgd", TWO_PER_NODE, eff) == step_time(
        profile(), ddp, device(False), "fp32", "sgd", TWO_PER_NODE, EFF
    )


def test_hybrid_adds_the_stage_all_reduce_across_replicas():
    layout = Layout("hybrid", 4, 2, 2, 4, 8)  # 2 replicas of 2 stages
    t = step_time(profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # the heavier stage's 3 MB over 2 replicas in one node: 1 ms + 0.2 ms + 30 ms
    assert t["comm_s"] == pytest.approx(10 * 0.0111 + 0.0312, rel=1e-12)
    # replicas of a stage are 2 ranks apart: with 2 devices a node, each node holds one, so the
    # all-reduce crosses nodes: the hierarchical form with one rank a node is the inter-node ring
    across = step_time(profile(), layout, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # hop: K = 2 stages fit a node, so the intra link; the stage's all-reduce: 10 ms + 2 ms + 3e6/1e7
    assert across["comm_s"] == pytest.approx(10 * 0.0111 + 0.312, rel=1e-12)
    # a quarter of the model training: the stage's 0.75 MB of gradients, 1 ms + 0.2 ms + 7.5 ms
    frozen = step_time(
        replace(profile(), trainable_share=0.25), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF
    )
    assert frozen["comm_s"] == pytest.approx(10 * 0.0111 + 0.0087, rel=1e-12)


@pytest.mark.parametrize("stages,microbatches,expected", [(2, 4, 1 / 5), (4, 8, 3 / 11), (4, 1, 3 / 4), (8, 8, 7 / 15)])
def test_planner_bubble_is_k_minus_1_over_m_plus_k_minus_1(stages, microbatches, expected):
    assert bubble_fraction(stages, microbatches) == pytest.approx(expected, rel=1e-12)


def test_no_bubble_without_stages():
    assert bubble_fraction(1, 4) is None


# -- calibration ------------------------------------------------------------------------------


def run(
    workers: int,
    batch: int,
    compute: float,
    comm: float = 0.0,
    data: float = 0.0,
    other: float = 0.0,
    optimizer: float = 0.0,
    grad_accum: int = 1,
    name: str = "r",
    **fields,
) -> dict:
    """A summary.json of a run of a model of 1 MFLOP a sample on a 1 GFLOP/s device (`fields`: its strategy,
    its layout)."""
    return {
        **fields,
        "status": "completed",
        "workers": workers,
        "batch_size": batch,
        "grad_accum": grad_accum,
        "flops_per_sample": 1e6,
        "mfu_peak": {"per_device": 1e9},
        "run_dir": f"/runs/{name}",
        "breakdown": {"data_s": data, "compute_s": compute, "comm_s": comm, "optimizer_s": optimizer, "other_s": other},
    }


def flat(pairs) -> list:
    return [x for pair in pairs for x in pair]


def plan_says(summary: Summary) -> dict:
    # the uncalibrated plan: 5 ms of exposed communication on 2 ranks, 4 ms of optimizer traffic
    return {"exposed_comm_s": 5e-3 if summary.workers > 1 else 0.0, "optimizer_s": 4e-3}


def fit(summaries: list[dict], predicted) -> Efficiency:
    """calibrate.fit on these summary.json contents, read as the records `read_runs` gives it."""
    return calibrate.fit([Summary.model_validate(s) for s in summaries], lambda summary, _: predicted(summary))


def test_calibration_fits_efficiency_fixed_cost_and_overhead_per_rank_count():
    runs = [
        # one rank, one batch (100 samples: 0.1 s at the peak): busy 0.25, 0.2, 0.4 -> shares 0.4,
        # 0.5, 0.25, median 0.4. The comm_s of a one-rank run is not waiting: it is left out.
        run(1, 100, 0.25, comm=0.05, data=1e-3, other=2e-3, optimizer=0.010),  # overhead 3 + (10 - 4) = 9 ms
        run(1, 100, 0.20, data=2e-3, other=2e-3, optimizer=0.003),  # 4 + 0 (below the plan's) = 4 ms
        run(1, 100, 0.40, data=3e-3, other=3e-3, optimizer=0.006),  # 6 + 2 = 8 ms
        # two ranks, two batches 3x apart (0.1 s and, with 2 accumulated steps of 150, 0.3 s at the
        # peak); busy = compute + comm beyond the plan's 5 ms: 0.2 + 0.01, and 0.61 + 0 (its comm
        # is below the plan's): the line 0.01 + ideal / 0.5
        run(2, 100, 0.20, comm=0.015, other=1e-3),
        run(2, 150, 0.61, comm=0.004, other=3e-3, grad_accum=2),
    ]
    eff = fit(runs, plan_says)
    assert flat(eff.by_devices) == pytest.approx([1, 0.4, 2, 0.5], rel=1e-9)
    assert eff.fixed_by_devices[0] == (1, 0.0)
    assert eff.fixed_by_devices[1] == (2, pytest.approx(0.01, rel=1e-9))
    # overheads: median of 9, 4, 8 ms on one rank; of 1 and 3 ms on two
    assert flat(eff.overhead_by_devices) == pytest.approx([1, 8e-3, 2, 2e-3], rel=1e-9)
    assert eff.compute == pytest.approx(0.4) and eff.overhead_s == pytest.approx(8e-3)
    assert "0.400 on 1 rank(s)" in eff.source and "+ 10.00 ms a step" in eff.source
    # the whole sentence plan shows: a fixed cost on one count shows the others' too (0 ms), the
    # overheads in ms per count, the fits and the overheads each listed with ", "
    assert eff.source == (
        "calibrated from 5 run(s) measured here (r, r, r, r, r): compute efficiency "
        "0.400 on 1 rank(s) + 0.00 ms a step, 0.500 on 2 rank(s) + 10.00 ms a step of the peak "
        "(waiting for other ranks included; without it, a pipeline's stages: 0.496 on 2 rank(s)), per-step "
        "overhead 8.00 ms on 1 rank(s), 2.00 ms on 2 rank(s)"
    )
    # without the wait, the compute alone: one rank as above; two ranks through (0.1, 0.2) and (0.3, 0.61), slope
    # 2.05 and a fixed cost of -5 ms, no model: the median of 0.1 / 0.2 and 0.3 / 0.61
    assert eff.without_waiting_by_devices == (
        (1, pytest.approx(0.4, rel=1e-9), 0.0),
        (2, pytest.approx((0.5 + 0.3 / 0.61) / 2, rel=1e-9), 0.0),
    )


def test_calibration_from_one_batch_size_has_no_fixed_cost():
    eff = fit([run(1, 100, 0.25), run(2, 100, 0.20, comm=0.025)], plan_says)
    # 2 ranks: busy 0.2 + (25 - 5) ms = 0.22 -> 0.1 / 0.22
    assert flat(eff.by_devices) == pytest.approx([1, 0.4, 2, 0.1 / 0.22], rel=1e-9)
    assert eff.fixed_by_devices == ()
    # no fixed cost anywhere: none is shown
    assert eff.source == (
        "calibrated from 2 run(s) measured here (r, r): compute efficiency 0.400 on 1 rank(s), 0.455 on 2 rank(s) of "
        "the peak (waiting for other ranks included; without it, a pipeline's stages: 0.500 on 2 rank(s)), "
        "per-step overhead 0.00 ms on 1 rank(s), 0.00 ms on 2 rank(s)"
    )


def test_the_pipelines_efficiency_is_shown_for_every_count_above_one_and_only_then():
    # 4 ranks at two batches 3x apart, busy 0.25 and 0.65 s for 0.1 and 0.3 s at the peak: slope 2, fixed 50 ms
    runs = [run(1, 100, 0.25), run(2, 100, 0.20), run(4, 100, 0.25), run(4, 300, 0.65)]
    assert fit(runs, plan_says).source == (
        "calibrated from 4 run(s) measured here (r, r, r, r): compute efficiency 0.400 on 1 rank(s) + 0.00 ms a "
        "step, 0.500 on 2 rank(s) + 0.00 ms a step, 0.500 on 4 rank(s) + 50.00 ms a step of the peak (waiting for "
        "other ranks included; without it, a pipeline's stages: 0.500 on 2 rank(s), 0.500 on 4 rank(s) + 50.00 ms "
        "a step), per-step overhead 0.00 ms on 1 rank(s), 0.00 ms on 2 rank(s), 0.00 ms on 4 rank(s)"
    )
    # one rank alone has no other ranks to wait for: nothing to say for a pipeline
    assert fit([run(1, 100, 0.25)], plan_says).source == (
        "calibrated from 1 run(s) measured here (r): compute efficiency 0.400 on 1 rank(s) of the peak (waiting "
        "for other ranks included), per-step overhead 0.00 ms on 1 rank(s)"
    )


def test_a_run_read_from_no_directory_is_named_by_a_question_mark():
    unnamed = run(1, 100, 0.25)
    del unnamed["run_dir"]
    assert "measured here (?, r)" in fit([unnamed, run(1, 100, 0.25)], plan_says).source


def test_calibration_needs_a_measured_compute_time():
    with pytest.raises(UsageError, match="no run has a measured compute time"):
        fit([run(1, 100, 0.0)], plan_says)


def test_compute_line_by_least_squares_and_its_fallbacks():
    # two batches exactly 1.5x apart: the line through (2, 5) and (3, 7): slope 2, intercept 1
    assert _compute_line([(2.0, 5.0), (3.0, 7.0)]) == pytest.approx((0.5, 1.0), rel=1e-12)
    # three points: mean (2, 5), slope (2 + 0 + 3) / 2 = 2.5, intercept 5 - 5 = 0 (kept: not negative)
    assert _compute_line([(1.0, 3.0), (2.0, 4.0), (3.0, 8.0)]) == pytest.approx((0.4, 0.0), abs=1e-12)
    # under 1.5x apart: the median of ideal / busy, no fixed cost
    assert _compute_line([(2.0, 5.0), (2.9, 6.8)]) == pytest.approx(((2 / 5 + 2.9 / 6.8) / 2, 0.0), rel=1e-12)
    assert _compute_line([(1.0, 4.0), (1.0, 2.0), (1.0, 5.0)]) == pytest.approx((0.25, 0.0), rel=1e-12)
    # a negative fixed cost (slope 2.5 through (2, 3) and (4, 8): intercept -2) is no model: median
    assert _compute_line([(2.0, 3.0), (4.0, 8.0)]) == pytest.approx(((2 / 3 + 0.5) / 2, 0.0), rel=1e-12)
    # nor is a flat line: median of 0.4 and 0.8
    assert _compute_line([(2.0, 5.0), (4.0, 5.0)]) == pytest.approx((0.6, 0.0), rel=1e-12)


def test_compute_line_keeps_a_slope_below_one_and_any_point_order():
    # slope 0.5 (an efficiency above 1 is still a line with a positive slope), intercept 3 - 1 = 2
    assert _compute_line([(2.0, 3.0), (4.0, 4.0)]) == pytest.approx((2.0, 2.0), rel=1e-12)
    # three uneven points on busy = 1 + 2 x ideal
    assert _compute_line([(4.0, 9.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx((0.5, 1.0), rel=1e-12)


def test_compute_line_runs_through_each_batch_size_median():
    # repeats: one slow run of three at ideal 2 (9 against 5 and 5.2) leaves the line through (2, 5.2) and (4, 9):
    # slope 1.9, fixed 1.4; through every run it would be slope 1.3 and a fixed cost of 3.8, which a pipeline
    # pays in every slot's share
    assert _compute_line([(2.0, 5.0), (2.0, 9.0), (4.0, 9.0), (2.0, 5.2)]) == pytest.approx((1 / 1.9, 1.4), rel=1e-12)


def test_a_run_without_grad_accum_counts_its_batch_once_and_is_named():
    one = run(1, 100, 0.25, name="first")
    del one["grad_accum"]
    eff = fit([one, run(1, 200, 0.5, name="second")], plan_says)
    # ideal 0.1 s and 0.2 s, busy 0.25 and 0.5: slope 2.5, intercept 0 -> efficiency 0.4, no fixed cost
    assert flat(eff.by_devices) == pytest.approx([1, 0.4], rel=1e-9)
    assert eff.source.startswith(
        "calibrated from 2 run(s) measured here (first, second): compute efficiency 0.400 on 1 rank(s)"
    )


def plan_under(summary: Summary, eff: Efficiency) -> dict:
    """A plan whose step is 1 ms a sample at the efficiency (+ 5 ms of exposed communication on 2 ranks, 4 ms
    of optimizer), naming the layout by the run's strategy, tensor-parallel degree and pipeline."""
    tp, stages = (summary.layout or {}).get("tp", 1), (summary.layout or {}).get("pp", 1)
    exposed = 5e-3 if summary.workers > 1 else 0.0
    compute = 1e-3 * summary.batch_size * (summary.grad_accum or 1) / eff.compute_for(summary.workers)
    layout = summary.strategy + (f" (tp {tp})" if tp > 1 else "")
    if stages > 1:
        layout += f" ({stages} stages, {summary.pipeline['microbatches']} micro-batches)"
    return {"exposed_comm_s": exposed, "optimizer_s": 4e-3, "step_time_s": compute + exposed + 4e-3, "layout": layout}


def test_a_layouts_own_runs_fit_its_cost_beyond_the_plan_and_leave_the_efficiency_to_the_plain_runs():
    # ddp on 2 ranks: 100 samples at 0.1 s at the peak, busy 0.2 -> efficiency 0.5, the plan's step at it
    # 1e-3 x 100 / 0.5 + 5 + 4 ms = 0.209 s
    ddp = run(2, 100, 0.20, name="ddp", strategy="ddp")
    # fsdp at 50 and 100 samples (2x apart: a line): measured 50 ms + 0.4 ms a sample beyond the calibrated
    # plan's 1e-3 x samples / 0.5 + 9 ms. Its compute alone (0.3 s, 0.4 s) would have slowed the efficiency.
    fsdp = [
        run(2, batch, 0.002 * batch + 0.009 + 0.05 + 4e-4 * batch, name=f"fsdp{batch}", strategy="fsdp")
        for batch in (50, 100)
    ]
    # tp 2 at one batch (a median, no per-sample term): 30 ms beyond the plan's 0.1 + 9 ms, measured as comm
    tp = run(2, 50, 0.1, comm=0.009 + 0.03, name="tp", strategy="tp", layout={"tp": 2, "dp_shard": 1})
    eff = calibrate.fit([Summary.model_validate(s) for s in (ddp, *fsdp, tp)], plan_under)
    assert flat(eff.by_devices) == pytest.approx([2, 0.5], rel=1e-9)
    assert [(c.layout, c.devices) for c in eff.layout_costs] == [("fsdp", 2), ("tp (tp 2)", 2)]
    assert [c.fixed_s for c in eff.layout_costs] == pytest.approx([0.05, 0.03], rel=1e-9)
    assert [c.per_sample_s for c in eff.layout_costs] == pytest.approx([4e-4, 0.0], abs=1e-12)
    assert eff.layout_cost_s("fsdp", 2, 75) == pytest.approx(0.05 + 0.03, rel=1e-9)
    assert eff.source.startswith("calibrated from 1 run(s) measured here (ddp): compute efficiency 0.500")
    assert eff.source.endswith(
        "; beyond it, measured (fsdp50, fsdp100, tp): fsdp on 2 rank(s) +50.00 ms a step +0.400 ms a sample, "
        "tp (tp 2) on 2 rank(s) +30.00 ms a step"
    )
    # without plain runs, fsdp's runs are the efficiency's (as before layouts were calibrated apart)
    alone = calibrate.fit([Summary.model_validate(s) for s in fsdp], plan_under)
    assert alone.layout_costs == () and alone.compute_for(2) != pytest.approx(0.5)
    # a pipeline's run is never the efficiency's, whatever else there is: its step (bubble, sends) is its own
    # cost beyond the plan's for its stages and micro-batches; 2 stages of 4 micro-batches, 20 ms beyond
    staged = {"layout": {"pp": 2}, "pipeline": {"microbatches": 4}, "strategy": "pipeline"}
    pipe = run(2, 50, 0.1, comm=0.009 + 0.02, name="pipe", **staged)
    with_pipe = calibrate.fit([Summary.model_validate(s) for s in (*fsdp, pipe)], plan_under)
    assert with_pipe.compute_for(2) == pytest.approx(alone.compute_for(2), rel=1e-12)
    assert [c.layout for c in with_pipe.layout_costs] == ["pipeline (2 stages, 4 micro-batches)"]
    beside = calibrate.fit([Summary.model_validate(s) for s in (ddp, pipe)], plan_under)
    assert (beside.layout_costs[0].fixed_s, beside.layout_costs[0].per_sample_s) == pytest.approx((0.02, 0.0))


def test_a_layouts_cost_is_its_whole_step_beyond_the_plan_at_its_accumulated_samples():
    """The measured step is the breakdown's sum (data, compute, communication, optimizer, other); a replica's
    samples a step count its accumulated forwards (1 when the summary has no grad_accum); a run read from no
    directory is named by a question mark."""

    def fsdp(batch: int, accum: int | None) -> dict:
        samples = batch * (accum or 1)
        step = 0.002 * samples + 0.009 + 0.010 + 1e-4 * samples  # the plan's at 0.5, and 10 ms + 0.1 ms a sample
        summary = run(2, batch, step - 0.010, data=1e-3, comm=2e-3, optimizer=3e-3, other=4e-3, strategy="fsdp")
        if accum is None:
            del summary["grad_accum"], summary["run_dir"]
        else:
            summary["grad_accum"] = accum
        return summary

    runs = [run(2, 100, 0.20, name="ddp", strategy="ddp"), fsdp(25, 2), fsdp(200, None)]  # 50 and 200 samples
    eff = calibrate.fit([Summary.model_validate(s) for s in runs], plan_under)
    (cost,) = eff.layout_costs
    assert (cost.fixed_s, cost.per_sample_s) == pytest.approx((0.010, 1e-4), rel=1e-9)
    assert "beyond it, measured (r, ?)" in eff.source


def test_tensor_parallel_and_pipeline_runs_alone_cannot_calibrate():
    tp = run(2, 50, 0.1, strategy="tp", layout={"tp": 2})
    pipe = run(2, 50, 0.1, strategy="pipeline", layout={"pp": 2}, pipeline={"microbatches": 2})
    for alone in ([tp], [pipe], [tp, pipe]):
        with pytest.raises(UsageError, match="tensor-parallel and pipeline runs are calibrated against the plan of"):
            calibrate.fit([Summary.model_validate(s) for s in alone], plan_under)


def test_cost_line_by_least_squares_and_its_fallbacks():
    # 1.5x apart: the line through (2, 5) and (3, 7): 1 + 2 a sample
    assert _cost_line([(2.0, 5.0), (3.0, 7.0)]) == pytest.approx((1.0, 2.0), rel=1e-12)
    # a negative intercept is kept (the line holds where it was measured): (2, 1), (4, 5) -> -3 + 2 a sample
    assert _cost_line([(2.0, 1.0), (4.0, 5.0)]) == pytest.approx((-3.0, 2.0), rel=1e-12)
    # a cost that falls with the batch is no model of it: the median, as under 1.5x apart
    assert _cost_line([(2.0, 5.0), (4.0, 3.0)]) == pytest.approx((4.0, 0.0), rel=1e-12)
    assert _cost_line([(2.0, 5.0), (2.9, 7.0), (2.5, -1.0)]) == pytest.approx((5.0, 0.0), rel=1e-12)
    # repeats: the line runs through each batch's median, (2, 5.2) and (4, 9), whatever one slow run measured:
    # 1.9 a sample, 5.2 - 3.8 = 1.4 a step (least squares over the four runs: 1.3 a sample, 3.8 a step)
    assert _cost_line([(2.0, 5.0), (2.0, 9.0), (4.0, 9.0), (2.0, 5.2)]) == pytest.approx((1.4, 1.9), rel=1e-12)
    # a flat line is a line: through (2, 1), (3, 2), (4, 1) it is 4/3 a step (the median of all would be 1)
    assert _cost_line([(2.0, 1.0), (3.0, 2.0), (4.0, 1.0)]) == pytest.approx((4 / 3, 0.0), rel=1e-12)


def test_a_layout_cost_applies_to_its_own_layout_from_its_own_device_count():
    eff = Efficiency(
        1.0,
        layout_costs=(
            LayoutCost("fsdp", 4, 0.2, 0.0),
            LayoutCost("fsdp", 2, 0.1, 0.01),
            LayoutCost("tp (tp 2)", 2, 1, 0),
        ),
    )
    assert eff.layout_cost_s("fsdp", 2, 10) == pytest.approx(0.2)  # 0.1 + 0.01 x 10
    assert eff.layout_cost_s("fsdp", 3, 10) == pytest.approx(0.2)  # the largest count <= 3: 2's
    assert eff.layout_cost_s("fsdp", 64, 10) == pytest.approx(0.2)  # 4's: 0.2 whatever the batch
    assert eff.layout_cost_s("fsdp", 1, 10) == 0.0  # measured on 2 and 4 only
    assert eff.layout_cost_s("hsdp", 4, 10) == 0.0  # another layout's cost is not its


def test_layout_keys_tell_the_splits_apart():
    split = TensorParallelProfile(2, 0, 0, 0.0, 0.0, 0, 0.0, 0.5)
    assert layout_key(Layout("fsdp", 4, 4, 1, 1, 8, shard=2), None) == "hsdp"
    assert layout_key(Layout("tp", 2, 1, 1, 1, 8, tp=2), split) == "tp (tp 2)"
    sequence = replace(split, gather_scatters=4, loss_split=2)
    assert (
        layout_key(Layout("fsdp+tp", 4, 2, 1, 1, 8, tp=2), sequence)
        == "fsdp+tp (tp 2, sequence parallel, loss parallel)"
    )
    # pipelines by their stages and micro-batches, whatever their schedule (the plan has none)
    assert layout_key(Layout("pipeline", 2, 1, 2, 4, 8), None) == "pipeline (2 stages, 4 micro-batches)"
    assert layout_key(Layout("pipeline", 2, 1, 2, 4, 8, "gpipe"), None) == "pipeline (2 stages, 4 micro-batches)"
    assert layout_key(Layout("hybrid", 4, 2, 2, 8, 8), None) == "hybrid (2 stages, 8 micro-batches)"
    assert layout_key(Layout("pp+tp", 4, 1, 2, 4, 8, tp=2), split) == "pp+tp (tp 2, 2 stages, 4 micro-batches)"


@pytest.mark.parametrize(
    "change,why",
    [
        ({"status": "failed"}, "the run did not complete (status 'failed')"),
        ({"strategy": "model-parallel"}, "runs of strategy 'model-parallel' do not calibrate the plan"),
        ({"strategy": "async-ps"}, "runs of strategy 'async-ps' do not calibrate the plan"),
        ({"flops_per_sample": None}, "the run has no FLOPs per sample or device peak"),
        ({"mfu_peak": {}}, "the run has no FLOPs per sample or device peak"),
    ],
)
def test_runs_that_cannot_calibrate_say_why(change, why):
    from paratrain.plan.calibrate import _unusable

    summary = {**run(1, 100, 0.25), "status": "completed", "strategy": "ddp", **change}
    assert _unusable(Summary.model_validate(summary)).startswith(why)
    assert _unusable(Summary.model_validate({**run(1, 100, 0.25), "strategy": "zero1"})) == ""
    assert _unusable(Summary.model_validate({**run(2, 100, 0.25), "strategy": "tp"})) == ""
    for staged in ("pipeline", "hybrid"):
        assert _unusable(Summary.model_validate({**run(2, 100, 0.25), "strategy": staged})) == ""


def test_read_runs_keeps_usable_runs_in_order_and_refuses_the_rest(tmp_path):
    import json

    from paratrain.plan.calibrate import read_runs

    def write(name: str, config: bool = True, summary: dict | None = None):
        path = tmp_path / name
        path.mkdir()
        if config:
            (path / "config.json").write_text("{}")
        if summary is not None:
            (path / "summary.json").write_text(json.dumps(summary))
        return path

    good = {**run(1, 100, 0.25), "strategy": "ddp"}
    del good["run_dir"]
    first, second = write("first", summary=good), write("second", summary={**good, "workers": 2})
    runs = read_runs([first, second])
    # each summary as written, with the path it came from (the source's run names are its last part)
    read = [r.model_dump(exclude_unset=True, exclude_none=True) for r in runs]
    assert read == [{**good, "run_dir": str(first)}, {**good, "workers": 2, "run_dir": str(second)}]
    # a run directory needs both files: no summary (not finished), or no config (not a run)
    for bad in (write("no-summary"), write("no-config", config=False, summary=good)):
        with pytest.raises(UsageError, match=f"--calibrate {bad}: not a paratrain run directory"):
            read_runs([first, bad])
    failed = write("failed", summary={**good, "status": "failed"})
    with pytest.raises(UsageError, match=f"--calibrate {failed}: the run did not complete"):
        read_runs([first, failed])


def test_one_byte_is_still_a_collective_and_odd_rank_counts_round_up_to_nodes():
    # 1 ms + 0.2 ms + 1 B / 1e8: the latency terms, not zero
    assert ring_allreduce_s(1, 2, INTRA) == pytest.approx(1.2e-3 + 1e-8, rel=1e-12)
    assert ring_allgather_s(1, 2, INTRA) == pytest.approx(1.1e-3 + 0.5e-8, rel=1e-12)
    # 3 ranks at 2 a node: 2 nodes, not 1.5
    assert allgather_s(4e6, 3, 2, TWO_PER_NODE) == pytest.approx(0.0211 + 0.111, rel=1e-12)


def test_cpu_ddp_of_a_large_model_exposes_all_of_it():
    # on CPU ranks nothing hides behind backward, whatever the bucket
    t = step_time(profile(param_bytes=1e8), whole("ddp", 2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert t["exposed_comm_s"] == pytest.approx(1.0012, rel=1e-12)


def test_a_pipeline_wider_than_a_node_hands_on_over_the_network():
    layout = Layout("pipeline", 4, 1, 4, 4, 8)  # 4 stages of one unit, 4 micro-batches of 2
    cpu = step_time(profile(), layout, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # a slot: 3 ms / 4 + 1e6 x 2 / 4e8 = 5.75 ms; 7 slots
    assert cpu["compute_s"] == pytest.approx(7 * 0.00575, rel=1e-12)
    # the largest hand-over, from units 0-2: unit 1's 5e5 B x 2; 4 stages > 2 a node: the inter-node
    # link, 10 ms + 1 ms + 1e6 / 1e7 = 111 ms a hop; 2 x 7 hops on CPU, 2 x 3 where the device overlaps
    assert cpu["comm_s"] == pytest.approx(14 * 0.111, rel=1e-12)
    gpu = step_time(profile(), layout, device(True), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert gpu["exposed_comm_s"] == pytest.approx(6 * 0.111, rel=1e-12)
    assert cpu["optimizer_s"] == pytest.approx(5 * 2e6 / 1e9, rel=1e-12)


def test_hybrid_stage_all_reduce_is_exposed():
    t = step_time(profile(), Layout("hybrid", 4, 2, 2, 4, 8), device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    assert t["exposed_comm_s"] == pytest.approx(10 * 0.0111 + 0.0312, rel=1e-12)
    # on a device that overlaps, the sends hide but for the fill and drain (2 hops), and the all-reduce, which
    # comes after the last micro-batch, still waits in full (FSDP's gathers of pp+fsdp would hide)
    t = step_time(profile(), Layout("hybrid", 4, 2, 2, 4, 8), device(True), "fp32", "sgd", FOUR_PER_NODE, EFF)
    assert t["exposed_comm_s"] == pytest.approx(2 * 0.0111 + 0.0312, rel=1e-12)


def test_pipeline_stages_sharded_over_their_replicas_gather_for_every_microbatch_and_reduce_scatter_once():
    layout = Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2)  # 2 stages, each sharded over 2 replicas, 4 micro-batches
    cpu = step_time(profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # the heavier stage's 3 MB over 2 ranks in a node: 1 ms + 0.1 ms + 1.5 MB / 1e8 = 16.1 ms a collective; the
    # gathers of the 4 backwards and the first forward, and one reduce-scatter, in place of hybrid's all-reduce
    assert cpu["comm_s"] == cpu["exposed_comm_s"] == pytest.approx(10 * 0.0111 + 6 * 0.0161, rel=1e-12)
    assert cpu["optimizer_s"] == pytest.approx(5 * 3e6 / 2 / 1e9, rel=1e-12)  # half the stage's state
    # where the device overlaps, what outlasts the stage's 5 slots of 11.5 ms, at least two units' gathers
    # (the largest unit, 2 MB: 11.1 ms each), and the fill and drain's 2 hops
    gpu = step_time(profile(), layout, device(True), "fp32", "sgd", FOUR_PER_NODE, EFF)
    assert gpu["exposed_comm_s"] == pytest.approx(2 * 0.0111 + 6 * 0.0161 - 5 * 0.0115, rel=1e-12)
    light = step_time(profile(), replace(layout, microbatches=2), device(True), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # 2 micro-batches of 4: 3 slots of 21.5 ms hide all of the 3 gathers and the reduce-scatter (64.4 ms) but
    # the two units' gathers kept exposed; the 2 hops hand on 2 MB each (21.1 ms)
    assert light["exposed_comm_s"] == pytest.approx(2 * 0.0211 + 2 * 0.0111, rel=1e-12)


def split_profile() -> ModelProfile:
    """The toy split 2 ways: 2.5 MB a rank, 8 all-reduces a step of 1 kB a sample each, 3/4 of the FLOPs split."""
    from paratrain.plan.profile import TensorParallelProfile

    toy = profile()
    toy.tensor_parallel = TensorParallelProfile(2, 2_500_000, 10, 0.0, 0.0, 8, 8e3, 0.75)
    return toy


def test_tensor_parallel_splits_the_split_flops_and_waits_for_every_all_reduce():
    t = step_time(split_profile(), Layout("tp", 2, 1, 1, 1, 100, tp=2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # compute: 3 ms + 1e6 x 100 x (1/4 whole + 3/4 halved = 0.625) / (1e9 x 0.4) = 3 ms + 156.25 ms;
    # 8 all-reduces of 1 kB x 100 = 100 kB on 2 ranks of a node: 1 ms + 2 x 0.1 ms + 1e5 / 1e8 = 2.2 ms each,
    # all exposed; SGD over the rank's 2.5 MB: 12.5 ms; overhead 5 ms
    assert t["compute_s"] == pytest.approx(0.15925, rel=1e-12)
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(8 * 2.2e-3, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.0125, rel=1e-12)
    assert t["step_time_s"] == pytest.approx(0.15925 + 0.0176 + 0.0125 + 0.005, rel=1e-12)
    # a quarter of it training: SGD over 0.625 MB, 3.125 ms; a 2-stage pipeline of it steps its heavier stage's
    # 3 MB x 1/4: 3.75 ms
    frozen = replace(split_profile(), trainable_share=0.25)
    tp = Layout("tp", 2, 1, 1, 1, 100, tp=2)
    assert step_time(frozen, tp, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)["optimizer_s"] == pytest.approx(
        0.003125, rel=1e-12
    )
    staged = step_time(frozen, Layout("pipeline", 2, 1, 2, 4, 8), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert staged["optimizer_s"] == pytest.approx(0.00375, rel=1e-12)


def test_fsdp_over_tensor_parallel_groups_adds_fsdps_collectives_on_the_ranks_share():
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2)
    t = step_time(split_profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # compute: 3 ms + 1e6 x 50 x 0.625 / 4e8 = 81.125 ms; tensor parallel: 8 x (1 ms + 0.2 ms + 5e4 / 1e8)
    # = 13.6 ms; fsdp over 2 ranks (2 of them a node): gathers of 2.5 MB, 1 ms + 0.1 ms + 0.5 x 2.5e6 / 1e8
    # = 13.6 ms, forward, backward and the reduce-scatter: 40.8 ms, exposed on CPU ranks; SGD on half the
    # rank's share: 6.25 ms; overhead 5 ms
    assert t["compute_s"] == pytest.approx(0.081125, rel=1e-12)
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(0.0136 + 0.0408, rel=1e-12)
    assert t["optimizer_s"] == pytest.approx(0.00625, rel=1e-12)
    assert t["step_time_s"] == pytest.approx(0.081125 + 0.0544 + 0.00625 + 0.005, rel=1e-12)


def test_tensor_parallel_sums_16_bit_activations_under_a_16_bit_precision():
    bf16 = Device("test", {"bf16": 1e9}, 1e10, 1e9, "intra", {"bf16": 0.5}, overlap=False)
    t = step_time(split_profile(), Layout("tp", 2, 1, 1, 1, 100, tp=2), bf16, "bf16", "sgd", TWO_PER_NODE, EFF)
    # 8 all-reduces of 50 kB (half of fp32's 100 kB): 1 ms + 0.2 ms + 5e4 / 1e8 = 1.7 ms each
    assert t["comm_s"] == pytest.approx(8 * 1.7e-3, rel=1e-12)


def sixteen_bit(overlap: bool) -> Device:
    return Device("test", {"fp32": 1e9, "bf16": 1e9, "fp16": 1e9}, 1e10, 1e9, "intra", {}, overlap=overlap)


def test_fsdp_over_tensor_parallel_groups_on_gpus_in_bf16():
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2)
    t = step_time(split_profile(), layout, sixteen_bit(True), "bf16", "sgd", FOUR_PER_NODE, EFF)
    # compute as in fp32: 81.125 ms. Tensor parallel: 8 all-reduces of bf16 activations, 1 kB x 50 / 2 = 25 kB:
    # 1 ms + 0.2 ms + 25e3 / 1e8 = 1.45 ms each, 11.6 ms. FSDP over 2 ranks of the rank's 2.5 MB: the float32
    # reduce-scatter 13.6 ms, two bf16 gathers of 1.25 MB, 1.1 ms + 6.25 ms each: 28.3 ms in all; one unit: all
    # of it exposed
    assert t["compute_s"] == pytest.approx(0.081125, rel=1e-12)
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(0.0116 + 0.0283, rel=1e-12)


def test_fsdp_over_tensor_parallel_groups_without_resharding_gathers_once():
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2, reshard_after_forward=False)
    t = step_time(split_profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # tensor parallel 13.6 ms (as above in fp32); one gather and the reduce-scatter, 13.6 ms each
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(0.0136 + 2 * 0.0136, rel=1e-12)


def test_fsdp_over_tensor_parallel_groups_of_a_whole_node_crosses_nodes():
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2)
    t = step_time(split_profile(), layout, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # a group fills a node of 2, so the 2 ranks holding the same split are on 2 nodes: each gather of 2.5 MB
    # crosses the network, 10 ms + 1 ms + 0.5 x 2.5e6 / 1e7 = 136 ms, three of them; tensor parallel 13.6 ms
    assert t["comm_s"] == pytest.approx(0.0136 + 3 * 0.136, rel=1e-12)


def test_tensor_parallel_in_fp16_with_one_collective_of_each_kind():
    from paratrain.plan.profile import TensorParallelProfile

    toy = profile()
    toy.tensor_parallel = TensorParallelProfile(2, 2_500_000, 10, 0.0, 0.0, 1, 1e3, 0.75, 1, 2e3)
    t = step_time(toy, Layout("tp", 2, 1, 1, 1, 100, tp=2), sixteen_bit(False), "fp16", "sgd", TWO_PER_NODE, EFF)
    # one all-reduce of 1 kB x 100 in 16 bits, 50 kB: 1 + 0.2 + 0.5 ms; one gather of 2 kB x 100 / 2: 1.1 + 0.5 ms
    assert t["comm_s"] == pytest.approx(0.0017 + 0.0016, rel=1e-12)


def test_sequence_parallelism_pays_a_ring_pass_per_gather_and_scatter():
    from paratrain.plan.profile import TensorParallelProfile

    toy = profile()
    # 12 all-gathers and reduce-scatters a step of 2 kB a sample whole, no all-reduce
    toy.tensor_parallel = TensorParallelProfile(2, 2_500_000, 10, 0.0, 0.0, 0, 0.0, 0.75, 12, 12 * 2e3)
    t = step_time(toy, Layout("tp", 2, 1, 1, 1, 100, tp=2), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # each: 2 kB x 100 = 200 kB whole on 2 ranks: 1 ms + 0.1 ms + 1/2 x 2e5 / 1e8 = 2.1 ms, all exposed
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(12 * 2.1e-3, rel=1e-12)


def test_checkpointed_activations_add_the_recompute_to_the_compute():
    toy = profile()
    toy.recompute_flops_per_sample = 500_000  # the blocks' forward, again in backward
    t = step_time(toy, whole("single", 1), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    # 1 ms fixed + (1e6 + 5e5) x 100 / (1e9 x 0.5) = 301 ms
    assert t["compute_s"] == pytest.approx(0.301, rel=1e-12)


def test_memory_bound_operators_run_at_the_memory_bandwidth_where_the_efficiency_is_the_matrix_products():
    toy = profile()
    toy.memory_bound_bytes_per_sample = 2e5  # 0.2 bytes a FLOP of work
    toy.memory_bound_bytes_fixed = 3e6
    apart = replace(EFF, memory_bound_apart=True)
    t = step_time(toy, whole("single", 1), device(False), "fp32", "sgd", TWO_PER_NODE, apart)
    # 1 ms fixed + 3e6 B / 1e9 B/s = 4 ms; 1e6 FLOPs x 100 / (1e9 x 0.5) = 200 ms; 2e5 B x 100 / 1e9 B/s = 20 ms
    assert t["compute_s"] == pytest.approx(0.224, rel=1e-12)
    # An efficiency measured on the whole step (calibrated, or a CNN's carried over) holds that time already
    assert step_time(toy, whole("single", 1), device(False), "fp32", "sgd", TWO_PER_NODE, EFF)[
        "compute_s"
    ] == pytest.approx(0.201, rel=1e-12)
    # The recompute brings its blocks' bytes (still 0.2 a FLOP): 4 ms + 1.5e6 x 100 / 5e8 = 300 ms + 3e5 x 100 / 1e9
    toy.recompute_flops_per_sample, toy.recompute_memory_bound_bytes_per_sample = 500_000, 1e5
    t = step_time(toy, whole("single", 1), device(False), "fp32", "sgd", TWO_PER_NODE, apart)
    assert t["compute_s"] == pytest.approx(0.004 + 0.300 + 0.030, rel=1e-12)
    # A pipeline's stage runs its share of the bytes with its FLOPs: 2 stages of 2 units, M = 4, 5 slots of
    # (3 ms + 3 ms) / 2 fixed + 25 samples x 2e6 FLOPs x 1.5 (the recompute) at 1 / (1 / 9e8 + 0.2 / 1e9) FLOP/s
    staged = Layout("pipeline", 2, 1, 2, 4, 100)
    t = step_time(toy, staged, device(False), "fp32", "sgd", TWO_PER_NODE, replace(apart, by_devices=()))
    slot = 3e-3 + 25 * 2e6 * 1.5 * (1 / 9e8 + 0.2 / 1e9)
    assert t["compute_s"] == pytest.approx(5 * slot, rel=1e-12)


def test_cpu_ranks_average_ddp_over_shared_memory_and_run_every_other_collective_on_gloo():
    """paratrain's shared-memory average carries ddp's and zero1's gradients; FSDP's gathers and reduce-scatters,
    the pipeline's sends and hybrid's DDP are gloo's (a slower link here: 1e7 B/s, 5 ms a collective)."""
    gloo = Link("gloo", 1e7, 0.0, "test", base_latency=5e-3)
    with_gloo = replace(TWO_PER_NODE, gloo=GlooLinks(gloo, gloo, gloo))
    over_gloo = replace(TWO_PER_NODE, intra=gloo)
    cpu = device(False)
    for layout in (whole("ddp", 2), whole("zero1", 2)):
        t = step_time(profile(), layout, cpu, "fp32", "sgd", with_gloo, EFF)
        assert t == step_time(profile(), layout, cpu, "fp32", "sgd", TWO_PER_NODE, EFF)
        assert t["comm_s"] < step_time(profile(), layout, cpu, "fp32", "sgd", over_gloo, EFF)["comm_s"]
    for layout in (whole("fsdp", 2), Layout("pipeline", 2, 1, 2, 4, 100), Layout("hybrid", 4, 2, 2, 4, 100)):
        t = step_time(profile(), layout, cpu, "fp32", "sgd", with_gloo, EFF)
        assert t == step_time(profile(), layout, cpu, "fp32", "sgd", over_gloo, EFF)
        assert t["comm_s"] > step_time(profile(), layout, cpu, "fp32", "sgd", TWO_PER_NODE, EFF)["comm_s"]


def test_gloos_all_gather_and_reduce_scatter_each_take_their_own_link():
    """gloo's collectives measured apart (all-reduce 1e7 B/s and 5 ms, all-gather 2e7 B/s and 2 ms, reduce-scatter
    5e6 B/s and 4 ms): fsdp on 2 CPU ranks gathers the toy's one 4 MB unit twice, at 2 ms + 2 MB / 2e7 B/s = 102 ms
    each, and reduce-scatters it once, at 4 ms + 2 MB / 5e6 B/s = 404 ms (its empty root moves nothing): 608 ms."""
    links = GlooLinks(
        Link("ar", 1e7, 0.0, "test", base_latency=5e-3),
        Link("ag", 2e7, 0.0, "test", base_latency=2e-3),
        Link("rs", 5e6, 0.0, "test", base_latency=4e-3),
    )
    t = step_time(profile(), whole("fsdp", 2), device(False), "fp32", "sgd", replace(TWO_PER_NODE, gloo=links), EFF)
    assert t["comm_s"] == pytest.approx(0.608, rel=1e-12)
    assert t["exposed_comm_s"] == t["comm_s"]  # CPU ranks hide nothing


def test_cpu_ranks_wait_at_their_collectives_for_the_last_to_arrive():
    """The ranks' arrival lag, 5 % of the compute before a collective, adds 5 % of the step's compute to the
    exposed communication of every layout of more than one rank but a pipeline's (whose waits are its bubble)."""
    gloo = Link("gloo", 1e7, 0.0, "test", base_latency=5e-3)
    lagging = replace(TWO_PER_NODE, gloo=GlooLinks(gloo, gloo, gloo, arrival_lag=0.05))
    prompt = replace(TWO_PER_NODE, gloo=GlooLinks(gloo, gloo, gloo))
    alone = replace(EFF, by_devices=((1, 0.5),))  # calibrated on one rank: no wait for another in its efficiency
    for layout in (whole("ddp", 2), whole("fsdp", 2), whole("single", 1), Layout("pipeline", 2, 1, 2, 4, 100)):
        late = step_time(profile(), layout, device(False), "fp32", "sgd", lagging, alone)
        on_time = step_time(profile(), layout, device(False), "fp32", "sgd", prompt, alone)
        lag = 0.05 * on_time["compute_s"] if layout.devices > 1 and layout.stages == 1 else 0.0
        assert late["exposed_comm_s"] == pytest.approx(on_time["exposed_comm_s"] + lag, rel=1e-12)
        assert late["step_time_s"] == pytest.approx(on_time["step_time_s"] + lag, rel=1e-12)
    # an efficiency calibrated on 2 ranks holds their wait: nothing added
    fsdp = whole("fsdp", 2)
    assert step_time(profile(), fsdp, device(False), "fp32", "sgd", lagging, EFF) == step_time(
        profile(), fsdp, device(False), "fp32", "sgd", prompt, EFF
    )


def split_stages_profile() -> ModelProfile:
    """The toy split 2 ways unit by unit: the first unit whole, the other three halved, all of their FLOPs split;
    8 all-reduces a step of 1 kB a sample each."""
    from paratrain.plan.profile import TensorParallelProfile

    toy = profile()
    toy.tensor_parallel = TensorParallelProfile(
        2, 2_000_000, 10, 0.0, 0.0, 8, 8e3, 0.75,
        unit_param_bytes=(1e6, 1e6, 2.5e5, 2.5e5), unit_split_flops_per_sample=(0.0, 1e6, 1e6, 1e6),
    )  # fmt: skip
    return toy


def test_split_pipeline_stages_run_their_split_flops_halved_and_wait_for_their_share_of_the_sums():
    layout = Layout("pp+tp", 4, 1, 2, 4, 8, tp=2)  # 2 stages, each split over 2 ranks, 4 micro-batches of 2
    cpu = step_time(split_stages_profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # stage 0 (units 0-1): 1 MFLOP whole + 1 MFLOP halved = 1.5 MFLOP a sample, the slower stage (stage 1: 1);
    # a slot: 3 ms / 2 + 1.5e6 x 2 / 4e8 = 9 ms; 5 slots
    # its share of the 8 all-reduces, by split FLOPs, 1/3; each of 1 kB x 2 on 2 ranks: 1 + 0.2 + 0.02 ms
    # = 1.22 ms; a hop hands 5e5 x 2 B on the node (2 stages x 2 ranks fill a node of 4): 11.1 ms, 10 of them
    assert cpu["compute_s"] == pytest.approx(5 * 0.009, rel=1e-12)
    assert cpu["comm_s"] == cpu["exposed_comm_s"] == pytest.approx(5 * 8 * 0.00122 / 3 + 10 * 0.0111, rel=1e-12)
    assert cpu["optimizer_s"] == pytest.approx(5 * 2e6 / 1e9, rel=1e-12)  # stage 0's 2 MB of pieces
    # on nodes of 2, the stages' 4 ranks span two nodes: each hop crosses the network, 10 + 1 + 100 ms
    wide = step_time(split_stages_profile(), layout, device(False), "fp32", "sgd", TWO_PER_NODE, EFF)
    assert wide["comm_s"] == pytest.approx(5 * 8 * 0.00122 / 3 + 10 * 0.111, rel=1e-12)


def test_split_pipeline_stages_sharded_over_replicas_gather_their_pieces():
    layout = Layout("pp+fsdp+tp", 8, 2, 2, 4, 8, shard=2, tp=2)
    eight = Topology(per_node=8, intra=INTRA, inter=INTER)
    cpu = step_time(split_stages_profile(), layout, device(False), "fp32", "sgd", eight, EFF)
    # as pp+tp, and the stage's 2 MB of pieces over its 2 shards (4 ranks apart, on the node): the 4 backwards'
    # and the first forward's gathers and one reduce-scatter, 1 + 0.1 + 0.5 x 2e6 / 1e8 = 11.1 ms each
    assert cpu["comm_s"] == pytest.approx(5 * 8 * 0.00122 / 3 + 10 * 0.0111 + 6 * 0.0111, rel=1e-12)
    assert cpu["optimizer_s"] == pytest.approx(5 * 2e6 / 2 / 1e9, rel=1e-12)


def test_a_pipeline_without_tp_ignores_the_split_profile_a_tp_plan_measured():
    # plan --tp measures the split model once; the table's pipeline rows (tp 1) are the whole model's
    layout = Layout("pipeline", 2, 1, 2, 4, 8)
    assert step_time(split_stages_profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF) == step_time(
        profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF
    )


def test_split_pipeline_stages_sum_16_bit_activations_under_a_16_bit_precision():
    layout = Layout("pp+tp", 4, 1, 2, 4, 8, tp=2)
    t = step_time(split_stages_profile(), layout, sixteen_bit(False), "bf16", "sgd", FOUR_PER_NODE, EFF)
    # as in fp32, but each all-reduce carries 1 kB x 2 in 16 bits: 1 + 0.2 + 0.01 ms
    assert t["comm_s"] == pytest.approx(5 * 8 * 0.00121 / 3 + 10 * 0.0111, rel=1e-12)


def test_split_and_sharded_stages_wider_than_a_node_gather_across_nodes():
    layout = Layout("pp+fsdp+tp", 8, 2, 2, 4, 8, shard=2, tp=2)
    t = step_time(split_stages_profile(), layout, device(False), "fp32", "sgd", FOUR_PER_NODE, EFF)
    # a pipeline of 2 split stages fills a node of 4, so a stage's 2 shards are on 2 nodes: each of the 6
    # collectives of its 2 MB crosses the network, 10 + 1 + 0.5 x 2e6 / 1e7 = 111 ms; the hops stay in the node
    assert t["comm_s"] == pytest.approx(5 * 8 * 0.00122 / 3 + 10 * 0.0111 + 6 * 0.111, rel=1e-12)


def test_pipeline_stages_sharded_in_bf16_gather_in_bf16_and_reduce_scatter_in_float32():
    layout = Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2)
    t = step_time(profile(), layout, sixteen_bit(False), "bf16", "sgd", FOUR_PER_NODE, EFF)
    # the 5 gathers of the heavier stage's 3 MB in bf16, 1.5 MB whole: 1 + 0.1 + 0.75e6 / 1e8 = 8.6 ms; its
    # reduce-scatter in float32, 16.1 ms; the 10 hops, 11.1 ms
    assert t["comm_s"] == t["exposed_comm_s"] == pytest.approx(10 * 0.0111 + 0.0161 + 5 * 0.0086, rel=1e-12)
    gpu = step_time(profile(), layout, sixteen_bit(True), "bf16", "sgd", FOUR_PER_NODE, EFF)
    # where the device overlaps: the 59.1 ms outlast the 5 slots of 11.5 ms by 1.6 ms, less than two of the
    # largest unit's (2 MB) gathers in bf16, 1 + 0.1 + 5 ms each; and the fill and drain's 2 hops
    assert gpu["exposed_comm_s"] == pytest.approx(2 * 0.0111 + 2 * 0.0061, rel=1e-12)
