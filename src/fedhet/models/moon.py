"""Models with a projection head for MOON (docs/spec.md "MOON").

`encoder → projection head (2-layer MLP to a 256-d z) → classifier on z`, as in MOON.
`forward(x)` returns the logits; `forward(x, with_z=True)` returns `(logits, z)` so the
contrastive loss needs one pass, and `torch.func.functional_call(model, params, (x,),
{"with_z": True})` gives `z` of another parameter vector (the global or previous model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS
from fedhet.models.sequence import ImageView


@dataclass(frozen=True)
class MoonParams:
    hidden: int = 200
    """Width of the encoder's last layer (the MLP's hidden layers; the CNN's fc layer)."""
    proj_dim: int = 256
    """Dimension of the projection `z`."""

    def validate(self) -> None:
        if self.hidden < 1 or self.proj_dim < 1:
            raise FedhetError("model.hidden and model.proj_dim must be ≥ 1")


class ProjectionNet(nn.Module):
    def __init__(self, encoder: nn.Module, features: int, proj_dim: int, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.projection = nn.Sequential(
            nn.Linear(features, features), nn.ReLU(), nn.Linear(features, proj_dim)
        )
        self.classifier = nn.Linear(proj_dim, num_classes)

    def forward(self, x: torch.Tensor, with_z: bool = False):
        z = self.projection(self.encoder(x))
        out = self.classifier(z)
        return (out, z) if with_z else out

    def stacked_layers(self) -> list[nn.Module]:
        """The steps of `forward` (`fedhet.models.sequence`)."""
        return [self.encoder, self.projection, self.classifier]

    def stacked_tap(self) -> nn.Module:
        """The part whose output is `z` (`fedhet.models.sequence`)."""
        return self.projection


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """`(C, H, W)`; a flat input of square length (digits: 64) is read as one 8×8 channel."""
    if len(input_shape) == 3:
        return input_shape
    if len(input_shape) == 2:
        return (1, *input_shape)
    side = math.isqrt(input_shape[0])
    if len(input_shape) == 1 and side * side == input_shape[0]:
        return (1, side, side)
    raise FedhetError(f"moon-cnn needs image inputs, got shape {input_shape}; use moon-mlp")


class ConvEncoder(nn.Module):
    """FedSR's CNN body (as `cnn-cifar`): 3×3 conv 32, pool, conv 64, pool, conv 64, then one fc
    layer to `hidden` (64 in `cnn-cifar`); the classifier moves behind the projection head."""

    def __init__(self, shape: tuple[int, int, int], hidden: int) -> None:
        super().__init__()
        self.shape = shape
        c, h, w = shape
        h, w = ((h - 2) // 2 - 2) // 2 - 2, ((w - 2) // 2 - 2) // 2 - 2
        if min(h, w) < 1:
            raise FedhetError(f"moon-cnn needs images of at least 18×18 pixels, got {shape}")
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3), nn.ReLU(),
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(64 * h * w, hidden), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x.view(-1, *self.shape)))

    def stacked_layers(self) -> list[nn.Module | ImageView]:
        """The steps of `forward` (`fedhet.models.sequence`)."""
        return [ImageView(self.shape), self.conv, self.fc]


@MODELS.register("moon-mlp", MoonParams, "FedSR's MLP encoder + MOON projection head (z ∈ R^256)")
def moon_mlp(input_shape: tuple[int, ...], num_classes: int, params: MoonParams) -> nn.Module:
    h = params.hidden
    encoder = nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), h), nn.ReLU(), nn.Linear(h, h), nn.ReLU()
    )
    return ProjectionNet(encoder, h, params.proj_dim, num_classes)


@MODELS.register("moon-cnn", MoonParams, "FedSR CNN body (as cnn-cifar) + MOON projection head (z ∈ R^256)")
def moon_cnn(input_shape: tuple[int, ...], num_classes: int, params: MoonParams) -> nn.Module:
    encoder = ConvEncoder(image_shape(input_shape), params.hidden)
    return ProjectionNet(encoder, params.hidden, params.proj_dim, num_classes)
