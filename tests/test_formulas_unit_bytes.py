"""The plan's per-unit counts and pipeline stage shares on a model small enough to count by hand (#58, item 2).

pipeline_factories.forked_chain on 1x2x2 images, 3 classes: five units,
  u0 Flatten | u1 Linear(4, 4) | u2 ReLU | u3 Fork: trunk Linear(4, 3) read by two Linear(3, 2) heads, summed |
  u4 Linear(2, 3),
measured by profile_model as `plan` measures it (meta device, float32: 4 bytes a number). Every expected figure
is worked out in the comments, per sample unless said. Checked to the byte: a count off by a few bytes (a tensor
counted twice, a cut's tensor held once) fails here.
"""

from fractions import Fraction

import pytest

from paratrain.config import TrainConfig
from paratrain.plan.memory import Layout, memory_per_device, stage_bounds, stage_memory
from paratrain.plan.profile import profile_model

# Saved for backward, per sample:
#   u0 Flatten: nothing (a view).
#   u1 Linear(4, 4): its input (the flattened image, 4 numbers): 16 B. The image needs no gradient, so backward
#      computes only the weight's: 2x4x4 FLOPs forward + 2x4x4 backward = 64.
#   u2 ReLU: its output (4 numbers): 16 B.
#   u3 Fork: the trunk's input, which is u2's output (16 B, held by u2 already: shared with the unit before) and
#      the trunk's output h (3 numbers, 12 B), which BOTH heads' matrix products save: once, 12 B, not 24.
#      Saved 16 + 12 = 28, of which 16 shared. FLOPs: trunk 2x4x3 forward + 2 x 24 backward (input and weight)
#      = 72, each head 2x3x2 + 2 x 12 = 36: 144.
#   u4 Linear(2, 3): its input, the heads' sum (2 numbers): 8 B, saved by no other unit (the sum saves nothing).
#      FLOPs 12 + 24 = 36.
# The model holds 16 + 16 + 28 + 8 - 16 (the ReLU output once) = 52 B; the loss (cross-entropy) saves the
# log-softmax (3 numbers, 12 B) and the int64 targets (8 B): 20 B a sample, and its 4-byte total weight whatever
# the batch.
UNITS = [
    # name, parameter bytes, FLOPs, output bytes, saved, of which the unit before saved too
    ("0", 0, 0, 16, 0, 0),
    ("1", (16 + 4) * 4, 64, 16, 16, 0),
    ("2", 0, 0, 16, 16, 0),
    ("3", (12 + 3 + 6 + 2 + 6 + 2) * 4, 144, 8, 28, 16),
    ("4", (6 + 3) * 4, 36, 12, 8, 0),
]
MODEL_SAVES, LOSS_SAVES, LOSS_FIXED = 52, 20, 4


@pytest.fixture(scope="module")
def measured():
    config = TrainConfig(
        workload="synthetic-cnn",
        model="pipeline_factories:forked_chain",
        synthetic_shape=(1, 2, 2),
        num_classes=3,
        device="cpu",
    )
    return profile_model(config)


def test_each_unit_counted_to_the_byte_and_a_tensor_two_operators_save_once(measured):
    rows = [
        (
            u["name"],
            u["param_bytes"],
            u["flops_per_sample"],
            u["output_bytes_per_sample"],
            u["saved_bytes_per_sample"],
            u["input_saved_bytes_per_sample"],
        )
        for u in measured.units
    ]
    assert rows == UNITS
    assert measured.param_bytes == 240 and measured.param_tensors == 10  # 60 parameters in 5 weights and 5 biases
    assert measured.flops_per_sample == 64 + 144 + 36  # the units' FLOPs are the model's: the loss counts none
    assert measured.largest_unit_bytes == 124  # the fork, the largest FSDP unit
    # the whole model's peak: what its units save (52) and the loss (20) a sample, the loss's total weight fixed
    assert measured.activation_bytes_per_sample == MODEL_SAVES + LOSS_SAVES
    assert measured.loss_activation_bytes_per_sample == LOSS_SAVES
    assert measured.activation_bytes_fixed == LOSS_FIXED


