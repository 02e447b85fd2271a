"""The planner measures a deep model at three shallow depths and draws each number to its full depth
(plan/depth.py): the numbers must be exactly those of measuring it whole, and a model whose blocks are
not alike in cost must be measured whole.

Each case profiles the model twice, once as the plan does and once with the shallow depths turned off,
and compares every field of the two profiles.
"""

import dataclasses

import pytest
import torch
from torch import nn

from paratrain.config import TrainConfig
from paratrain.config.parallelism import TensorParallelOptions
from paratrain.plan import depth, profile

# gpt blocks at a width that keeps them quick on the meta device; 7 is the fewest measured at depths (1, 2, 3)
GPT = dict(workload="gpt-tiny", seq_len=32, n_embd=32, n_head=2, n_layer=7)
TEXT = dict(dataset="text", seq_len=32)
EVERY_2ND = dict(checkpoint_activations=True, checkpoint_activations_every=2)


@pytest.fixture
def stacks(monkeypatch):
    """The stacks the profile's measurements were drawn along (None: measured whole), in call order."""
    seen = []

    def recording(*args, **kwargs):
        numbers, stack = depth.measure_deep(*args, **kwargs)
        seen.append(stack)
        return numbers, stack

    monkeypatch.setattr(profile, "measure_deep", recording)
    return seen


def _profiles(cfg: TrainConfig, tp: int | None, monkeypatch) -> tuple[dict, dict]:
    """(as planned, measured whole): every field of the profile, the FLOP cache cleared before each."""

    def measured():
        profile._FLOPS.clear()
        profile._TRAFFIC.clear()
        result = (
            profile.profile_tensor_parallel(cfg, TensorParallelOptions(tp=tp)) if tp else profile.profile_model(cfg)
        )
        return dataclasses.asdict(result)

    planned = measured()
    with monkeypatch.context() as whole:
        whole.setattr(depth, "depths", lambda length, period: None)
        return planned, measured()


