"""The planner's memory per device, pinned exactly per strategy, optimizer and precision (issue #25).

A toy profile with round numbers: 4 MB of float32 parameters in 10 tensors, 1 kB of buffers,
activations of 50 kB fixed + 10 kB a sample, the largest FSDP unit 1 MB; four pipeline units of
1 MFLOP a sample each, each saving a quarter of the activations. Every expected figure is worked out in the
comments.
"""

import dataclasses

import pytest

from paratrain.plan.memory import USABLE_FRACTION, Layout, memory_per_device, optimizer_bytes, stage_bounds
from paratrain.plan.profile import ModelProfile

RUNTIME = 3e8


def profile(unit_params=(1e6, 2e6, 5e5, 5e5)) -> ModelProfile:
    units = [
        dict(
            name=f"u{i}",
            param_bytes=p,
            flops_per_sample=1e6,
            output_bytes_per_sample=0,
            saved_bytes_per_sample=2.5e3,
            input_saved_bytes_per_sample=0,
        )
        for i, p in enumerate(unit_params)
    ]
    return ModelProfile("toy", 10**6, 4 * 10**6, 10, 1000, 4 * 10**6, 1e4, 5e4, 10**6, units)


def whole(strategy: str, n: int, batch: int = 100, reshard: bool = True) -> Layout:
    return Layout(strategy, n, n, 1, 1, batch, reshard_after_forward=reshard)


def memory(layout: Layout, optimizer: str = "sgd", precision: str = "fp32", momentum: float = 0.9) -> dict:
    return memory_per_device(profile(), layout, optimizer, precision, runtime_bytes=RUNTIME, momentum=momentum)


def test_optimizer_state_per_optimizer():
    # SGD with momentum and LARS: one buffer; Adam family: two moments + 4 bytes a tensor; plain SGD: none
    assert optimizer_bytes(4e6, 10, "sgd") == 4e6
    assert optimizer_bytes(4e6, 10, "lars") == 4e6
    assert optimizer_bytes(4e6, 10, "adam") == 8e6 + 40
    assert optimizer_bytes(4e6, 10, "adamw") == 8e6 + 40
    assert optimizer_bytes(4e6, 10, "lamb") == 8e6 + 40
    assert optimizer_bytes(4e6, 10, "sgd", momentum=0) == 0
    assert optimizer_bytes(4e6, 10, "lars", momentum=0) == 4e6  # LARS keeps its buffer


def test_one_device_holds_everything_whole():
    m = memory(whole("single", 1))
    assert m == {
        "parameters_bytes": 4e6,
        "gradients_bytes": 4e6,
        "optimizer_bytes": 4e6,
        "activations_bytes": 5e4 + 1e4 * 100,
        "gathered_bytes": 0.0,
        "transient_bytes": 0.0,
        "buffers_bytes": 1000.0,
        "runtime_bytes": RUNTIME,
        "total_bytes": 3 * 4e6 + 1.05e6 + 1000 + RUNTIME,
    }


@pytest.mark.parametrize(
    "precision,activations", [("fp32", 1.05e6), ("tf32", 1.05e6), ("bf16", 5.25e5), ("fp16", 5.25e5)]
)
def test_16_bit_precisions_halve_the_activations_only(precision, activations):
    m = memory(whole("single", 1), precision=precision)
    assert m["activations_bytes"] == activations
    assert m["parameters_bytes"] == m["gradients_bytes"] == 4e6  # autocast keeps weights and grads in fp32


def test_16_bit_precisions_keep_the_losss_float32_activations():
    toy = profile()
    toy.loss_activation_bytes_per_sample = 4e3  # of the 1e4 a sample: autocast's float32 log-softmax
    m = memory_per_device(toy, whole("single", 1), "sgd", "bf16", RUNTIME)
    # 5e4 fixed, halved; 100 samples of 6e3 halved and 4e3 whole
    assert m["activations_bytes"] == 5e4 / 2 + (6e3 / 2 + 4e3) * 100
    assert memory_per_device(toy, whole("single", 1), "sgd", "fp32", RUNTIME)["activations_bytes"] == 5e4 + 1e6


