"""Named workloads: a model and a dataset, resolved from a TrainConfig.

A workload is only a pair of names; `--model` and `--dataset` override either half, with a
registered name or a user's own `pkg.module:factory`. Image workloads pair a classifier with
CIFAR-10 or synthetic images; text workloads pair a `gpt` preset with byte-level text
(workloads/text.py). The loss comes with the workload (workloads/objective.py). A user's samples
(pairs, or dicts of keyword inputs) are read in workloads/samples.py, Hugging Face datasets and
models recognised in workloads/hf.py.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from paratrain.config import TrainConfig
from paratrain.config.workload import SYNTHETIC_CLASSES, WORKLOADS, Workload
from paratrain.errors import UsageError
from paratrain.workloads import datasets, gpt, hf, models, samples, text

DEFAULT_SEQ_LEN = 256  # text windows for models that are not gpt presets


@dataclass
class TrainingData:
    """The splits one run trains and evaluates on.

    `train`, `val`, `test` are either `datasets.Split` (uint8 tensors: the fast in-memory path) or
    map-style torch Datasets from a user factory (fed through a DataLoader; `samples.KeywordSamples`
    for dict samples).
    """

    train: Any
    test: Any
    val: Any | None
    num_classes: int | None  # None: dict samples whose labels only the user's collator makes
    shape: tuple[int, ...]  # C,H,W of an image; (seq_len,) of text; any shape of features
    features: bool = False  # float samples that are not C,H,W images (vectors, sequences of vectors)
    info: dict[str, Any] = field(default_factory=dict)  # the data's provenance, recorded in config.json
    vocab_size: int | None = None  # token ids: the largest + 1 (the 256 bytes of text)


def workload_of(config: TrainConfig) -> Workload:
    base = WORKLOADS[config.workload]  # a registered name: the config checked it
    return Workload(config.model or base.model, config.dataset or base.dataset, base.description)


def import_factory(spec: str, what: str) -> Callable[..., Any]:
    """Import `pkg.module:factory`, with a one-line error when it cannot be found.

    The working directory is on the import path, as it is for `python -m` and torchrun, so
    `--model mymodels:make_net` finds mymodels.py beside the user without PYTHONPATH.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"{what} {spec!r} is neither a registered name nor of the form pkg.module:factory")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's to fix
        raise UsageError(
            f"{what} factory {spec!r}: cannot import {module_name} ({type(exc).__name__}: {exc})"
        ) from None
    factory: Any = module
    for part in attr.split("."):  # a qualified name: a class's factory method, say
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise UsageError(f"{what} factory {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def _call_with_supported(factory: Callable[..., Any], **kwargs: Any) -> Any:
    """Call a user factory with the keyword arguments it declares (it may declare none); one the data cannot
    tell (None) is left to the factory's default."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    params = inspect.signature(factory).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return factory(**kwargs)
    return factory(**{k: v for k, v in kwargs.items() if k in params})


def load_data(config: TrainConfig) -> TrainingData:
    """Load the dataset (decoded once, then cached) and carve the subsets the config asks for."""
    name = workload_of(config).dataset
    if name == "cifar10":
        data = datasets.load_cifar10(config.data_dir, config.cache_dir)
    elif name == "synthetic":
        data = datasets.load_synthetic(
            config.synthetic_samples, config.synthetic_shape, config.num_classes or SYNTHETIC_CLASSES, seed=config.seed
        )
    elif name == "text":
        return _text_data(config)
    elif hf.is_saved_dataset(name):
        return _generic_data(name, hf.load_saved(name), config)
    else:
        factory = import_factory(name, "dataset")
        data = _call_with_supported(factory, data_dir=config.data_dir)
        if not isinstance(data, datasets.Dataset):
            return _generic_data(name, data, config)

    train, val = data.train, None
    if config.limit_train is not None:
        if config.limit_train < len(data.classes):
            raise UsageError(
                f"--limit-train {config.limit_train} is below the {len(data.classes)} classes: a class-balanced "
                f"subset needs a sample of each; use --limit-train {len(data.classes)} or more"
            )
        train = train.subset(datasets.balanced_subset(train.y, config.limit_train, seed=config.seed))
    if config.val_split > 0:
        keep, held_out = datasets.stratified_split(train.y, config.val_split, seed=config.seed)
        train, val = train.subset(keep), train.subset(held_out)
    return TrainingData(train=train, test=data.test, val=val, num_classes=len(data.classes), shape=data.shape)


def sequence_length(config: TrainConfig) -> int:
    """Tokens per window: --seq-len, else the gpt preset's context, else DEFAULT_SEQ_LEN."""
    model = workload_of(config).model
    return config.seq_len or (gpt.PRESETS[model].block_size if model in gpt.PRESETS else DEFAULT_SEQ_LEN)


def _text_data(config: TrainConfig) -> TrainingData:
    if config.limit_train is not None:
        raise UsageError("--limit-train picks images; a text workload trains on --samples-per-epoch windows instead")
    seq_len = sequence_length(config)
    train, held_out, lengths, info = text.load_corpus(config.data_dir, config.cache_dir)
    val = None
    if config.val_split > 0:
        train, val_tokens = text.carve_validation(train, lengths, config.val_split, config.seed)
        text.check_length(val_tokens, seq_len, "validation")
        val = text.eval_windows(val_tokens, seq_len, config.eval_samples)
    text.check_length(train, seq_len, "training")
    text.check_length(held_out, seq_len, "held-out")
    return TrainingData(
        train=text.TokenStream(train, seq_len, config.samples_per_epoch),
        test=text.eval_windows(held_out, seq_len, config.eval_samples),
        val=val,
        num_classes=gpt.BYTE_VOCAB,
        shape=(seq_len,),
        info=info,
        vocab_size=gpt.BYTE_VOCAB,
    )


# The share of a single Dataset from a factory that is held out as its test split.
TEST_FRACTION = 0.2


def _generic_data(spec: str, result: Any, config: TrainConfig) -> TrainingData:
    if hf.is_hf_data(result):
        result = hf.as_torch(result, spec)
    one = isinstance(result, (torch.utils.data.Dataset, list)) or hf.is_hf_data(result)
    if one and hasattr(result, "__len__"):
        # One Dataset (or a list of samples): a seeded split, the same on every rank and every rerun with the
        # same --seed.
        test_size = max(1, int(len(result) * TEST_FRACTION))
        if len(result) - test_size < 1:
            raise UsageError(f"dataset {spec!r} has {len(result)} sample(s): too few to hold out a test split")
        parts = torch.utils.data.random_split(
            result, [len(result) - test_size, test_size], generator=torch.Generator().manual_seed(config.seed)
        )
        # A datasets.Dataset's rows stay one (its columns are read whole, not sample by sample)
        result = tuple(result.select(part.indices) if hf.is_hf_data(result) else part for part in parts)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UsageError(
            f"dataset factory {spec!r} must return a torch Dataset (or a list of samples), a (train, test) pair of "
            "them, a Hugging Face datasets.Dataset or DatasetDict, or a paratrain Dataset"
        )
    train, test = (hf.as_torch(part, spec) if hf.is_hf_data(part) else part for part in result)
    if config.limit_train is not None or config.val_split > 0:
        raise UsageError(
            "--limit-train and --val-split need labels up front: return a paratrain Dataset from the factory"
        )
    item = train[0]
    if isinstance(item, Mapping):
        return _keyword_data(train, test, config)
    if config.collate is not None:
        raise UsageError(
            f"--collate batches dict samples (Hugging Face style); dataset {spec!r} gives "
            f"{type(item).__name__} samples, which are batched as they are"
        )
    if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], torch.Tensor)):
        raise UsageError(
            f"dataset factory {spec!r}: a sample must be an (input tensor, target) pair or a dict of keyword "
            f"inputs and labels (got {type(item).__name__})"
        )
    sample = item[0]
    # Only these shapes are read: images (C,H,W) give a model in_channels and image_size, integer
    # vectors are token ids (vocab_size, seq_len); anything else is fed to the model as it is.
    features = sample.is_floating_point() and sample.dim() != 3
    token_ids = not sample.is_floating_point() and sample.dim() == 1
    target = torch.as_tensor(item[1])
    # Targets of the inputs' shape, integers like them, are token ids too: next-token targets.
    next_tokens = token_ids and not target.is_floating_point() and target.shape == sample.shape
    read = samples.facts(
        (train, test),
        labels_field=1 if config.num_classes is None or next_tokens else None,
        tokens_field=0 if token_ids else None,
    )
    return TrainingData(
        train=train,
        test=test,
        val=None,
        num_classes=config.num_classes or read.num_classes,
        shape=tuple(sample.shape),
        features=features,
        vocab_size=max(read.vocab_size or 0, read.num_classes or 0) if next_tokens else read.vocab_size,
    )