@pytest.mark.parametrize(
    "overrides, tp",
    [
        pytest.param(GPT, None, id="gpt-7-blocks"),
        # in 16 bits the memory traffic is counted on a bf16 copy
        pytest.param(dict(GPT, precision="bf16"), None, id="gpt-7-blocks-bf16"),
        # 22 = 3 x 7 + 1: the last block is not checkpointed, and the depths (4, 7, 10) keep that remainder
        pytest.param(
            dict(GPT, n_layer=22, checkpoint_activations=True, checkpoint_activations_every=3), None, id="gpt-every-3rd"
        ),
        # by operator: what the policy keeps and the FLOPs it recomputes, drawn along the stack as well
        pytest.param(
            dict(GPT, checkpoint_activations=True, checkpoint_activations_ops=True), None, id="gpt-by-operator"
        ),
        # torchtitan's layout: the blocks in an nn.ModuleDict
        pytest.param(
            dict(model="user_factories:deep_dict_layered_net", dataset="user_factories:float_pairs"),
            None,
            id="user-model-module-dict",
        ),
        # a user's model (blocks taking a second input) split 2 ways, every 2nd of 17 blocks checkpointed
        pytest.param(
            dict(TEXT, model="user_factories:deep_tabled_net", **EVERY_2ND),
            2,
            id="user-model-tp2-every-2nd",
        ),
    ],
)
def test_a_deep_model_measured_at_shallow_depths_gives_the_numbers_of_measuring_it_whole(
    overrides, tp, stacks, monkeypatch
):
    planned, whole = _profiles(TrainConfig(**overrides), tp, monkeypatch)
    assert planned == whole
    drawn = [s for s in stacks[: len(stacks) // 2] if s is not None]  # the plan's calls, not the whole ones
    # the FLOP count, the saved-tensor peaks and (measuring the whole model) the memory traffic were drawn
    # along the stack of blocks
    stack = "layers" if overrides.get("model", "").endswith("dict_layered_net") else "blocks"
    assert len(drawn) == (2 if tp else 3) and {s.path for s in drawn} == {stack}


@pytest.mark.parametrize("factory", ["alternating_net", "counted_net"])
def test_blocks_unlike_in_cost_or_a_forward_that_needs_them_all_are_measured_whole(factory, stacks, monkeypatch):
    """alternating_net: every 2nd block runs twice, so the three depths are off one line (drawn through the
    first two, its FLOPs would be 13 blocks' worth, not 10). counted_net: its forward fails when cut."""
    planned, whole = _profiles(TrainConfig(**TEXT, model=f"user_factories:{factory}"), None, monkeypatch)
    assert planned == whole
    assert stacks and all(s is None for s in stacks)


def test_the_depths_keep_the_remainder_of_the_checkpointing_period_and_are_skipped_where_they_cost_as_much():
    assert depth.depths(80, 1) == (1, 2, 3)
    assert depth.depths(80, 3) == (5, 8, 11)  # 80 = 3 x 26 + 2
    assert depth.depths(126, 4) == (6, 10, 14)  # 126 = 4 x 31 + 2
    assert depth.depths(7, 1) == (1, 2, 3)  # 6 blocks run instead of 7
    assert depth.depths(6, 1) is None
    assert depth.depths(15, 2) is None  # (3, 5, 7): 15 blocks run, as many as measuring it whole


def test_the_line_is_drawn_through_the_first_two_depths_and_checked_at_the_third():
    chosen = (5, 8, 11)
    readings = [{"flops": 100 + 30 * d, "fixed": 7} for d in chosen]
    assert depth.line_to(readings, chosen, 80) == {"flops": 100 + 30 * 80, "fixed": 7}
    off = [*readings[:2], {"flops": 100 + 30 * 11 + 1, "fixed": 7}]
    assert depth.line_to(off, chosen, 80) is None
    assert depth.line_to([*readings[:2], {"flops": 430}], chosen, 80) is None  # not the same numbers


def test_the_stack_is_the_heaviest_container_of_alike_blocks():
    model = nn.Module()
    model.light = nn.ModuleList(nn.Linear(4, 4) for _ in range(6))
    model.trunk = nn.Module()
    model.trunk.layers = nn.Sequential(*(nn.Linear(8, 8) for _ in range(3)))
    model.unlike = nn.ModuleList([nn.Linear(64, 64), nn.Linear(64, 65)])  # heaviest, but not alike
    stack = depth.find_stack(model)
    assert stack == depth.Stack("trunk.layers", ("0", "1", "2"))
    assert stack.item_of("trunk.layers.2.weight") == "2" and stack.item_of("trunk.layers_x.2") is None
    assert stack.as_first("trunk.layers.2") == "trunk.layers.0" and stack.as_first("light.3") == "light.3"
    cut = depth.shallow_copy(model, stack, 2)
    assert len(cut.trunk.layers) == 2 and len(model.trunk.layers) == 3  # the model itself is left whole
    assert depth.find_stack(nn.Sequential(nn.Linear(2, 2))) is None
    # torchtitan keeps its blocks in a ModuleDict keyed "0", "1", ...: a stack too, cut to its first items
    model.blocks = nn.ModuleDict({str(i): nn.Linear(16, 16) for i in range(4)})
    stack = depth.find_stack(model)
    assert stack == depth.Stack("blocks", ("0", "1", "2", "3"))
    cut = depth.shallow_copy(model, stack, 3)
    assert list(cut.blocks) == ["0", "1", "2"] and isinstance(cut.blocks, nn.ModuleDict) and len(model.blocks) == 4


def test_alike_means_the_same_classes_and_tensors_and_ties_go_to_the_first_stack():
    """Each case kills a plausible mistake in find_stack (scripts/mutate.py plan/depth.py)."""

    def normed(width: int) -> nn.Module:
        block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(width))
        return block

    model = nn.Module()
    model.unlike = nn.ModuleList([nn.Linear(64, 64), nn.Linear(64, 65)])  # first in order, and not alike
    model.buffers_differ = nn.ModuleList([normed(4), normed(4)])
    model.buffers_differ[1][1].register_buffer("extra", torch.zeros(3))  # the same parameters, one more buffer
    model.kinds_differ = nn.ModuleList(
        [nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 8), nn.GELU())]
    )
    model.pair = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])  # two alike items are a stack
    model.twin = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])  # as heavy: the first keeps it
    assert depth.find_stack(model) == depth.Stack("pair", ("0", "1"))


def test_a_model_without_a_stack_is_measured_whole_on_a_copy():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    def measure(measured: nn.Module) -> dict:
        measured[1] = nn.GELU()  # a measurement may change the model it is given (checkpointing wraps blocks)
        return {"count": 3}

    assert depth.measure_deep(model, 1, measure) == ({"count": 3}, None)
    assert isinstance(model[1], nn.ReLU)
    drawn = depth.line_to([{"flops": 100 + 30 * d} for d in (5, 8, 11)], (5, 8, 11), 80)
    assert type(drawn["flops"]) is int  # byte and FLOP counts stay integers


def test_the_flops_are_counted_once_whatever_the_checkpointing():
    """Checkpointing wraps the blocks after the count and changes no FLOPs of the model: plan --search's four
    choices share one count (the 8B model's takes seconds)."""
    profile._FLOPS.clear()
    profile._TRAFFIC.clear()
    for flags in (
        {},
        dict(checkpoint_activations=True, checkpoint_activations_every=2),
        EVERY_2ND | {"checkpoint_activations_ops": True},
    ):
        profile.profile_model(TrainConfig(**GPT, **flags))
    assert len(profile._FLOPS) == 1 and len(profile._TRAFFIC) == 1
