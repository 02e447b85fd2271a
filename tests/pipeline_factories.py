"""Models for the pipeline tests, as `--model pipeline_factories:NAME` loads them."""

from torch import nn


def linear_stack(num_classes: int = 10, in_channels: int = 1, image_size: int = 32, depth: int = 8) -> nn.Module:
    """Flatten, `depth` identical Linear+ReLU blocks as wide as the input, a small classifier: a
    model whose stages cost the same when its blocks are cut in half."""
    width = in_channels * image_size * image_size
    return nn.Sequential(
        nn.Flatten(),
        *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)),
        nn.Linear(width, num_classes),
    )


def small_stack(num_classes: int = 10, in_channels: int = 1, image_size: int = 8) -> nn.Module:
    """The same shape, small: for the correctness runs."""
    return linear_stack(num_classes, in_channels, image_size, depth=4)


class NotAChain(nn.Module):
    """Two children, but the forward flattens between them: not its children applied in order."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3)
        self.fc = nn.Linear(4 * (image_size - 2) ** 2, num_classes)

    def forward(self, x):
        return self.fc(self.conv(x).relu().flatten(1))


class DeclaredChain(NotAChain):
    """The same model, declaring the chain its forward runs: the flatten belongs to the first unit."""

    def pipeline_units(self):
        return [
            ("conv", ("conv",), lambda root, x: root.conv(x).relu().flatten(1)),
            ("fc", ("fc",), lambda root, x: root.fc(x)),
        ]


class Fork(nn.Module):
    """A trunk whose output two heads both read, summed: two operators of one unit save the same tensor."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 3)
        self.left = nn.Linear(3, 2)
        self.right = nn.Linear(3, 2)

    def forward(self, x):
        h = self.trunk(x)
        return self.left(h) + self.right(h)


def forked_chain(num_classes: int = 3, in_channels: int = 1, image_size: int = 2) -> nn.Module:
    """Five units small enough to count by hand (tests/test_formulas_unit_bytes.py): flatten a 1x2x2 image,
    Linear(4, 4), ReLU, Fork, Linear(2, num_classes)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(in_channels * image_size**2, 4), nn.ReLU(), Fork(), nn.Linear(2, num_classes)
    )