def _keyword_data(train: Any, test: Any, config: TrainConfig) -> TrainingData:
    """Dict samples: batched by samples.KeywordCollate, the factory told what their labels and token ids say."""
    collate = samples.KeywordCollate(import_factory(config.collate, "--collate") if config.collate else None)
    train, test = samples.KeywordSamples(train, collate), samples.KeywordSamples(test, collate)
    inputs, _ = collate([train[i] for i in range(min(2, len(train)))])  # a batch that cannot be made fails here
    if not inputs:
        raise UsageError("dict samples hold labels and nothing else to feed the model; add its inputs (input_ids, ...)")
    first = train[0]
    tokens = samples.TOKENS if samples.TOKENS in first else None
    labels = next((key for key in samples.LABEL_KEYS if key in first), tokens)  # no labels: the input ids are
    read = samples.facts(
        (train, test), labels_field=labels if config.num_classes is None else None, tokens_field=tokens
    )
    main = inputs.get(samples.TOKENS, next(iter(inputs.values())))
    shape = (read.seq_len,) if read.seq_len is not None else tuple(main.shape[1:])
    return TrainingData(
        train=train,
        test=test,
        val=None,
        num_classes=config.num_classes or read.num_classes,
        shape=shape,
        features=main.is_floating_point() and len(shape) != 3,
        vocab_size=read.vocab_size,
    )