def test_ddp_replicates_and_takes_the_replica_batch():
    m = memory(whole("ddp", 2, batch=50), optimizer="adam")
    assert (m["parameters_bytes"], m["gradients_bytes"], m["optimizer_bytes"]) == (4e6, 4e6, 8e6 + 40)
    assert m["activations_bytes"] == 5e4 + 1e4 * 50 and m["gathered_bytes"] == 0


def test_zero1_splits_only_the_optimizer_state():
    m = memory(whole("zero1", 2), optimizer="adam")
    assert (m["parameters_bytes"], m["gradients_bytes"]) == (4e6, 4e6)
    assert m["optimizer_bytes"] == (8e6 + 40) / 2
    assert memory(whole("zero1", 4))["optimizer_bytes"] == 1e6


def test_fsdp_splits_state_and_gathers_two_units_or_the_whole_model():
    m = memory(whole("fsdp", 2))
    assert (m["parameters_bytes"], m["gradients_bytes"], m["optimizer_bytes"]) == (2e6, 2e6, 2e6)
    assert m["gathered_bytes"] == 2 * 1e6  # the running unit and the prefetched one
    assert m["total_bytes"] == 3 * 2e6 + 2e6 + 1.05e6 + 1000 + RUNTIME
    assert memory(whole("fsdp", 2, reshard=False))["gathered_bytes"] == 4e6  # kept after forward: all of it
    assert memory(whole("fsdp", 4))["parameters_bytes"] == 1e6
    assert memory(whole("fsdp", 1))["gathered_bytes"] == 0.0  # one rank gathers nothing
    # bf16: its mixed-precision policy gathers bf16 copies (half); the shards stay float32
    bf16 = memory(whole("fsdp", 2), precision="bf16")
    assert bf16["gathered_bytes"] == 1e6 and bf16["parameters_bytes"] == 2e6
    assert memory(whole("fsdp", 2), precision="fp16")["gathered_bytes"] == 2e6


