"""What to train: the workload, and the model, dataset and loss that override its own."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig


@dataclass(frozen=True)
class Workload:
    """A named workload: the names of its model and dataset (resolved by paratrain.workloads)."""

    model: str
    dataset: str
    description: str


SYNTHETIC_CLASSES = 10  # the synthetic dataset's classes unless --num-classes says otherwise

# Here, not beside the models, so that a mistyped name is refused before torch is imported (seconds).
WORKLOADS: dict[str, Workload] = {
    "cifar10-cnn": Workload("cifar10-cnn", "cifar10", "the small CNN of PyTorch's CIFAR-10 tutorial on CIFAR-10"),
    "cifar10-resnet18": Workload("resnet18", "cifar10", "ResNet-18 (CIFAR stem) on CIFAR-10"),
    "cifar10-resnet50v2": Workload("resnet50v2", "cifar10", "pre-activation ResNet-50 (v2) on CIFAR-10"),
    "cifar10-resnet152v2": Workload("resnet152v2", "cifar10", "pre-activation ResNet-152 (v2) on CIFAR-10"),
    "synthetic-cnn": Workload("cifar10-cnn", "synthetic", "the tutorial CNN on random images: throughput work"),
    "synthetic-resnet50v2": Workload(
        "resnet50v2", "synthetic", "ResNet-50 v2 on random images (set --synthetic-shape 3,128,128)"
    ),
    "gpt-tiny": Workload(
        "gpt-tiny", "text", "GPT, 4 x 128, context 256 (0.86 M parameters) on Python's own sources, bytes"
    ),
    "gpt-small": Workload("gpt-small", "text", "GPT, 6 x 384, context 256 (10.8 M) on Python's own sources, bytes"),
    "gpt-medium": Workload(
        "gpt-medium", "text", "GPT, 12 x 768, context 1024 (86 M; GPT-2 small's shape) on Python's sources"
    ),
    "gpt-large": Workload(
        "gpt-large", "text", "GPT, 24 x 1024, context 1024 (304 M; GPT-2 medium's shape) on Python's sources"
    ),
    "gpt-xl": Workload(
        "gpt-xl", "text", "GPT, 36 x 1280, context 1024 (710 M; GPT-2 large's shape): needs sharding on 24 GiB"
    ),
}


class WorkloadOptions(BaseModel):
    """The train flags that say what to train (the first section of `paratrain train --help`)."""

    workload: str = Field("cifar10-cnn", description="named workload (model + dataset); see `paratrain workloads`")
    model: str | None = Field(
        None, description="override the workload's model: a registered name or pkg.module:factory"
    )
    dataset: str | None = Field(
        None,
        description="override the workload's dataset: cifar10, synthetic, text, pkg.module:factory, or a directory "
        "a Hugging Face dataset was saved to (save_to_disk)",
    )
    data_dir: Path | None = Field(
        None,
        description="CIFAR-10 as cifar-10-python.tar.gz / cifar-10-batches-py, or an image tree train|test/<class>/* "
        "(folder or .tar.gz); default: the bundled offline subset. Text workloads: a UTF-8 text file or a "
        "folder of them; default: Python's own sources",
    )
    cache_dir: Path | None = Field(
        None, description="where decoded datasets are cached (default $PARATRAIN_CACHE or ~/.cache/paratrain)"
    )
    image_size: int | None = Field(
        None, gt=0, description="resize images to this many pixels a side (on the device, per batch)"
    )
    synthetic_samples: int = Field(10000, gt=0, description="training samples of the synthetic dataset")
    synthetic_shape: tuple[int, int, int] = Field((3, 32, 32), description="C,H,W of the synthetic dataset")
    num_classes: int | None = Field(
        None,
        gt=1,
        description=f"classes of the synthetic dataset (default {SYNTHETIC_CLASSES}); a user dataset's are read from "
        "its labels unless given here",
    )
    limit_train: int | None = Field(None, gt=0, description="train on a class-balanced subset of this many samples")
    val_split: float = Field(
        0.0, ge=0.0, lt=1.0, description="carve this fraction of the training set out as a validation set (e.g. 0.2)"
    )
    seq_len: int | None = Field(
        None,
        gt=0,
        description="text workloads: tokens (bytes) per training window (default: the gpt preset's context, else 256)",
    )
    samples_per_epoch: int = Field(4096, gt=0, description="text workloads: random windows per epoch")
    eval_samples: int = Field(
        256,
        gt=0,
        description="text workloads: windows of each held-out text evaluated (evenly spaced, the same every epoch)",
    )
    n_layer: int | None = Field(None, gt=0, description="gpt models: transformer blocks (default: the preset's)")
    n_head: int | None = Field(
        None, gt=0, description="gpt models: attention heads; must divide --n-embd (default: the preset's)"
    )
    n_embd: int | None = Field(
        None, gt=0, description="gpt models: width of the residual stream (default: the preset's)"
    )
    loss: str | None = Field(
        None,
        description="the loss as pkg.module:fn, called fn(output, target) -> scalar tensor (default: the workload's; a "
        "model whose forward takes targets returns its own)",
    )
    collate: str | None = Field(
        None,
        description="dict samples (Hugging Face style): the collator as pkg.module:fn, called with a list of samples, "
        "e.g. a transformers DataCollator (default: pad to the longest sample of the batch)",
    )

    @field_validator("workload")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in WORKLOADS:
            raise ValueError(f"unknown workload; choose from {', '.join(WORKLOADS)} or pass --model/--dataset")
        return value

    @field_validator("model", "dataset", "loss", "collate", mode="before")
    @classmethod
    def _callable_to_spec(cls, value: Any) -> Any:
        """`paratrain.train(model=make_net)`: a function or class becomes its `module:qualname`, which
        every rank imports (the run's config.json stays plain JSON)."""
        if value is None or isinstance(value, str) or not callable(value):
            return value
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
        if not module or "<" in qualname:
            raise ValueError(
                f"{qualname or value!r} is a lambda or is defined inside a function, which the ranks cannot "
                "import; define it at the top level of a module"
            )
        return f"{module}:{qualname}"

    @field_validator("synthetic_shape", mode="before")
    @classmethod
    def _split_shape(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.replace("x", ",").split(","))
            except ValueError:
                raise ValueError("expected C,H,W such as 3,32,32") from None
        return value


def check(config: TrainConfig) -> None:
    """A model, dataset or loss that spawned ranks cannot import is refused before they start."""
    for name in ("model", "dataset", "loss", "collate"):
        spec = getattr(config, name)
        if (
            config.workers > 1
            and spec
            and spec.startswith("__main__:")
            and not hasattr(sys.modules["__main__"], "__file__")
        ):
            raise ValueError(
                f"--{name} {spec.partition(':')[2]} is defined in a notebook or an interactive session, which "
                "spawned ranks cannot import; move it into a .py file beside the notebook and import it "
                "from there (or use --workers 1)"
            )
