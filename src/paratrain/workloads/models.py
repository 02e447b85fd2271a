"""The registered models.

- `cifar10-cnn`: the small CNN of PyTorch's CIFAR-10 tutorial (two 5x5 convolutions, three fully
  connected layers; 62,006 parameters), with the tutorial's parameter names.
- `resnet18`: ResNet-18 (He et al. 2015) with the CIFAR stem (3x3 conv, no max-pool) for small
  images and the ImageNet stem (7x7/2 + max-pool) from 96 px up.
- `resnet50v2`, `resnet152v2`: pre-activation bottleneck ResNets (He et al. 2016, "Identity
  Mappings in Deep Residual Networks"), laid out as Keras' ResNet50V2/ResNet152V2: BN-ReLU before
  each convolution, a final BN-ReLU before pooling.
All end in adaptive average pooling, so any input size from the model's smallest works (e.g.
128x128); below it the model refuses to be built (a UsageError naming the smallest size).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.errors import UsageError
from paratrain.workloads import gpt
from paratrain.workloads.gpt import PipelineUnit, call_unit


class TutorialCNN(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise UsageError(
                f"cifar10-cnn needs images of at least 16 px a side (got {image_size}); use --image-size 16 or more"
            )
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    def pipeline_units(self) -> list[PipelineUnit]:
        """Each convolution with its ReLU and pooling (the second flattens), then each linear layer:
        its forward's functional calls between the layers belong to a unit, so the chain is the model."""

        def conv(name: str, flatten: bool) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
            def run(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
                x = root.pool(F.relu(root.get_submodule(name)(x)))
                return torch.flatten(x, 1) if flatten else x

            return run

        def linear(name: str, relu: bool) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
            return lambda root, x: F.relu(root.get_submodule(name)(x)) if relu else root.get_submodule(name)(x)

        return [
            ("conv1", ("conv1", "pool"), conv("conv1", flatten=False)),
            ("conv2", ("conv2", "pool"), conv("conv2", flatten=True)),
            ("fc1", ("fc1",), linear("fc1", relu=True)),
            ("fc2", ("fc2",), linear("fc2", relu=True)),
            ("fc3", ("fc3",), linear("fc3", relu=False)),
        ]


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class PreActBottleneck(nn.Module):
    """BN-ReLU-conv1x1, BN-ReLU-conv3x3(stride), BN-ReLU-conv1x1; the shortcut taps the pre-activation."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out_planes = planes * self.expansion
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.shortcut = None
        if stride != 1 or in_planes != out_planes:
            self.shortcut = nn.Conv2d(in_planes, out_planes, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        shortcut = self.shortcut(pre) if self.shortcut is not None else x
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.bn2(out)))
        out = self.conv3(F.relu(self.bn3(out)))
        return out + shortcut


class ResNet(nn.Module):
    def __init__(
        self,
        name: str,
        block: type[nn.Module],
        layers: list[int],
        num_classes: int,
        in_channels: int,
        image_size: int,
        imagenet_stem_from: int,
        preact: bool,
    ):
        super().__init__()
        imagenet_stem = image_size >= imagenet_stem_from
        # Every stage after the first halves the side (the ImageNet stem a further 4x). Padding keeps
        # a smaller image from failing, but its last stages then convolve padding alone and the
        # pooled features say next to nothing about the image: refused, not silently trained.
        downsampling = (4 if imagenet_stem else 1) * 2 ** (len(layers) - 1)
        if image_size < downsampling:
            raise UsageError(
                f"{name} needs images of at least {downsampling} px a side, its total downsampling "
                f"(got {image_size}); use --image-size {downsampling} or more"
            )
        if imagenet_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, 64, 7, 2, 3, bias=not preact),
                *([] if preact else [nn.BatchNorm2d(64), nn.ReLU(inplace=True)]),
                nn.MaxPool2d(3, 2, 1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, 64, 3, 1, 1, bias=not preact),
                *([] if preact else [nn.BatchNorm2d(64), nn.ReLU(inplace=True)]),
            )
        blocks: list[nn.Module] = []
        in_planes = 64
        for stage, count in enumerate(layers):
            planes = 64 * 2**stage
            for i in range(count):
                blocks.append(block(in_planes, planes, stride=2 if (stage > 0 and i == 0) else 1))
                in_planes = planes * block.expansion
        self.blocks = nn.Sequential(*blocks)
        # v2 networks end with the BN-ReLU their blocks deferred.
        self.head_norm = nn.Sequential(nn.BatchNorm2d(in_planes), nn.ReLU(inplace=True)) if preact else nn.Identity()
        self.fc = nn.Linear(in_planes, num_classes)
        self.init_weights()

    def init_weights(self) -> None:
        """He et al.'s initialisation of the convolutions over the layers' defaults; also run by fsdp
        on the shards of a model built on the meta device (engine/strategies/fsdp.py)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head_norm(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def pipeline_units(self) -> list[PipelineUnit]:
        """`stem`, each residual block, then the final norm with pooling and `fc` (forward after the blocks)."""
        return [
            call_unit("stem"),
            *(call_unit(f"blocks.{i}") for i in range(len(self.blocks))),
            ("head_norm", ("head_norm", "fc"), _resnet_head),
        ]


def _resnet_head(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return root.fc(torch.flatten(F.adaptive_avg_pool2d(root.head_norm(x), 1), 1))


def _resnet18(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    return ResNet(
        "resnet18", BasicBlock, [2, 2, 2, 2], num_classes, in_channels, image_size, imagenet_stem_from=96, preact=False
    )


def _resnet50v2(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    return ResNet(
        "resnet50v2",
        PreActBottleneck,
        [3, 4, 6, 3],
        num_classes,
        in_channels,
        image_size,
        imagenet_stem_from=64,
        preact=True,
    )


def _resnet152v2(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    return ResNet(
        "resnet152v2",
        PreActBottleneck,
        [3, 8, 36, 3],
        num_classes,
        in_channels,
        image_size,
        imagenet_stem_from=64,
        preact=True,
    )


MODELS: dict[str, Callable[..., nn.Module]] = {
    "cifar10-cnn": TutorialCNN,
    "resnet18": _resnet18,
    "resnet50v2": _resnet50v2,
    "resnet152v2": _resnet152v2,
}


def build_model(name: str, num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> nn.Module:
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose from {', '.join(MODELS)} or pass pkg.module:factory")
    return MODELS[name](num_classes=num_classes, in_channels=in_channels, image_size=image_size)


def checkpoint_blocks(
    model: nn.Module, every: int = 1, by_operator: bool = False, also_entered: Callable[[], Any] | None = None
) -> list[nn.Module]:
    """--checkpoint-activations: recompute the activations of the blocks (residual_blocks) in backward instead
    of storing them; with --checkpoint-activations-every N, of every Nth block only (the Nth, 2Nth, ..., as torchtitan's
    selective layer checkpointing counts them); with --checkpoint-activations-ops, keep inside each of those blocks
    what OperatorPolicy saves and recompute the rest. The training loop and the planner's measurement apply it
    alike (the planner enters `also_entered()` around the blocks' forward and their recompute). Returns the
    blocks it wrapped."""
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    blocks = checkpointed_blocks(model, every)
    chosen = set(blocks)
    wrapper = checkpoint_wrapper
    if by_operator or also_entered is not None:
        wrapper = partial(checkpoint_wrapper, context_fn=partial(_checkpoint_contexts, by_operator, also_entered))
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: m in chosen)
    return blocks


def _checkpoint_contexts(by_operator: bool, also_entered: Callable[[], Any] | None) -> tuple[Any, Any]:
    """The contexts a checkpointed block's forward and its recompute run in (torch.utils.checkpoint's
    context_fn): the selective ones of a fresh OperatorPolicy, and the planner's own around both."""
    from contextlib import nullcontext

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    forward, recompute = (
        create_selective_checkpoint_contexts(OperatorPolicy()) if by_operator else (nullcontext(), nullcontext())
    )
    if also_entered is None:
        return forward, recompute
    return _within(also_entered, forward), _within(also_entered, recompute)


@contextmanager
def _within(outer: Callable[[], Any], inner: Any) -> Iterator[None]:
    with outer(), inner:
        yield


# --checkpoint-activations-ops, as torchtitan's operator-level selective checkpointing decides (its
# parallelize_llama.py at the commits docs/planner.md cites): keep the outputs of attention and of the
# reduce-scatters, and of the matrix products all but every second one; recompute everything else
# (norms, activations, residual adds: cheap in FLOPs, large in bytes). Fused attention of every backend
# a run here or on a GPU reaches; matrix products are mm (and addmm, a Linear's with a bias on 2-D input).
_ATTENTION_AND_COLLECTIVES = (
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "_c10d_functional.reduce_scatter_tensor.default",
)
_MATRIX_PRODUCTS = ("aten.mm.default", "aten.addmm.default")
# Called with (op, args, kwargs, output, saved) for each op a checkpointed block runs in forward under
# OperatorPolicy: how the memory meter and the planner see what the policy keeps outside autograd's graph.
SELECTIVE_OBSERVERS: list[Callable[..., None]] = []


@cache  # asked by every checkpointed block's forward: looked up once
def _ops(names: tuple[str, ...]) -> frozenset[Any]:
    found = set()
    for name in names:
        namespace, op, overload = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:  # a backend this build of torch lacks
            found.add(getattr(packet, overload))
    return frozenset(found)


class OperatorPolicy:
    """One checkpointed block's forward: which op outputs are kept (torch.utils.checkpoint's policy_fn)."""

    def __init__(self) -> None:
        self.matrix_products = 0
        self.kept, self.products = _ops(_ATTENTION_AND_COLLECTIVES), _ops(_MATRIX_PRODUCTS)

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        if ctx.is_recompute:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if op in self.products:
            self.matrix_products += 1
        saved = op in self.kept or (op in self.products and self.matrix_products % 2 == 1)
        for observe in SELECTIVE_OBSERVERS:
            observe(op, args, kwargs, ctx.op_output, saved)
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed_blocks(model: nn.Module, every: int = 1) -> list[nn.Module]:
    """The blocks checkpoint_blocks wraps: of residual_blocks, the Nth, 2Nth, ... (N = every)."""
    return [block for index, block in enumerate(residual_blocks(model), start=1) if index % every == 0]


def residual_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules worth checkpointing and sharding as units: residual or transformer blocks if any, else
    the top-level children with parameters, the items of a ModuleList or ModuleDict one by one (the
    nanoGPT/torchtitan layout: a container has no forward, so FSDP cannot gather it as a unit, and as
    one unit it would be the whole stack of layers)."""
    blocks = [m for m in model.modules() if isinstance(m, (BasicBlock, PreActBottleneck, gpt.Block))]
    if blocks:
        return blocks
    units = []
    for child in model.children():
        if isinstance(child, nn.ModuleDict):
            items = list(child.values())
        else:
            items = list(child) if isinstance(child, nn.ModuleList) else [child]
        units += [m for m in items if any(True for _ in m.parameters())]
    return units