def build_model(config: TrainConfig, data: TrainingData) -> nn.Module:
    """The model for the config, with the seed applied so every rank starts from the same weights."""
    name = workload_of(config).model
    torch.manual_seed(config.seed)
    if name in gpt.PRESETS:
        return gpt.GPT(gpt.resolve(name, config.n_layer, config.n_head, config.n_embd))
    if data.features:
        check_inputs(name, data)
        shape_kwargs = dict(in_features=math.prod(data.shape), input_shape=data.shape)
    elif len(data.shape) == 1:  # text: a user's sequence model
        shape_kwargs = dict(vocab_size=data.vocab_size, seq_len=data.shape[0])
    else:
        shape_kwargs = dict(in_channels=data.shape[0], image_size=config.image_size or data.shape[1])
        if name in models.MODELS:
            return models.build_model(name, num_classes=data.num_classes, **shape_kwargs)
    factory = import_factory(name, "model")
    model = _call_with_supported(factory, num_classes=data.num_classes, **shape_kwargs)
    if not isinstance(model, nn.Module):
        raise UsageError(f"model factory {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def check_inputs(name: str, data: TrainingData) -> None:
    if data.features and name in models.MODELS:
        raise UsageError(
            f"model {name!r} takes C,H,W images and the dataset's samples have shape {data.shape}; "
            "pass --model pkg.module:factory with a model for them"
        )


def check_model(config: TrainConfig) -> None:
    """Fail early, in the launching process, if the model name or factory cannot be resolved or
    the transformer flags do not fit the model."""
    name = workload_of(config).model
    shape_flags = [f for f in ("n_layer", "n_head", "n_embd") if getattr(config, f) is not None]
    if name in gpt.PRESETS:
        shape = gpt.resolve(name, config.n_layer, config.n_head, config.n_embd)
        if config.seq_len is not None and config.seq_len > shape.block_size:
            raise UsageError(
                f"--seq-len {config.seq_len} exceeds {name}'s context of {shape.block_size} tokens; "
                f"use --seq-len {shape.block_size} or less, or a preset with a longer context"
            )
        return
    if shape_flags:
        raise UsageError(
            f"--{shape_flags[0].replace('_', '-')} shapes the gpt models only; "
            f"{name!r} is not one (choose from {', '.join(gpt.PRESETS)})"
        )
    if name not in models.MODELS:
        import_factory(name, "model")
    elif config.image_size is not None:
        # The model knows the smallest size it takes; built on the meta device (shapes only, no
        # weights) it refuses one below that here, before a run directory exists.
        with torch.device("meta"):
            models.build_model(name, image_size=config.image_size)
    if config.seq_len is not None and workload_of(config).dataset in ("cifar10", "synthetic"):
        raise UsageError("--seq-len applies to text workloads (e.g. --workload gpt-tiny), not to images")
