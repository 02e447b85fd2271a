"""Pipeline units read from a model's forward graph (engine/strategies/pipeline_trace.py), in one process: nanoGPT's
layout and Hugging Face's GPT-2 and Llama, cut into a prologue, their blocks and an epilogue, give the model's own
output and gradients when applied in order, in training and in evaluation."""

import functools

import pytest
import torch
from pipeline_factories import NanoGPT
from torch import nn

from paratrain.engine.strategies.pipeline_split import StageModule, model_units, run_units
from paratrain.engine.strategies.pipeline_trace import GraphUnit
from paratrain.errors import UsageError

transformers = pytest.importorskip("transformers")
import hf_factories  # noqa: E402  (needs transformers: after the skip)

MODELS = {
    "nanogpt": (lambda: NanoGPT(seq_len=16), "transformer.h"),
    "hf-gpt2": (lambda: hf_factories.gpt2(seq_len=16, n_layer=3, dropout=0.0), "transformer.h"),
    "hf-llama": (lambda: hf_factories.llama(seq_len=16), "model.layers"),
}


def _logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


@functools.cache
def _units(name: str) -> list:
    """The model's units, captured once per module on the meta device, on 2 samples (they run on any batch)."""
    with torch.device("meta"):
        model = MODELS[name][0]()
    return model_units(model, torch.zeros(2, 16, dtype=torch.long, device="meta"))


@pytest.mark.parametrize("name", MODELS)
def test_units_read_from_the_graph_give_the_models_output_and_gradients(name):
    make, blocks = MODELS[name]
    x = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(1))
    units = _units(name)
    model = make()
    depth = len(model.get_submodule(blocks))
    assert [u.name for u in units] == ["prologue", *(f"{blocks}.{i}" for i in range(depth)), "epilogue"]
    assert all(isinstance(u.run, GraphUnit) for u in units)
    for training in (True, False):
        model.train(training)
        expected = _logits(model(x))
        expected.float().square().mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        chained = run_units(model, units, x)
        torch.testing.assert_close(chained, expected, rtol=0, atol=0)
        chained.float().square().mean().backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-6, atol=1e-7, msg=n)
        model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", MODELS)
def test_two_stage_modules_give_the_models_output_whatever_passes_between_them(name):
    """Stages built as the pipeline builds them (copies of their units' modules under the model's names): what the
    first gives (the hidden states; with Llama also the causal mask and the rotary cosines and sines) is all the
    second needs, all of it tensors (the batch size is read off them, not sent)."""
    make, _ = MODELS[name]
    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(2))
    units = _units(name)  # captured on 2 samples, run on 4: the batch stays free
    model = make().eval()
    half = len(units) // 2
    first, second = StageModule(model, units[:half]).eval(), StageModule(model, units[half:]).eval()
    handed = first(x)
    handed = handed if isinstance(handed, tuple) else (handed,)
    assert all(isinstance(t, torch.Tensor) for t in handed) and handed[-1].shape[:1] == (4,), handed
    if name == "hf-llama":
        assert len(handed) == 4  # the causal mask and the rotary cosines and sines travel with the hidden states
    torch.testing.assert_close(second(*handed), _logits(model(x)), rtol=0, atol=0)
    names = {n for stage in (first, second) for n, _ in stage.named_parameters(remove_duplicate=False)}
    assert names == {n for n, _ in model.named_parameters(remove_duplicate=False)}


def test_dropout_follows_the_module_mode():
    """Hugging Face's attention passes its dropout as a number fixed at capture: a unit runs the graph captured in
    its module's mode, so evaluation has none and training keeps it."""
    x = torch.randint(0, 256, (2, 16))
    with torch.device("meta"):
        units = model_units(hf_factories.gpt2(seq_len=16, dropout=0.5), x.to("meta"))
    model = hf_factories.gpt2(seq_len=16, dropout=0.5).eval()
    evaluated = run_units(model, units, x)
    torch.testing.assert_close(evaluated, model(x).logits, rtol=0, atol=0)
    model.train()
    assert not torch.allclose(run_units(model, units, x), evaluated)


class Twice(nn.Module):
    """Runs its blocks twice over (weights shared across depth): stages run one order, once."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        h = self.embed(x)
        for _ in range(2):
            for block in self.blocks:
                h = block(h)
        return h.sum(-1)  # its children in order give another shape: the graph is read


class RootTensor(nn.Module):
    """A position table held by the model itself, read by every block."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(8))
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h + self.table)
        return h.sum(-1)


@pytest.mark.parametrize(
    "model,message",
    [
        (Twice, "runs its blocks (blocks) out of order or more than once"),
        (RootTensor, "'table' belongs to the model itself"),
    ],
)
def test_a_graph_that_cannot_be_cut_is_refused_in_one_line(model, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        model_units(model(), torch.randint(0, 16, (2, 4)))
    assert "\n" not in str(refused.value)
