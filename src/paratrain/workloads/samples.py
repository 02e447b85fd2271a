"""A user's samples: `(input, target)` pairs, or dicts of keyword inputs (the Hugging Face convention).

A dict sample holds a model's keyword inputs (`input_ids`, `attention_mask`, `pixel_values`, ...) and its
labels under `labels` (or `label`, `label_ids`, the names transformers' Trainer and collators accept). A batch
of them is a dict of tensors and the labels (`KeywordCollate`), and the model is called with the inputs as
keywords: `model(**inputs, labels=labels)`.

- Batched by default as transformers' DataCollatorWithPadding would: fields that are not numbers (text) are
  dropped, sequences of different lengths are padded on the right to the longest of the batch (labels with
  -100, the index every transformers loss ignores, other fields with 0) and an `attention_mask` is added
  where there was none. `--collate pkg.module:fn` replaces that with the user's own collator (a transformers
  DataCollator, or a function that tokenises text), called with the samples as they are.
- Samples without labels are a causal language model's: their labels are their `input_ids` (padding
  -100), as DataCollatorForLanguageModeling(mlm=False) makes them, unshifted (the model shifts them).

The numbers a model factory is called with are read from the samples, never a default: `num_classes` from
the labels (the largest integer label + 1, or a ClassLabel's count; for float labels, the values in one:
class probabilities), `vocab_size` and `seq_len` from the token ids (`input_ids`, or integer vector inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from paratrain.errors import UsageError
from paratrain.workloads import hf
from paratrain.workloads.objective import IGNORE_INDEX, Inputs

# transformers' names for the labels: Trainer and its collators take `label` and `label_ids` as `labels`.
LABEL_KEYS = ("labels", "label", "label_ids")
TOKENS = "input_ids"


def map_inputs(fn: Callable[[torch.Tensor], torch.Tensor], x: Inputs) -> Inputs:
    """`fn` applied to a batch's input tensor, or to each of its keyword inputs."""
    return {name: fn(value) for name, value in x.items()} if isinstance(x, dict) else fn(x)


def rows(x: Inputs, start: int, stop: int) -> Inputs:
    """Samples start..stop of a batch's inputs (views: no copy)."""
    return map_inputs(lambda t: t[start:stop], x)


def joined(pieces: list[Any]) -> Any:
    """Consecutive pieces of batches (tensors, or dicts of them) as one: sequences of keyword inputs that
    were padded to different lengths are padded to the longest (labels with -100)."""
    if len(pieces) == 1:
        return pieces[0]
    if isinstance(pieces[0], dict):
        return {name: _padded_cat([p[name] for p in pieces], _pad_value(name)) for name in pieces[0]}
    return _padded_cat(pieces, IGNORE_INDEX if not pieces[0].is_floating_point() else 0)


def _padded_cat(tensors: list[torch.Tensor], value: int) -> torch.Tensor:
    if all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors)
    longest = max(t.shape[1] for t in tensors)
    return torch.cat([F.pad(t, (0, longest - t.shape[1]), value=value) for t in tensors])


def _pad_value(name: str) -> int:
    return IGNORE_INDEX if name in LABEL_KEYS else 0


class KeywordSamples(torch.utils.data.Dataset):
    """A map-style dataset of dict samples, and the collate that batches them into (inputs, labels)."""

    def __init__(self, dataset: Any, collate: KeywordCollate):
        self.dataset = dataset
        self.collate = collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


