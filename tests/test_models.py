import pytest
import torch

from paratrain.errors import UsageError
from paratrain.workloads.models import BasicBlock, PreActBottleneck, build_model, residual_blocks


def _count(model):
    return sum(p.numel() for p in model.parameters())


def test_tutorial_cnn_is_the_tutorials():
    model = build_model("cifar10-cnn")
    assert _count(model) == 62006
    assert list(model.state_dict()) == [
        f"{n}.{k}" for n in ("conv1", "conv2", "fc1", "fc2", "fc3") for k in ("weight", "bias")
    ]
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name, params", [("resnet18", 11.17e6), ("resnet50v2", 23.5e6)])
def test_resnets_have_the_known_size(name, params):
    assert _count(build_model(name)) == pytest.approx(params, rel=0.03)


@pytest.mark.parametrize("name", ["resnet18", "resnet50v2", "resnet152v2"])
@pytest.mark.parametrize("size", [32, 128])
def test_resnets_take_any_input_size(name, size):
    model = build_model(name, num_classes=7, image_size=size).eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 3, size, size)).shape == (1, 7)


@pytest.mark.parametrize("name", ["resnet18", "resnet50v2"])
def test_a_resnet_refuses_images_smaller_than_its_downsampling(name):
    # three stride-2 stages with the small-image stem: 8 px is the smallest that reaches the pooling
    with pytest.raises(
        UsageError,
        match=f"{name} needs images of at least 8 px a side, its total downsampling .got 7.; use --image-size 8 or "
        "more",
    ):
        build_model(name, image_size=7)
    assert build_model(name, image_size=8).eval()(torch.zeros(1, 3, 8, 8)).shape == (1, 10)


def test_residual_blocks_are_the_checkpointing_units():
    blocks = residual_blocks(build_model("resnet50v2"))
    assert len(blocks) == 16 and all(isinstance(b, PreActBottleneck) for b in blocks)
    assert all(isinstance(b, BasicBlock) for b in residual_blocks(build_model("resnet18")))
    assert len(residual_blocks(build_model("cifar10-cnn"))) == 5


def test_unknown_model():
    with pytest.raises(UsageError, match="cifar10-cnn"):
        build_model("vgg16")


def test_checkpointing_every_second_block_wraps_the_second_and_fourth_and_keeps_the_gradients():
    """--checkpoint-activations-every 2 recomputes blocks 2 and 4 of gpt-tiny's four (torchtitan's selective
    layer checkpointing counts from one); what backward computes is unchanged."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from paratrain.workloads import gpt
    from paratrain.workloads.models import checkpoint_blocks

    torch.manual_seed(0)
    plain = gpt.GPT(gpt.resolve("gpt-tiny"))
    wrapped = gpt.GPT(gpt.resolve("gpt-tiny"))
    wrapped.load_state_dict(plain.state_dict())
    chosen = checkpoint_blocks(wrapped, every=2)
    assert chosen == [wrapped.blocks[1]._checkpoint_wrapped_module, wrapped.blocks[3]._checkpoint_wrapped_module]
    assert [isinstance(b, CheckpointWrapper) for b in wrapped.blocks] == [False, True, False, True]
    tokens = torch.randint(0, 256, (2, 32))
    for model in (plain, wrapped):
        torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), wrapped.named_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_checkpointing_by_operator_keeps_attention_and_every_other_matrix_product_and_keeps_the_gradients():
    """--checkpoint-activations-ops (torchtitan's selective op checkpointing): in each block the policy keeps
    the fused attention and the 1st, 3rd and 5th of its 6 matrix products (q, v and the MLP's up projection),
    counting afresh in each block, and recomputes the rest; what backward computes is unchanged."""
    from paratrain.workloads import gpt
    from paratrain.workloads.models import SELECTIVE_OBSERVERS, checkpoint_blocks

    torch.manual_seed(0)
    plain = gpt.GPT(gpt.resolve("gpt-tiny"))
    wrapped = gpt.GPT(gpt.resolve("gpt-tiny"))
    wrapped.load_state_dict(plain.state_dict())
    checkpoint_blocks(wrapped, by_operator=True)
    decisions = []
    SELECTIVE_OBSERVERS.append(lambda op, args, kwargs, out, saved: decisions.append((op.__name__, saved)))
    tokens = torch.randint(0, 256, (2, 32))
    try:
        for model in (plain, wrapped):
            torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    finally:
        SELECTIVE_OBSERVERS.clear()
    product = ("mm.default", "addmm.default")  # a Linear on a view of 2 dims: addmm with a bias
    products = [saved for name, saved in decisions if name in product]
    assert products == [True, False, True, False, True, False] * 4
    attention = [saved for name, saved in decisions if "attention" in name]
    assert attention == [True] * 4
    assert not any(saved for name, saved in decisions if name not in product and "attention" not in name)
    for (name, a), (_, b) in zip(plain.named_parameters(), wrapped.named_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_the_operator_policy_decides_in_forward_only_and_whole_blocks_have_no_policy():
    """The policy's own answers (torch.utils.checkpoint's CheckpointPolicy), one call at a time: the 1st and 3rd
    matrix products and attention are kept, the 2nd product and the rest recomputed; a recompute asks nothing.
    Checkpointing whole blocks, and the planner's contexts around them, consult no policy."""
    from contextlib import nullcontext

    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

    from paratrain.workloads.models import SELECTIVE_OBSERVERS, OperatorPolicy, _checkpoint_contexts, checkpoint_blocks

    policy, forward = OperatorPolicy(), SelectiveCheckpointContext(is_recompute=False, op_output=torch.zeros(1))
    aten = torch.ops.aten
    attention = aten._scaled_dot_product_flash_attention_for_cpu.default
    ops = (aten.mm.default, aten.relu.default, aten.addmm.default, aten.mm.default, attention)
    answers = [policy(forward, op) for op in ops]
    keep, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert answers == [keep, recompute, recompute, keep, keep]
    assert policy(SelectiveCheckpointContext(is_recompute=True), aten.mm.default) == recompute
    decisions = []
    SELECTIVE_OBSERVERS.append(lambda *seen: decisions.append(seen))
    try:
        for context in _checkpoint_contexts(False, nullcontext):
            with context:
                torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        checkpoint_blocks(model)  # the default: whole blocks
        model(torch.ones(2, 4)).sum().backward()
    finally:
        SELECTIVE_OBSERVERS.clear()
    assert decisions == []
