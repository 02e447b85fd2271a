"""Hugging Face models and datasets through --model and --dataset, with no wrapper: dict samples, the model's
own loss, causal LMs given their labels unshifted, accuracy aligned as their loss, classes read from the data,
a datasets.Dataset saved to disk. Tiny configs built from their config classes: nothing is downloaded."""

import json
from pathlib import Path

import pytest
import torch
from conftest import free_port, start_ranks, train_spawned

pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

import hf_factories  # noqa: E402  (needs transformers: after the skip)

from paratrain.config import TrainConfig  # noqa: E402
from paratrain.engine.preflight import check_loss  # noqa: E402
from paratrain.errors import UsageError  # noqa: E402
from paratrain.plan.profile import _shapes  # noqa: E402
from paratrain.workloads import load_data  # noqa: E402
from paratrain.workloads.objective import Objective  # noqa: E402
from paratrain.workloads.samples import KeywordCollate, joined  # noqa: E402

PATTERN_VOCAB = hf_factories.FIRST_TOKEN + hf_factories.PERIOD  # the largest pattern token + 1
COMMON = dict(workers=2, epochs=2, batch_size=8, optimizer="adamw", lr=3e-3, checkpoint_every=1, log_every=1)
PLACEMENT = dict(backend="gloo", device_type="cpu", threads_per_worker=1)
# GPT-2 without dropout (its draws differ between one process and micro-batches), by SGD (Adam would magnify float
# noise in a gradient that is zero in exact arithmetic): one process and 2 pipeline stages compare exactly.
STAGED = dict(
    COMMON, model="hf_factories:gpt2_four_blocks", dataset="hf_factories:pattern_pairs", optimizer="sgd", lr=0.1
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _spawned_rank(rank: int, out: str, ports: list[int], runs: dict) -> None:
    train_spawned(rank, Path(out), ports, runs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """GPT-2, Llama and BERT trained one after another by the same two gloo ranks (transformers imported
    once): each run's summary and the checkpoint of its last epoch's weights in runs/<name>."""
    out = tmp_path_factory.mktemp("hf")
    ids = hf_factories.pattern(128, 16, seed=2)
    datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"input_ids": ids[:96].tolist()}),
        test=datasets.Dataset.from_dict({"input_ids": ids[96:].tolist()}),
    ).save_to_disk(out / "saved")
    spawned = {
        "gpt2": (dict(COMMON, model="hf_factories:gpt2", dataset="hf_factories:pattern_pairs"), PLACEMENT),
        "llama": (dict(COMMON, model="hf_factories:llama", dataset=str(out / "saved")), PLACEMENT),
        "bert": (dict(COMMON, model="hf_factories:bert", dataset="hf_factories:sentence_pairs", lr=1e-3), PLACEMENT),
        "gpt2-alone": (dict(STAGED, workers=1), PLACEMENT),
        "gpt2-stages": (dict(STAGED, strategy="pipeline", microbatches=2), PLACEMENT),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARATRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        start_ranks(_spawned_rank, (str(out), [free_port() for _ in spawned], spawned), nprocs=2)
    return out


def _trained(runs: Path, name: str) -> tuple[dict, dict]:
    """A run's summary and the weights it ended with (its checkpoint after the last epoch)."""
    summary = json.loads((runs / name / "summary.json").read_text())
    assert summary["status"] == "completed"
    return summary, torch.load(runs / name / "checkpoint.pt", weights_only=True)["model"]


def _own(model: torch.nn.Module, weights: dict, **batch):
    """The model's own output (loss and logits) on a batch, with the run's last weights."""
    model.load_state_dict(weights)
    with torch.no_grad():
        return model.eval()(**batch)


def _causal_accuracy(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return (logits[:, :-1].argmax(-1) == ids[:, 1:]).float().mean().item()


def test_gpt2_on_next_token_pairs_is_given_its_labels_unshifted(runs):
    """GPT2LMHeadModel shifts its labels itself: on (input, next-token target) pairs it gets the inputs as
    labels, so paratrain's test loss is the model's own on input_ids=labels=x, and it learns the next token
    (shifted twice it would learn the one after, and score 0 %)."""
    summary, weights = _trained(runs, "gpt2")
    x = hf_factories.pattern_pairs()[1].tensors[0]
    own = _own(hf_factories.gpt2(vocab_size=PATTERN_VOCAB, seq_len=x.shape[1]), weights, input_ids=x, labels=x)
    assert summary["test_loss"] == pytest.approx(own.loss.item(), rel=1e-4)
    assert summary["test_accuracy"] == pytest.approx(_causal_accuracy(own.logits, x), abs=1e-6)
    assert summary["test_accuracy"] > 0.9, f"chance is {1 / hf_factories.PERIOD:.0%}"


def test_gpt2_in_two_pipeline_stages_trains_as_one_process(runs):
    """GPT2LMHeadModel computes a mask and position embeddings before its blocks and a norm and the head after:
    the pipeline reads its units from its forward graph (a prologue, 4 blocks, an epilogue) and computes the model's
    own shifted loss from the last stage's logits. 2 stages train to one process's losses and weights."""
    alone, _ = _trained(runs, "gpt2-alone")
    staged, weights = _trained(runs, "gpt2-stages")
    split = staged["pipeline"]["split"]
    assert split[0][0] == "prologue" and split[-1][-1] == "epilogue" and sum(map(len, split)) == 6, split
    one, two = (_step_losses(runs / name) for name in ("gpt2-alone", "gpt2-stages"))
    assert one.keys() == two.keys() and len(one) >= 8
    assert list(two.values()) == pytest.approx(list(one.values()), rel=1e-5)
    assert staged["test_loss"] == pytest.approx(alone["test_loss"], rel=1e-5)
    assert staged["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1e-6)
    _, single = _trained(runs, "gpt2-alone")
    assert single.keys() == weights.keys()
    for key in single:
        torch.testing.assert_close(weights[key], single[key], rtol=1e-5, atol=1e-6, msg=key)


def test_gpt2_is_planned_in_stages(capsys):
    """plan --pp 2 of GPT2LMHeadModel: 6 units read from its forward graph, priced as 2 stages."""
    from paratrain.cli import main

    argv = ["plan", "--model", "hf_factories:gpt2_four_blocks", "--dataset", "text", "--seq-len", "16"]
    assert main([*argv, "--device", "cpu", "--gpus", "2", "--batch-size", "8", "--pp", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"]["pipeline_units"] == 6
    (row,) = [r for r in result["rows"] if r["devices"] == 2]
    assert row["strategy"] == "pipeline" and row["stages"] == 2, row


def _step_losses(run_dir: Path) -> dict[int, float]:
    events = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {e["step"]: e["loss"] for e in events if e["event"] == "step"}


def test_llama_on_a_saved_dataset_of_dict_samples_without_labels(runs):
    """--dataset names a directory save_to_disk wrote; its samples hold input_ids only, a causal LM's: their
    labels are the input ids, unshifted."""
    summary, weights = _trained(runs, "llama")
    x = hf_factories.pattern(128, 16, seed=2)[96:]
    own = _own(hf_factories.llama(vocab_size=PATTERN_VOCAB, seq_len=16), weights, input_ids=x, labels=x)
    assert summary["test_loss"] == pytest.approx(own.loss.item(), rel=1e-4)
    assert summary["test_accuracy"] == pytest.approx(_causal_accuracy(own.logits, x), abs=1e-6)
    assert summary["test_accuracy"] > 0.9, f"chance is {1 / hf_factories.PERIOD:.0%}"


def test_bert_is_built_for_the_datas_classes_and_trained_on_its_own_loss(runs):
    """Dict samples with a `label` and a text field: the factory (10 classes by default) is told the data's 2,
    the text is dropped, and the loss is the model's own on input_ids, attention_mask and labels."""
    summary, weights = _trained(runs, "bert")
    assert weights["classifier.weight"].shape[0] == 2
    test = hf_factories.sentences(32, seed=1)
    inputs = {name: torch.stack([s[name] for s in test]) for name in ("input_ids", "attention_mask")}
    labels = torch.tensor([s["label"] for s in test])
    own = _own(hf_factories.bert(num_classes=2), weights, **inputs, labels=labels)
    assert summary["test_loss"] == pytest.approx(own.loss.item(), rel=1e-4)
    assert summary["test_accuracy"] == pytest.approx((own.logits.argmax(-1) == labels).float().mean().item())


def test_classes_are_read_from_the_labels_unless_given(tmp_path):
    """Not a default: the largest label + 1, a ClassLabel's declared count, or --num-classes as given."""

    def read(**config):
        return load_data(TrainConfig(model="hf_factories:bert", **config))

    sentences = read(dataset="hf_factories:sentence_pairs")
    assert sentences.num_classes == 2
    check_loss(TrainConfig(model="hf_factories:bert", dataset="hf_factories:sentence_pairs"), sentences)
    assert read(dataset="user_factories:one_vector_dataset").num_classes == 2
    assert read(dataset="hf_factories:sentence_pairs", num_classes=5).num_classes == 5
    rows = {"input_ids": [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], "label": [0, 1, 2, 0, 1]}
    three_of_four = datasets.Dataset.from_dict(rows).cast_column("label", datasets.ClassLabel(num_classes=4))
    three_of_four.save_to_disk(tmp_path / "declared")
    data = read(dataset=str(tmp_path / "declared"))
    assert (data.num_classes, data.vocab_size, data.shape) == (4, 11, (2,))
    assert (len(data.train), len(data.test)) == (4, 1), "one Dataset: 20 % held out"
    # the plan, which knows text's shapes without reading it, tells a factory its 256 bytes too
    assert _shapes(TrainConfig(dataset="text", model="hf_factories:gpt2")).vocab_size == 256


def test_dict_samples_are_padded_and_a_causal_lms_labels_are_its_input_ids():
    samples = [{"input_ids": [5, 6, 7], "text": "abc"}, {"input_ids": [8], "text": "d"}]
    inputs, labels = KeywordCollate()(samples)
    assert set(inputs) == {"input_ids", "attention_mask"}, "text dropped, a mask added for the padding"
    assert inputs["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels.tolist() == [[5, 6, 7], [8, -100, -100]], "padding counts in no loss"

    inputs, labels = KeywordCollate()([{"input_ids": [1, 2], "label": 1}, {"input_ids": [3], "label": 0}])
    assert labels.tolist() == [1, 0] and "label" not in inputs

    seen = []
    mine = KeywordCollate(lambda batch: seen.append(batch) or {"input_ids": torch.ones(2, 4), "labels": torch.zeros(2)})
    inputs, labels = mine(samples)
    assert seen == [samples], "a user's collator gets the samples as they are"
    assert list(inputs) == ["input_ids"] and labels.tolist() == [0, 0]
    with pytest.raises(UsageError, match="--collate returned tuple; return a dict of tensors"):
        KeywordCollate(lambda batch: (torch.ones(2, 4), torch.zeros(2)))(samples)

    # pieces of batches padded to different lengths join (a forward that spans two loaded batches)
    both = joined(
        [{"input_ids": torch.ones(1, 2, dtype=torch.long)}, {"input_ids": torch.ones(1, 3, dtype=torch.long)}]
    )
    assert both["input_ids"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert joined([torch.tensor([[1]]), torch.tensor([[2, 3]])]).tolist() == [[1, -100], [2, 3]]


def test_a_causal_lms_accuracy_is_aligned_as_its_loss_and_skips_ignored_targets():
    ids = torch.tensor([[3, 1, 2, 0]])
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 3]]), 4).float()  # logits[t] predicts ids[t + 1]
    causal = Objective(target_parameter="labels", shifts_labels=True)
    # on pairs (x, next tokens) the inputs are the labels: 2 of the 3 next tokens are right (0 is missed)
    assert causal.correct(logits, ids, ids[:, 1:]).item() == pytest.approx(2 / 3)
    # on dict samples the labels are the samples' own; -100 counts neither as a hit nor a miss
    labels = torch.tensor([[3, 1, 2, -100]])
    assert causal.correct(logits, {"input_ids": ids}, labels).item() == pytest.approx(1.0)
    assert Objective().correct(logits[:, :3], ids[:, :3], ids[:, 1:]).item() == pytest.approx(2 / 3)