class KeywordCollate:
    """A list of dict samples -> (a dict of input tensors, the labels): padded (module docstring), or by the
    user's collator."""

    def __init__(self, user: Callable[[list[Any]], Any] | None = None):
        self.user = user

    def __call__(self, samples: list[Mapping[str, Any]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if self.user is None:
            return split_labels(padded_batch(samples))
        batch = self.user(samples)
        if not isinstance(batch, Mapping):
            raise UsageError(
                f"--collate returned {type(batch).__name__}; return a dict of tensors (input_ids, ..., labels), "
                "as transformers' collators do"
            )
        return split_labels(numeric_fields(batch))


def padded_batch(samples: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    fields = [numeric_fields(sample) for sample in samples]
    names = list(fields[0])
    other = next((list(f) for f in fields if list(f) != names), None)
    if other is not None:
        raise UsageError(
            f"dict samples hold different fields ({', '.join(names)}; {', '.join(other)}); give every sample the same"
        )
    batch = {name: _stacked(name, [f[name] for f in fields]) for name in names}
    lengths = {len(f[TOKENS]) for f in fields} if TOKENS in batch and batch[TOKENS].dim() == 2 else set()
    if len(lengths) > 1 and "attention_mask" not in batch:
        ids = torch.arange(batch[TOKENS].shape[1])
        batch["attention_mask"] = (ids < torch.tensor([len(f[TOKENS]) for f in fields])[:, None]).long()
    return batch


def numeric_fields(sample: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A sample's fields that are numbers, as tensors; text and other fields a model cannot take are dropped."""
    fields = {}
    for name, value in sample.items():
        if isinstance(value, (str, bytes)):
            continue
        try:
            fields[name] = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            continue  # lists of text, nested objects
    return fields


def _stacked(name: str, values: list[torch.Tensor]) -> torch.Tensor:
    if all(v.shape == values[0].shape for v in values):
        return torch.stack(values)
    if any(v.dim() != 1 for v in values):
        shapes = sorted({tuple(v.shape) for v in values})
        raise UsageError(
            f"the samples' {name!r} have the shapes {shapes[0]} and {shapes[1]}: only sequences are padded to one "
            "length; make them one shape, or pass --collate pkg.module:fn"
        )
    return _padded_cat([v[None] for v in values], _pad_value(name))


def split_labels(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the keyword inputs, the labels): the labels field, else the input ids as a causal LM's labels."""
    key = next((name for name in LABEL_KEYS if name in batch), None)
    if key is not None:
        labels = batch.pop(key)
        return batch, labels
    if TOKENS not in batch:
        raise UsageError(
            f"dict samples hold neither labels ({', '.join(LABEL_KEYS)}) nor input_ids to take them from (they "
            f"hold {', '.join(batch) or 'no numbers'}); add a 'labels' field"
        )
    labels = batch[TOKENS].clone()
    if "attention_mask" in batch:
        labels[batch["attention_mask"] == 0] = IGNORE_INDEX
    return batch, labels


# -- what a model factory is told about the samples -------------------------------------------------


@dataclass
class Facts:
    """What the samples say about the model they need: see the module docstring."""

    num_classes: int | None
    vocab_size: int | None
    seq_len: int | None


@dataclass
class _Values:
    largest: float = -math.inf
    floating: bool = False
    longest: int = 0  # values in the largest sample

    def add(self, largest: float, floating: bool, longest: int) -> None:
        self.largest, self.floating = max(self.largest, largest), self.floating or floating
        self.longest = max(self.longest, longest)

    def add_rows(self, rows: torch.Tensor) -> None:
        """A chunk of samples' values, [samples, ...]."""
        if rows.numel():
            self.add(rows.max().item(), rows.is_floating_point(), math.prod(rows.shape[1:]))

    def classes(self) -> int | None:
        if self.floating:
            return max(self.longest, 1)  # class probabilities, or one value to regress
        return max(int(self.largest) + 1, 2) if self.largest > -math.inf else None


def facts(splits: Iterable[Any], labels_field: int | str | None, tokens_field: int | str | None) -> Facts:
    """What the samples of `splits` say: `labels_field` picks the labels from a sample (an index of a pair or
    a key of a dict), `tokens_field` the token ids; None for what need not be read."""
    labels, ids = _Values(), _Values()
    declared = 0
    for split in splits:
        base = split.dataset if isinstance(split, KeywordSamples) else split
        if isinstance(labels_field, str) and hf.is_hf_dataset(base):
            declared = max(declared, hf.declared_classes(base, labels_field) or 0)
        if labels_field is not None:
            _read(base, labels_field, labels)
        if tokens_field is not None:
            _read(base, tokens_field, ids)
    if ids.floating:
        raise UsageError(f"the token ids ({tokens_field}) hold fractions; token ids are integers")
    classes = labels.classes()
    return Facts(
        num_classes=max(declared, classes or 0) or None,
        vocab_size=int(ids.largest) + 1 if ids.largest > -math.inf else None,
        seq_len=ids.longest or None,
    )


def _read(dataset: Any, field: int | str, into: _Values) -> None:
    """Every sample's `field` into `into`: whole columns where the data has them (a TensorDataset's tensors,
    a datasets.Dataset's Arrow columns), else sample by sample."""
    if isinstance(dataset, torch.utils.data.Subset) and isinstance(dataset.dataset, torch.utils.data.TensorDataset):
        into.add_rows(dataset.dataset.tensors[field][list(dataset.indices)])
        return
    if isinstance(dataset, torch.utils.data.TensorDataset):
        into.add_rows(dataset.tensors[field])
        return
    declared = _declared_targets(dataset) if field == 1 else None
    if declared is not None:
        into.add_rows(declared)
        return
    if hf.is_hf_dataset(dataset):
        stats = hf.column_stats(dataset, field)
        if stats is not None:
            into.add(*stats)
            return
    for index in range(len(dataset)):
        sample = dataset[index]
        value = sample[field] if isinstance(field, int) or field in sample else None
        if value is not None and not isinstance(value, (str, bytes)):
            into.add_rows(torch.as_tensor(value)[None])


def _declared_targets(dataset: Any) -> torch.Tensor | None:
    """The labels a dataset keeps beside its samples, torchvision's convention (`targets`: CIFAR10, MNIST,
    ImageFolder), read without loading a sample: the pass sample by sample would decode every image first."""
    indices = None
    if isinstance(dataset, torch.utils.data.Subset):  # a random_split of one dataset
        dataset, indices = dataset.dataset, list(dataset.indices)
    targets = getattr(dataset, "targets", None)
    if targets is None or not hasattr(dataset, "__len__"):
        return None
    try:
        labels = torch.as_tensor(targets)
    except (TypeError, ValueError, RuntimeError):
        return None
    if labels.dim() != 1 or len(labels) != len(dataset):
        return None
    return labels[indices] if indices is not None else labels
