"""A user's own model and dataset factories, as `--model` / `--dataset pkg.module:factory` load them."""

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset


class TinyNet(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1))


def tiny_net(num_classes: int = 10) -> nn.Module:
    return TinyNet(num_classes)


class Exploding(TinyNet):
    def forward(self, x):
        if int(os.environ.get("RANK", 0)) == 1:
            raise RuntimeError("boom on rank 1")
        return super().forward(x)


def exploding_net(num_classes: int = 10) -> nn.Module:
    return Exploding(num_classes)


def wide_mlp(num_classes: int = 10) -> nn.Module:
    """A 2.6 M-parameter MLP on 3 x 32 x 32 images: little compute for its size, so averaging its
    gradients and its optimizer step are a large share of a step, unlike in the CNNs."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(3 * 32 * 32, 512),
        nn.ReLU(),
        *(layer for _ in range(4) for layer in (nn.Linear(512, 512), nn.ReLU())),
        nn.Linear(512, num_classes),
    )


def float_pairs():
    """(train, test) map-style datasets of float images: fed through a DataLoader."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 8, 8, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    return TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])


class BigramLM(nn.Module):
    """A user's language model that computes its own loss, Hugging Face style: forward(x, labels)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, x, labels=None):
        logits = self.table(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


def bigram_lm(vocab_size: int = 256) -> nn.Module:
    return BigramLM(vocab_size)


def doubled_cross_entropy(output, target):
    """A --loss function: twice the next-token cross-entropy (so a test can tell it was used)."""
    return 2 * torch.nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())


def per_token_cross_entropy(output, target):
    """A broken --loss function: one loss per token, not a scalar."""
    return torch.nn.functional.cross_entropy(output.flatten(0, 1), target.flatten(), reduction="none")


class DropoutNet(TinyNet):
    """Dropout draws its masks from torch's global RNG, which nothing built-in does. Training
    raises at the DROPOUT_NET_CRASH_AT-th training forward of each rank, when that is set."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        self.drop = nn.Dropout(0.5)
        self.training_forwards = 0

    def forward(self, x):
        if self.training:
            self.training_forwards += 1
            if self.training_forwards == int(os.environ.get("DROPOUT_NET_CRASH_AT", 0)):
                raise RuntimeError(f"crashed at training forward {self.training_forwards}")
        return self.fc(self.drop(x.flatten(1)))


def dropout_net(num_classes: int = 10) -> nn.Module:
    return DropoutNet(num_classes)


def odd_float_pairs():
    """float_pairs with an odd-sized test set (63): 2 ranks cannot split it evenly."""
    train, test = float_pairs()
    return train, TensorDataset(*(t[:63] for t in test.tensors))


def frozen_tower(num_classes: int = 10) -> nn.Module:
    """A frozen backbone under a small trainable head, as when fine-tuning: 81 frozen layers, 80 of
    them 2048 x 2048 (1.3 GB of float32 weights). Training keeps gradients for the head only and
    runs no backward through the backbone, so an fsdp rank needs its shard of the weights and one
    gathered layer at a time."""
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 2048), *(nn.Linear(2048, 2048) for _ in range(80)))
    backbone.requires_grad_(False)
    return nn.Sequential(backbone, nn.Linear(2048, num_classes))


def frozen_chain(num_classes: int = 10) -> nn.Module:
    """frozen_tower as one chain, for pipelines to cut anywhere: an input layer that trains, 80 frozen 2048 x 2048
    layers (1.3 GB of float32 weights), a head that trains. Backward runs through the frozen layers to the input
    layer, with no gradients kept for them."""
    frozen = [nn.Linear(2048, 2048).requires_grad_(False) for _ in range(80)]
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 2048), *frozen, nn.Linear(2048, num_classes))


def frozen_chain_plan(model: nn.Module, degree: int) -> dict[str, str]:
    """--tp-plan for frozen_chain: its frozen layers split in pairs (units 2-81), the first of each by output
    columns and the second by input rows; a stage boundary at an even unit keeps every pair within a stage."""
    return {str(i): "colwise" if i % 2 == 0 else "rowwise" for i in range(2, 82)}