def test_stage_bounds_cut_by_flops():
    assert stage_bounds(profile(), 2) == [(0, 2), (2, 4)]
    assert stage_bounds(profile(), 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_1f1b_pipeline_reports_the_heaviest_stage():
    m = memory(Layout("pipeline", 2, 1, 2, 4, 8))  # 2 stages, 4 micro-batches of 2
    # stage 0 (units 0-1): 3 MB of parameters, half the saved bytes; 1F1B keeps min(M, K - 0) = 2 micro-batches:
    # activations 0.5 x (50 kB + 10 kB x 2 samples x 2) = 45 kB. Stage 1 (1 MB) is lighter.
    assert (m["parameters_bytes"], m["gradients_bytes"], m["optimizer_bytes"]) == (3e6, 3e6, 3e6)
    assert m["activations_bytes"] == pytest.approx(4.5e4, rel=1e-12)
    assert m["buffers_bytes"] == 500.0  # buffers split over the stages
    assert m["total_bytes"] == pytest.approx(9e6 + 4.5e4 + 500 + RUNTIME, rel=1e-12)
    # Adam: two moments of 3 MB + 4 bytes for each of 10 x 3/4 = 7.5 tensors
    assert memory(Layout("pipeline", 2, 1, 2, 4, 8), optimizer="adam")["optimizer_bytes"] == pytest.approx(
        6e6 + 30, rel=1e-12
    )


def test_gpipe_keeps_every_micro_batch_and_the_last_stage_can_be_heaviest():
    gpipe = memory(Layout("pipeline", 2, 1, 2, 4, 8, schedule="gpipe"))
    assert gpipe["activations_bytes"] == pytest.approx(0.5 * (5e4 + 1e4 * 2 * 4), rel=1e-12)
    late = memory_per_device(profile((5e5, 5e5, 1e6, 2e6)), Layout("pipeline", 2, 1, 2, 4, 8), "sgd", "fp32")
    # stage 1 holds 3 MB and, last in a 1F1B pipeline, one micro-batch: 0.5 x (50 kB + 20 kB)
    assert late["parameters_bytes"] == 3e6
    assert late["runtime_bytes"] == 0.0  # nothing given, nothing counted
    assert late["activations_bytes"] == pytest.approx(3.5e4, rel=1e-12)


def test_a_stage_holds_what_its_units_save_and_the_last_stage_the_losss_too():
    """A stage's activations are what its units saved as measured (profile.py), not its share of the FLOPs: a
    tensor two neighbouring units save (one's output, the next one's input) is held once inside a stage and by
    both stages a cut between them makes; the loss's saved tensors are the last stage's alone."""
    toy = profile()
    toy.loss_activation_bytes_per_sample = 2e3  # of the 10 kB a sample: the model's own 8 kB
    for unit, saved, shared in zip(toy.units, (0, 6e3, 2e3, 2e3), (0, 0, 1e3, 1e3)):
        unit["saved_bytes_per_sample"], unit["input_saved_bytes_per_sample"] = saved, shared
    # the model saves 10 - 2 = 8 kB a sample (u2's and u3's inputs held once); stages cut by FLOPs: u0-u1 | u2-u3.
    # Stage 0 saves 6 kB (0.75 of the model's) for 2 micro-batches of 2 in flight (1F1B): 0.75 x 50 kB + 0.75 x 8
    # kB x 2 x 2; it holds 3 MB of parameters, the heaviest
    first = memory_per_device(toy, Layout("pipeline", 2, 1, 2, 4, 8), "sgd", "fp32")
    assert first["parameters_bytes"] == 3e6
    assert first["activations_bytes"] == pytest.approx(0.75 * 5e4 + 0.75 * 8e3 * 2 * 2, rel=1e-12)
    # stage 1 saves 2 + 2 - 1 = 3 kB (0.375: u2's input, u1's output, is held on both sides of the cut) and the
    # loss's 2 kB a sample, for its one micro-batch in flight (1F1B's last stage), or all 4 (GPipe)
    toy.units[3]["param_bytes"] = 4e6  # now the heaviest, the one reported
    last = memory_per_device(toy, Layout("pipeline", 2, 1, 2, 4, 8), "sgd", "fp32")
    assert last["activations_bytes"] == pytest.approx(0.375 * 5e4 + (0.375 * 8e3 + 2e3) * 2 * 1, rel=1e-12)
    gpipe = memory_per_device(toy, Layout("pipeline", 2, 1, 2, 4, 8, schedule="gpipe"), "sgd", "fp32")
    assert gpipe["activations_bytes"] == pytest.approx(0.375 * 5e4 + (0.375 * 8e3 + 2e3) * 2 * 4, rel=1e-12)


def test_hsdp_holds_its_shard_groups_share_whatever_its_replicas():
    """--dp-replicate 2 --dp-shard 2: each rank holds what fsdp over 2 ranks holds (the state split 2 ways, two
    1 MB units gathered), not a quarter; with pp+fsdp over replicas of sharded stages, the same."""
    hsdp = memory(Layout("fsdp", 4, 4, 1, 1, 100, shard=2))
    assert (hsdp["parameters_bytes"], hsdp["gradients_bytes"], hsdp["optimizer_bytes"]) == (2e6,) * 3
    assert hsdp["gathered_bytes"] == 2e6
    assert hsdp == memory(whole("fsdp", 2))
    assert memory(whole("fsdp", 4))["parameters_bytes"] == 1e6  # fsdp names no shard: every rank's
    staged = memory(Layout("pp+fsdp", 8, 4, 2, 4, 8, shard=2))
    assert staged == memory(Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2))