def test_the_stages_are_cut_by_flops_where_worked_out(measured):
    # the units' costs are their FLOPs, at least 1: 1, 64, 1, 144, 36. Two stages: u0-u2 (66) | u3-u4 (180), the
    # cheapest largest run (u0-u3 | u4 would be 210). Three: u0-u2 (66) | u3 (144) | u4 (36).
    assert stage_bounds(measured, 2) == [(0, 3), (3, 5)]
    assert stage_bounds(measured, 3) == [(0, 3), (3, 4), (4, 5)]


def exactly(figure: Fraction) -> object:
    """A figure the plan computes in floats, equal to the exact one well within a byte."""
    return pytest.approx(float(figure), abs=1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_each_stage_holds_its_units_share_and_the_cut_tensor_on_both_sides(measured, schedule):
    # 2 stages, 4 micro-batches of 2 samples (a replica's batch of 8), SGD with momentum, fp32.
    layout = Layout("pipeline", 2, 1, 2, 4, 8, schedule=schedule)
    first, last = stage_memory(measured, layout, "sgd", "fp32")
    # Stage 0 (u0-u2) saves 0 + 16 + 16 = 32 B of the model's 52; stage 1 (u3-u4) 28 + 8 = 36 B: the ReLU output u3
    # reads is held on both sides of the cut, so the shares add up to 68/52, not 1.
    share_first, share_last = Fraction(32, 52), Fraction(36, 52)
    # micro-batches in flight: 1F1B keeps min(M, K - i): 2 on stage 0, 1 on stage 1; GPipe all 4 on both
    in_flight_first, in_flight_last = (2, 1) if schedule == "1f1b" else (4, 4)
    # activations: the stage's share of the 4 fixed bytes and of the model's 52 B a sample, for 2 samples a
    # micro-batch; the last stage also the loss's 20 B a sample
    assert first["activations_bytes"] == exactly(share_first * LOSS_FIXED + 32 * 2 * in_flight_first)
    assert last["activations_bytes"] == exactly(share_last * LOSS_FIXED + (36 + LOSS_SAVES) * 2 * in_flight_last)
    # parameters: stage 0 holds u1's 80 B, stage 1 u3's 124 and u4's 36; as many gradients and momentum
    assert (first["parameters_bytes"], first["gradients_bytes"], first["optimizer_bytes"]) == (80, 80, 80)
    assert (last["parameters_bytes"], last["gradients_bytes"], last["optimizer_bytes"]) == (160, 160, 160)
    assert first["transient_bytes"] == 0  # the loss's backward runs on the last stage only


def test_three_stages_hold_the_cut_tensor_once_each_and_the_plan_reports_the_heaviest(measured):
    # 3 stages, 6 micro-batches of 1 (1F1B: 3, 2 and 1 in flight): u0-u2 saves 32, u3 28 (its 16 B input held by
    # stage 0 too), u4 8; the shares 32/52, 28/52 and 8/52.
    layout = Layout("pipeline", 3, 1, 3, 6, 6)
    stages = stage_memory(measured, layout, "sgd", "fp32")
    expected = [
        Fraction(32, 52) * LOSS_FIXED + 32 * 1 * 3,
        Fraction(28, 52) * LOSS_FIXED + 28 * 1 * 2,
        Fraction(8, 52) * LOSS_FIXED + (8 + LOSS_SAVES) * 1 * 1,
    ]
    assert [s["activations_bytes"] for s in stages] == [exactly(e) for e in expected]
    assert [s["parameters_bytes"] for s in stages] == [80, 124, 36]
    # The heaviest: stage 1, 3 x 124 B of state and 56 + 28/13 B of activations (stage 0: 240 + 96 + 32/13; stage 2
    # 108 + 28 + 8/13 and the loss's backward on one sample); reported with no buffers (the model has none).
    heaviest = memory_per_device(measured, layout, "sgd", "fp32")
    assert heaviest["parameters_bytes"] == 124
    assert heaviest["activations_bytes"] == exactly(expected[1])
    assert heaviest["buffers_bytes"] == 0