def frozen_tower_plan(model: nn.Module, degree: int) -> dict[str, str]:
    """--tp-plan for frozen_tower: its backbone's Linear layers split in pairs, the first of each by output
    columns and the second by input rows (80 of its 81; the last and the head stay whole)."""
    return {f"0.{i}": "colwise" if i % 2 else "rowwise" for i in range(1, 81)}


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class LayeredNet(nn.Module):
    """The nanoGPT/torchtitan layout: blocks in an nn.ModuleList that forward() loops over."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32))
        self.layers = nn.ModuleList([Block(32) for _ in range(3)])
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def layered_net(num_classes: int = 10) -> nn.Module:
    return LayeredNet(num_classes)


class DictLayeredNet(nn.Module):
    """torchtitan's layout: blocks in an nn.ModuleDict keyed "0", "1", ... that forward() loops over."""

    def __init__(self, num_classes: int, depth: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32))
        self.layers = nn.ModuleDict({str(i): Block(32) for i in range(depth)})
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(x)


def dict_layered_net(num_classes: int = 10) -> nn.Module:
    return DictLayeredNet(num_classes)


def deep_dict_layered_net(num_classes: int = 10) -> nn.Module:
    """Deep enough (7 blocks) that the plan measures it at shallow depths (plan/depth.py)."""
    return DictLayeredNet(num_classes, depth=7)


class FlatteningLayeredNet(LayeredNet):
    """The same blocks, but forward flattens before the stem: its children applied in order fail."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        self.stem = nn.Linear(3 * 8 * 8, 32)

    def forward(self, x):
        return super().forward(x.flatten(1))


def flattening_layered_net(num_classes: int = 10) -> nn.Module:
    return FlatteningLayeredNet(num_classes)


def _vectors(n: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return x, (x.sum(dim=1) > 0).long()


def vector_pairs():
    """(train, test) of 16-float vectors: no C,H,W anywhere."""
    x, y = _vectors(160)
    return TensorDataset(x[:128], y[:128]), TensorDataset(x[128:], y[128:])


def one_vector_dataset():
    """One Dataset: paratrain holds out the test split itself."""
    return TensorDataset(*_vectors(200))


def unlabelled_dicts():
    """Dict samples of features only: no labels, and no input_ids a causal LM's labels could be taken from."""
    return [{"features": torch.randn(4)} for _ in range(10)]


def mlp(in_features: int, num_classes: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Linear(32, num_classes))


class Widening(nn.Module):
    """x + down(relu(up(x))): a pair of layers tensor parallelism splits (up by outputs, down by inputs)."""

    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def widening_stack(in_features: int = 16, num_classes: int = 2) -> nn.Module:
    """A model with no tensor_parallel_plan of its own: --tp-plan user_factories:widening_plan gives one."""
    return nn.Sequential(nn.Linear(in_features, 32), *(Widening(32) for _ in range(2)), nn.Linear(32, num_classes))


def tied_stack(in_features: int = 16, num_classes: int = 2) -> nn.Module:
    """A chain whose fourth layer shares the second's weight (tied as gpt ties its embedding and output), so that
    a pipeline cut after the second unit holds the tensor on both stages."""
    model = nn.Sequential(
        nn.Linear(in_features, 32), nn.Linear(32, 32), Widening(32), nn.Linear(32, 32), nn.Linear(32, num_classes)
    )
    model[3].weight = model[1].weight
    return model


class SelfInitialised(nn.Sequential):
    """nanoGPT's way: layers built with their defaults, then initialised again by the model's constructor
    (`self.apply(self._init_weights)`), with no init_weights() a strategy could call on the parts."""

    def __init__(self, in_features: int = 16, num_classes: int = 2):
        super().__init__(nn.Linear(in_features, 32), Widening(32), nn.Linear(32, num_classes))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)


def widening_plan(model, degree):
    return {"*.up": "colwise", "*.down": "rowwise"}