@pytest.mark.parametrize(
    "layout, mesh",
    [
        (Layout("single", 1, 1, 1, 1, 8), (1, 1, 1, 1)),
        (whole("ddp", 4), (4, 1, 1, 1)),
        (whole("zero1", 4), (4, 1, 1, 1)),
        (whole("fsdp", 4), (1, 4, 1, 1)),
        (Layout("fsdp", 8, 8, 1, 1, 8, shard=4), (2, 4, 1, 1)),
        (Layout("pipeline", 4, 1, 4, 4, 8), (1, 1, 1, 4)),
        (Layout("hybrid", 8, 4, 2, 4, 8, shard=1), (4, 1, 1, 2)),
        (Layout("pp+fsdp", 8, 4, 2, 4, 8, shard=4), (1, 4, 1, 2)),
        (Layout("tp", 4, 1, 1, 1, 8, tp=4), (1, 1, 4, 1)),
        (Layout("fsdp+tp", 8, 4, 1, 1, 8, tp=2), (1, 4, 2, 1)),
        (Layout("fsdp+tp", 16, 8, 1, 1, 8, shard=4, tp=2), (2, 4, 2, 1)),
        (Layout("pp+tp", 8, 1, 4, 4, 8, tp=2), (1, 1, 2, 4)),
        (Layout("pp+fsdp+tp", 8, 2, 2, 4, 8, shard=2, tp=2), (1, 2, 2, 2)),
    ],
    ids=lambda v: v.strategy if isinstance(v, Layout) else "",
)
def test_a_layout_names_its_mesh_as_a_runs_summary_does(layout, mesh):
    r, s, t, p = mesh
    assert layout.mesh() == {"dp_replicate": r, "dp_shard": s, "tp": t, "pp": p}
    assert r * s * t * p == layout.devices


def test_pipeline_stages_sharded_over_their_replicas_hold_their_share_and_the_whole_stage_gathered():
    sharded = memory(Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2))  # 2 stages, each sharded over 2 replicas
    # stage 0 (units 0-1, 3 MB) split 2 ways; torch's PipelineStage keeps each unit gathered from its backward to
    # the step's end, beside its whole gradient: 3 MB of parameters and 3 MB of gradients gathered by the last
    # backward. The activations and buffers as the pipeline's (1F1B: 2 micro-batches in flight at stage 0)
    assert (sharded["parameters_bytes"], sharded["gradients_bytes"], sharded["optimizer_bytes"]) == (1.5e6,) * 3
    assert sharded["gathered_bytes"] == 6e6
    assert sharded["activations_bytes"] == pytest.approx(4.5e4, rel=1e-12) and sharded["buffers_bytes"] == 500.0
    assert sharded["total_bytes"] == pytest.approx(4.5e6 + 6e6 + 4.5e4 + 500 + RUNTIME, rel=1e-12)
    # in bf16 the gathered parameters and their gradients are bf16 (FSDP's policy), the state stays float32
    assert memory(Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2), precision="bf16")["gathered_bytes"] == 3e6
    # 4 shards: a quarter of the state, the same stage gathered
    quarter = memory(Layout("pp+fsdp", 8, 4, 2, 4, 8, shard=4))
    assert quarter["parameters_bytes"] == 7.5e5 and quarter["gathered_bytes"] == 6e6
    # the heaviest stage is still the one reported: here the last (units 2-3, 3 MB), gathered whole
    late = memory_per_device(profile((5e5, 5e5, 1e6, 2e6)), Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2), "sgd", "fp32")
    assert (late["parameters_bytes"], late["gathered_bytes"]) == (1.5e6, 6e6)
    assert late["activations_bytes"] == pytest.approx(3.5e4, rel=1e-12)  # last in 1F1B: one micro-batch


def test_a_pipeline_of_plain_sgd_keeps_no_optimizer_state():
    assert memory(Layout("pipeline", 2, 1, 2, 4, 8), momentum=0)["optimizer_bytes"] == 0


