"""Hugging Face models and datasets, taken as they come: no wrapper for the user to write.

`transformers` and `datasets` are optional: nothing here imports either unless the run already uses it
(a model factory imported transformers; a dataset factory returned a `datasets` object) or a `--dataset`
names a directory written by `datasets`' `save_to_disk`.

- Causal language models shift their labels themselves: `GPT2LMHeadModel(input_ids, labels=input_ids)`
  scores logits[:, t] against labels[:, t + 1]. Given next-token targets, such a model shifts them a second
  time and learns to predict two tokens ahead. The rule for "shifts its labels" is transformers' own list of
  causal LMs: a `PreTrainedModel` whose class, or a class it derives from, is one `AutoModelForCausalLM`
  builds (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`: `GPT2LMHeadModel`, `LlamaForCausalLM`, `BertLMHeadModel`, ...),
  or whose loss is transformers' causal-LM loss (`loss_type == "ForCausalLM"`, as a `*ForCausalLM` class of
  remote code has). Every model of that list documents "the labels are shifted inside the model, i.e. you
  can set labels = input_ids".
- A `datasets.Dataset` is read in torch format (its lists become tensors, its text columns stay strings and
  are dropped when batched: workloads/samples.py); a `DatasetDict` gives its `train` split and its `test`
  split (else `validation`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from torch import nn

from paratrain.errors import UsageError

# The splits a DatasetDict's held-out data is taken from, in order of preference.
HELD_OUT_SPLITS = ("test", "validation")


def shifts_labels(model: nn.Module) -> bool:
    """True for a transformers causal LM: it compares logits[:, t] with labels[:, t + 1] inside (module docstring)."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return False  # transformers never imported: the model cannot be one of its classes
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set()
    for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        causal.update((names,) if isinstance(names, str) else names)
    return getattr(model, "loss_type", None) == "ForCausalLM" or any(
        cls.__name__ in causal for cls in type(model).__mro__
    )


def is_hf_data(value: Any) -> bool:
    """A `datasets.Dataset` or `DatasetDict` (false without importing `datasets` when nothing has)."""
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(value, (datasets.Dataset, datasets.DatasetDict))


def is_saved_dataset(spec: str) -> bool:
    """A directory `save_to_disk` wrote: a Dataset (state.json) or a DatasetDict (dataset_dict.json)."""
    path = Path(spec).expanduser()
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def load_saved(spec: str) -> Any:
    """`datasets.load_from_disk`: memory-mapped Arrow files, read without the hub."""
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"--dataset {spec} is a Hugging Face dataset saved to disk; reading it needs the datasets package "
            "(pip install datasets)"
        ) from None
    try:
        return datasets.load_from_disk(str(Path(spec).expanduser()))
    except Exception as exc:  # a damaged or foreign directory is the user's to fix
        raise UsageError(f"--dataset {spec}: cannot load it with datasets.load_from_disk ({exc})") from None


def as_torch(value: Any, spec: str) -> Any:
    """A Dataset in torch format, or a DatasetDict as its (train, held-out) pair of them."""
    if isinstance(value, sys.modules["datasets"].DatasetDict):
        held_out = next((name for name in HELD_OUT_SPLITS if name in value), None)
        if "train" not in value or held_out is None:
            raise UsageError(
                f"dataset {spec!r} has the splits {', '.join(value) or 'none'}; paratrain trains on 'train' and "
                "tests on 'test' (or 'validation'): rename them, or return one Dataset to hold out 20 % of it"
            )
        return value["train"].with_format("torch"), value[held_out].with_format("torch")
    return value.with_format("torch")


def column_stats(dataset: Any, name: str) -> tuple[float, bool, int] | None:
    """(the largest value, whether it is a fraction, the values in the longest row) of a numeric column, read
    from its Arrow data without decoding a row; None for a column of another kind (text, nested lists)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = dataset.with_format("arrow", columns=[name])[:].column(name)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        values, longest = pc.list_flatten(column), pc.max(pc.list_value_length(column)).as_py() or 0
    else:
        values, longest = column, 1
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)) or not len(values):
        return None
    return pc.max(values).as_py(), pa.types.is_floating(values.type), longest


def declared_classes(dataset: Any, name: str) -> int | None:
    """The classes a `ClassLabel` column declares (some may have no sample in this split), else None."""
    feature = dataset.features.get(name)
    return getattr(feature, "num_classes", None)


def is_hf_dataset(value: Any) -> bool:
    """A `datasets.Dataset` (its columns can be read whole: `column_stats`)."""
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(value, datasets.Dataset)