class GatedMLP(nn.Module):
    """A gated MLP that takes a second input, a table its caller passes on (as a rotary table is passed)."""

    def __init__(self, width: int):
        super().__init__()
        self.up, self.gate = nn.Linear(width, 4 * width), nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x, table):
        return self.down(torch.nn.functional.silu(self.up(x)) * self.gate(x)) * table


class TabledBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.mlp = GatedMLP(width)

    def forward(self, x, table):
        return x + self.mlp(x, table)


class TabledNet(nn.Module):
    """Blocks that take (x, table), the table a buffer of the parameter-less root: a Llama's rotary layout."""

    def __init__(self, vocab_size: int, width: int = 64, depth: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList([TabledBlock(width) for _ in range(depth)])
        self.head = nn.Linear(width, vocab_size)
        self.register_buffer("table", torch.linspace(0.5, 1.5, width), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.table)
        return self.head(x)

    def tensor_parallel_plan(self, degree: int) -> dict:
        block = {"mlp": "replicated-input", "mlp.up": "colwise", "mlp.gate": "colwise", "mlp.down": "rowwise"}
        return {f"blocks.*.{name}": style for name, style in block.items()}


def tabled_net(vocab_size: int = 256) -> nn.Module:
    return TabledNet(vocab_size)


def deep_tabled_net(vocab_size: int = 256) -> nn.Module:
    """TabledNet with 17 blocks: enough for the planner to measure it at shallow depths (plan/depth.py)."""
    return TabledNet(vocab_size, width=32, depth=17)


class AlternatingNet(TabledNet):
    """Blocks alike in shape, not in cost: every second one runs its MLP twice (as a model alternates
    local and global attention)."""

    def forward(self, tokens):
        x = self.embed(tokens)
        for index, block in enumerate(self.blocks):
            x = block(x, self.table)
            if index % 2:
                x = block(x, self.table)
        return self.head(x)


def alternating_net(vocab_size: int = 256) -> nn.Module:
    return AlternatingNet(vocab_size, width=32, depth=7)


class CountedNet(TabledNet):
    """A forward that indexes its blocks by a count it stored: it needs all of them."""

    def forward(self, tokens):
        x = self.embed(tokens)
        for index in range(7):
            x = self.blocks[index](x, self.table)
        return self.head(x)


def counted_net(vocab_size: int = 256) -> nn.Module:
    return CountedNet(vocab_size, width=32, depth=7)


def conv_split_plan(model: nn.Module, degree: int) -> dict:
    """A --tp-plan that splits the embedding by output columns: its rank's share of the width then meets the
    whole-width table in the blocks."""
    return {"embed": "colwise"}


def eight_way_only_plan(model: nn.Module, degree: int) -> dict:
    """A --tp-plan that refuses, its own way, every degree but 8 (as a Llama plan refuses a degree its
    key-value heads cannot take)."""
    if degree != 8:
        raise ValueError(f"this model splits 8 ways, not {degree}")
    return TabledNet.tensor_parallel_plan(model, degree)


def plan_keeping_the_head(model: nn.Module, degree: int, loss_parallel: bool = False) -> dict:
    """A --tp-plan for TabledNet whose loss-parallel form splits no head: --loss-parallel refuses it."""
    return TabledNet.tensor_parallel_plan(model, degree)


def gpt_plan_splitting_the_head_alone(model: nn.Module, degree: int, loss_parallel: bool = False) -> dict:
    """gpt's plan without its embedding's split: the head tied to it would be split and the embedding whole."""
    plan = model.tensor_parallel_plan(degree, loss_parallel=loss_parallel)
    plan.pop("embed.wte", None)
    return plan


class DecodedImages(torch.utils.data.Dataset):
    """torchvision's convention: images made in __getitem__ (decoded, in a real dataset), labels kept in `targets`.
    `loads` counts the samples made, so a test can tell that reading the classes made none."""

    loads = 0

    def __init__(self) -> None:
        self.targets = [i % 7 for i in range(200)]  # classes 0-6: 7

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        DecodedImages.loads += 1
        return torch.rand(3, 8, 8), self.targets[index]


def decoded_images() -> torch.utils.data.Dataset:
    return DecodedImages()