def test_a_device_fits_below_90_percent_of_its_memory():
    assert USABLE_FRACTION == 0.9


def split_profile():
    """The toy model split 2 ways as measured: 2.5 MB a rank in 10 tensors, activations 50 kB fixed + 6 kB a
    sample, 8 all-reduces a step of 1 kB a sample each, three quarters of the FLOPs in the split modules."""
    from paratrain.plan.profile import TensorParallelProfile

    toy = profile()
    toy.tensor_parallel = TensorParallelProfile(2, 2_500_000, 10, 6e3, 5e4, 8, 8e3, 0.75)
    return toy


def test_a_tensor_parallel_rank_holds_what_the_split_model_measured():
    m = memory_per_device(split_profile(), Layout("tp", 2, 1, 1, 1, 100, tp=2), "sgd", "fp32", RUNTIME)
    # its 2.5 MB of parameters, as many gradients and momentum; 50 kB + 6 kB x the group's 100 samples
    assert m == {
        "parameters_bytes": 2.5e6,
        "gradients_bytes": 2.5e6,
        "optimizer_bytes": 2.5e6,
        "activations_bytes": 5e4 + 6e3 * 100,
        "gathered_bytes": 0.0,
        "transient_bytes": 0.0,
        "buffers_bytes": 1000.0,
        "runtime_bytes": RUNTIME,
        "total_bytes": 7.5e6 + 6.5e5 + 1000 + RUNTIME,
    }
    # SGD without momentum keeps no state, split or not
    plain_sgd = memory_per_device(split_profile(), Layout("tp", 2, 1, 1, 1, 100, tp=2), "sgd", "fp32", 0, momentum=0)
    assert plain_sgd["optimizer_bytes"] == 0


def test_fsdp_over_tensor_parallel_groups_shards_the_ranks_share():
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2)
    m = memory_per_device(split_profile(), layout, "adam", "bf16", RUNTIME)
    # 2.5 MB over 2 data-parallel ranks; Adam's two moments + 4 B a tensor, halved: (5e6 + 40) / 2;
    # bf16 halves the activations: (5e4 + 6e3 x 50) / 2; in flight: the largest unit (1 MB) x 2.5/4 split, twice,
    # gathered in bf16 (half)
    assert m["parameters_bytes"] == m["gradients_bytes"] == 1.25e6
    assert m["optimizer_bytes"] == (5e6 + 40) / 2
    assert m["activations_bytes"] == (5e4 + 6e3 * 50) / 2
    assert m["gathered_bytes"] == 2 * 1e6 * 2.5e6 / 4e6 / 2


def test_fsdp_over_tensor_parallel_groups_without_resharding_holds_the_whole_split_gathered():
    """ZeRO-2's traffic (--reshard-after-forward false): every unit stays gathered from forward to backward, so in
    flight is the rank's whole split share (2.5 MB), in bf16 (half), not two units of it; the state is as sharded."""
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2, reshard_after_forward=False)
    m = memory_per_device(split_profile(), layout, "adam", "bf16", RUNTIME)
    assert m["parameters_bytes"] == 1.25e6
    assert m["gathered_bytes"] == 4e6 * 2.5e6 / 4e6 / 2


def test_replicas_of_tensor_parallel_groups_hold_the_ranks_split_whole():
    """ddp+tp (--dp-replicate 2 --tp 2, FSDP2 over shards of one rank): nothing split over the replicas, so each
    rank holds its 2.5 MB split share, its gradients and Adam's moments whole; no gathered copies are planned."""
    layout = Layout("fsdp+tp", 4, 2, 1, 1, 50, shard=1, tp=2)
    assert layout.name == "ddp+tp"
    m = memory_per_device(split_profile(), layout, "adam", "fp32", RUNTIME)
    assert m["parameters_bytes"] == m["gradients_bytes"] == 2.5e6
    assert m["optimizer_bytes"] == 5e6 + 40
    assert m["gathered_bytes"] == 0.0


