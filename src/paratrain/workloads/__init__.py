"""Named workloads: a model and a dataset, resolved from a TrainConfig.

A workload is only a pair of names; `--model` and `--dataset` override either half, with a
registered name or a user's own `pkg.module:factory`.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from paratrain.config import TrainConfig
from paratrain.errors import UsageError
from paratrain.workloads import datasets, models


@dataclass(frozen=True)
class Workload:
    model: str
    dataset: str
    description: str


WORKLOADS: dict[str, Workload] = {
    "cifar10-cnn": Workload("cifar10-cnn", "cifar10", "the small CNN of PyTorch's CIFAR-10 tutorial on CIFAR-10"),
    "cifar10-resnet18": Workload("resnet18", "cifar10", "ResNet-18 (CIFAR stem) on CIFAR-10"),
    "cifar10-resnet50v2": Workload("resnet50v2", "cifar10", "pre-activation ResNet-50 (v2) on CIFAR-10"),
    "cifar10-resnet152v2": Workload("resnet152v2", "cifar10", "pre-activation ResNet-152 (v2) on CIFAR-10"),
    "synthetic-cnn": Workload("cifar10-cnn", "synthetic", "the tutorial CNN on random images: throughput work"),
    "synthetic-resnet50v2": Workload("resnet50v2", "synthetic", "ResNet-50 v2 on random images (set --synthetic-shape 3,128,128)"),
}


@dataclass
class TrainingData:
    """The splits one run trains and evaluates on.

    `train`, `val`, `test` are either `datasets.Split` (uint8 tensors: the fast in-memory path) or
    map-style torch Datasets from a user factory (fed through a DataLoader).
    """

    train: Any
    test: Any
    val: Optional[Any]
    num_classes: int
    shape: tuple[int, int, int]



def workload_of(config: TrainConfig) -> Workload:
    try:
        base = WORKLOADS[config.workload]
    except KeyError:
        raise UsageError(f"unknown workload {config.workload!r}; choose from {', '.join(WORKLOADS)} "
                         "or pass --model/--dataset") from None
    return Workload(config.model or base.model, config.dataset or base.dataset, base.description)


def import_factory(spec: str, what: str) -> Callable[..., Any]:
    """Import `pkg.module:factory`, with a one-line error when it cannot be found."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"{what} {spec!r} is neither a registered name nor of the form pkg.module:factory")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's to fix
        raise UsageError(f"{what} factory {spec!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"{what} factory {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def _call_with_supported(factory: Callable[..., Any], **kwargs: Any) -> Any:
    """Call a user factory with the keyword arguments it declares (it may declare none)."""
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
        data = datasets.load_synthetic(config.synthetic_samples, config.synthetic_shape, config.num_classes,
                                       seed=config.seed)
    else:
        factory = import_factory(name, "dataset")
        data = _call_with_supported(factory, data_dir=config.data_dir)
        if not isinstance(data, datasets.Dataset):
            return _generic_data(name, data, config)

    train, val = data.train, None
    if config.limit_train is not None:
        train = train.subset(datasets.balanced_subset(train.y, config.limit_train, seed=config.seed))
    if config.val_split > 0:
        keep, held_out = datasets.stratified_split(train.y, config.val_split, seed=config.seed)
        train, val = train.subset(keep), train.subset(held_out)
    return TrainingData(train=train, test=data.test, val=val, num_classes=len(data.classes), shape=data.shape)


def _generic_data(spec: str, result: Any, config: TrainConfig) -> TrainingData:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise UsageError(f"dataset factory {spec!r} must return a paratrain Dataset or a (train, test) pair of torch Datasets")
    train, test = result
    if config.limit_train is not None or config.val_split > 0:
        raise UsageError("--limit-train and --val-split need labels up front: return a paratrain Dataset from the factory")
    sample, _ = train[0]
    shape = tuple(sample.shape)
    if len(shape) != 3:
        raise UsageError(f"dataset factory {spec!r}: samples must be C,H,W tensors (got shape {shape})")
    return TrainingData(train=train, test=test, val=None, num_classes=config.num_classes, shape=shape)  # type: ignore[arg-type]


def build_model(config: TrainConfig, data: TrainingData) -> nn.Module:
    """The model for the config, with the seed applied so every rank starts from the same weights."""
    name = workload_of(config).model
    image_size = config.image_size or data.shape[1]
    torch.manual_seed(config.seed)
    if name in models.MODELS:
        return models.build_model(name, num_classes=data.num_classes, in_channels=data.shape[0], image_size=image_size)
    factory = import_factory(name, "model")
    model = _call_with_supported(factory, num_classes=data.num_classes, in_channels=data.shape[0], image_size=image_size)
    if not isinstance(model, nn.Module):
        raise UsageError(f"model factory {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def check_model(config: TrainConfig) -> None:
    """Fail early, in the launching process, if the model name or factory cannot be resolved."""
    name = workload_of(config).model
    if name not in models.MODELS:
        import_factory(name, "model")