def split_stages_profile():
    """The toy model split 2 ways unit by unit: the first unit (an embedding, say) whole, the others halved."""
    from paratrain.plan.profile import TensorParallelProfile

    toy = profile()
    toy.tensor_parallel = TensorParallelProfile(
        2, 2_000_000, 10, 6e3, 5e4, 8, 8e3, 0.75,
        unit_param_bytes=(1e6, 1e6, 2.5e5, 2.5e5), unit_split_flops_per_sample=(0.0, 1e6, 1e6, 1e6),
    )  # fmt: skip
    return toy


def test_split_pipeline_stages_hold_each_units_piece_and_the_split_models_activations():
    m = memory_per_device(split_stages_profile(), Layout("pp+tp", 4, 1, 2, 4, 8, tp=2), "sgd", "fp32", RUNTIME)
    # stage 0 (units 0-1 by FLOPs): unit 0 whole, 1 MB, and unit 1's half, 1 MB; momentum as much; the split
    # model's activations, half of them (what its units save), for its 2 micro-batches of 2 in flight (1F1B):
    # 0.5 x (50 kB + 6 kB x 2 x 2); the buffers over the 2 stages
    assert (m["parameters_bytes"], m["gradients_bytes"], m["optimizer_bytes"]) == (2e6,) * 3
    assert m["activations_bytes"] == pytest.approx(0.5 * (5e4 + 6e3 * 4), rel=1e-12)
    assert (m["gathered_bytes"], m["buffers_bytes"]) == (0.0, 500.0)
    # sharded over 2 replicas too: half the stage's state; Adam's moments on it and a step counter for each of
    # the stage's 7.5 tensors (3 of the 4 MB); the whole stage's pieces gathered with their gradients by the last
    # backward (2 MB each), in bf16 half
    sharded = memory_per_device(
        split_stages_profile(), Layout("pp+fsdp+tp", 8, 2, 2, 4, 8, shard=2, tp=2), "adam", "bf16", RUNTIME
    )
    assert sharded["parameters_bytes"] == sharded["gradients_bytes"] == 1e6
    assert sharded["optimizer_bytes"] == (4e6 + 4 * 7.5) / 2
    assert sharded["gathered_bytes"] == (2e6 + 2e6) / 2
    assert sharded["activations_bytes"] == pytest.approx(0.5 * 0.5 * (5e4 + 6e3 * 4), rel=1e-12)


def transient_profile() -> ModelProfile:
    """The toy holding 20 kB + 3 kB a sample beyond its saved tensors at backward's peak (a loss's gradients)."""
    toy = profile()
    toy.transient_bytes_fixed, toy.transient_bytes_per_sample = 2e4, 3e3
    return toy


def test_backwards_transients_are_held_for_the_samples_a_rank_runs_at_once():
    single = memory_per_device(transient_profile(), whole("single", 1), "sgd", "bf16", RUNTIME)
    # 20 kB + 3 kB x 100 samples, whole in bf16 too (the loss's float32 gradients), in the total
    assert single["transient_bytes"] == 3.2e5
    assert single["total_bytes"] == pytest.approx(3 * 4e6 + 5.25e5 + 3.2e5 + 1000 + RUNTIME, rel=1e-12)
    assert memory_per_device(transient_profile(), whole("fsdp", 4, batch=25), "sgd", "fp32")["transient_bytes"] == (
        2e4 + 3e3 * 25
    )
    # a pipeline's loss is on its last stage, one micro-batch (of 2) at a time; the first holds none
    late = transient_profile()
    late.units[3]["param_bytes"] = 4e6  # the last stage (units 2-3) the heaviest, the one reported
    staged = memory_per_device(late, Layout("pipeline", 2, 1, 2, 4, 8), "sgd", "fp32")
    assert staged["transient_bytes"] == 2e4 + 3e3 * 2
    first = memory_per_device(transient_profile(), Layout("pipeline", 2, 1, 2, 4, 8), "sgd", "fp32")
    assert first["parameters_bytes"] == 3e6 and first["transient_bytes"] == 0.0  # stage 0, the heaviest


def test_a_split_model_holds_the_losss_backward_its_own_measurement_gives():
    """With tensor parallelism a rank holds the loss's backward as the split model measured it (with
    --loss-parallel its piece of the [tokens x vocabulary] gradients; profile_tensor_parallel), for the group's
    whole batch (tp) or a replica's (fsdp+tp); the whole model's reading counts only without a split."""
    toy = transient_profile()
    toy.tensor_parallel = dataclasses.replace(
        split_profile().tensor_parallel, loss_split=2, transient_bytes_fixed=1e4, transient_bytes_per_sample=1.6e3
    )
    split = memory_per_device(toy, Layout("tp", 2, 1, 1, 1, 100, tp=2), "sgd", "fp32")
    assert split["transient_bytes"] == 1e4 + 1.6e3 * 100
    sharded = memory_per_device(toy, Layout("fsdp+tp", 4, 2, 1, 1, 50, tp=2), "sgd", "fp32")
    assert sharded["transient_bytes"] == 1e4 + 1.6e3 * 50
    assert memory_per_device(toy, whole("fsdp", 2, batch=50), "sgd", "fp32")["transient_bytes"] == 2e4 + 3e3 * 50


def test_only_the_parameters_that_train_have_gradients_and_optimizer_state():
    """A quarter of the toy's 4 MB trains (a frozen backbone under a head): 1 MB of gradients and of Adam's two
    moments each (2 MB), and 4 bytes for each of 10 x 1/4 = 2.5 tensors, whole, in a 2-stage pipeline's heavier
    stage (3 MB held: 0.75 MB trains), the same stage sharded, and on a tensor-parallel rank (2.5 MB held: 0.625 MB
    trains)."""
    frozen = dataclasses.replace(profile(), trainable_share=0.25)
    m = memory_per_device(frozen, whole("single", 1), "adam", "fp32", RUNTIME)
    assert (m["parameters_bytes"], m["gradients_bytes"], m["optimizer_bytes"]) == (4e6, 1e6, 2e6 + 10)
    stage = memory_per_device(frozen, Layout("pipeline", 2, 1, 2, 4, 8), "adam", "fp32", RUNTIME)
    assert (stage["parameters_bytes"], stage["gradients_bytes"]) == (3e6, 7.5e5)
    assert stage["optimizer_bytes"] == pytest.approx(1.5e6 + 7.5, rel=1e-12)
    # sharded over 2 replicas: the stage gathered whole by its last backward (3 MB), with the gradients of its
    # quarter that trains (0.75 MB)
    sharded = memory_per_device(frozen, Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2), "adam", "fp32", RUNTIME)
    assert sharded["gathered_bytes"] == 3e6 + 7.5e5
    split = dataclasses.replace(split_profile(), trainable_share=0.25)
    rank = memory_per_device(split, Layout("tp", 2, 1, 1, 1, 100, tp=2), "sgd", "fp32", RUNTIME)
    assert (rank["parameters_bytes"], rank["gradients_bytes"], rank["optimizer_bytes"]) == (2.5e6, 6.25e5, 6.25e5)


def test_a_layout_without_tp_ignores_the_split_profile_a_tp_plan_measured():
    # plan --tp 2 measures the split model beside the whole one; a pipeline without --tp holds whole units: stage 0
    # of 2 holds the first two units whole (3 MB), not their split pieces
    m = memory_per_device(split_profile(), Layout("pipeline", 2, 1, 2, 4, 8), "sgd", "fp32", RUNTIME)
    assert m["parameters_bytes"] == 3e6
