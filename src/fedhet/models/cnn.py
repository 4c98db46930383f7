"""Convolutional models of the seed papers.

- `cnn-mnist`: FedVeca/BHerd's MNIST CNN (FedVeca §IV-A2 footnote): two 5×5×32 convolutions
  (padding 2, ReLU, 2×2 max-pool each) and fully connected 1568 → 256 → 10.
- `cnn-fednnnn-mnist`: FedNNNN Table 3: conv 1→20 5×5, pool, conv 20→50 5×5, pool,
  fc 800 → 500 → 10.
- `cnn-fednnnn-cifar`: FedNNNN Table 4: six 3×3 convolutions (padding 1) each followed by
  BatchNorm and ReLU, 32-32-pool-64-64-pool-128-128-pool, fc 2048 → 382 → 192 → 10.
- `cnn-cifar`: FedSR's CNN (§IV, "3 convolutional layers and two fully connected layers, with
  128420 parameters"): conv 3×3 32, pool, conv 3×3 64, pool, conv 3×3 64, fc 1024 → 64 → C. With
  100 classes on 32×32×3 input it has exactly 128,420 parameters (the paper's figure for its
  CIFAR-100 runs); 122,570 with 10 classes. The layer sizes are our reconstruction from that
  count **[choice]**.

The fully connected input size follows from the input shape (1568, 800 and 2048 are the
values for the papers' inputs). A flat input whose length is a perfect square (scikit-learn
digits, 64 = 8×8) is viewed as a one-channel square image; an input too small for a model's
convolutions, or one that is not an image, raises `FedhetError` when the model is built.

Each registers the `channels_last=True` trait: the engine runs its convolutions on
channels-last inputs (`fedhet.training.flat.FlatModel`), which oneDNN runs several times faster
on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS
from fedhet.models.sequence import ImageView
from fedhet.registry import NoParams


def image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """`(C, H, W)` for an image input, or `(1, s, s)` for a flat input of length `s²`."""
    if len(input_shape) == 3:
        return (input_shape[0], input_shape[1], input_shape[2])
    if len(input_shape) == 2:
        return (1, input_shape[0], input_shape[1])
    if len(input_shape) == 1:
        side = math.isqrt(input_shape[0])
        if side * side == input_shape[0]:
            return (1, side, side)
    raise FedhetError(
        f"model {name} needs image input, got samples of shape {tuple(input_shape)}; "
        "choose a non-convolutional model (--set model=mlp or logreg)"
    )


class ConvNet(nn.Module):
    """`features` (convolutions) → flatten → `classifier` (fully connected layers)."""

    def __init__(
        self, name: str, input_shape: tuple[int, ...], features: nn.Sequential,
        classifier: Callable[[int], nn.Sequential],
    ) -> None:
        super().__init__()
        self.image = image_shape(name, input_shape)
        self.features = features
        self.classifier = classifier(self._flat_size(name))

    def _flat_size(self, name: str) -> int:
        try:
            with torch.no_grad():
                out = self.features.eval()(torch.zeros(1, *self.image))
        except RuntimeError:
            out = None
        self.features.train()
        if out is None or out.numel() == 0:
            raise FedhetError(
                f"model {name} needs larger image input than {self.image} (C, H, W); "
                "choose another model or dataset"
            )
        return out.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.image)
        return self.classifier(self.features(x).flatten(1))

    def stacked_layers(self) -> list[nn.Module | ImageView]:
        """The steps of `forward` (`fedhet.models.sequence`)."""
        return [ImageView(self.image), self.features, nn.Flatten(), self.classifier]


def conv_block(c_in: int, c_out: int, kernel: int, padding: int, norm: bool = False) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, kernel, padding=padding)]
    if norm:
        layers.append(nn.BatchNorm2d(c_out))
    layers.append(nn.ReLU())
    return layers


def fc_stack(sizes: list[int]) -> Callable[[int], nn.Sequential]:
    """Fully connected layers `flat → sizes[0] → … → sizes[-1]` with ReLU between them."""

    def build(flat: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        dims = [flat, *sizes]
        for j in range(len(sizes)):
            layers.append(nn.Linear(dims[j], dims[j + 1]))
            if j < len(sizes) - 1:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    return build


@MODELS.register(
    "cnn-mnist", NoParams, "FedVeca/BHerd CNN: two 5×5×32 conv + pool, fc 1568→256→C",
    channels_last=True,
)
def cnn_mnist(input_shape: tuple[int, ...], num_classes: int, params: NoParams) -> nn.Module:
    c = image_shape("cnn-mnist", input_shape)[0]
    features = nn.Sequential(
        *conv_block(c, 32, 5, 2), nn.MaxPool2d(2),
        *conv_block(32, 32, 5, 2), nn.MaxPool2d(2),
    )
    return ConvNet("cnn-mnist", input_shape, features, fc_stack([256, num_classes]))


@MODELS.register(
    "cnn-fednnnn-mnist", NoParams, "FedNNNN Table 3: conv 20, conv 50 (5×5, pool), fc 800→500→C",
    channels_last=True,
)
def cnn_fednnnn_mnist(input_shape: tuple[int, ...], num_classes: int, params: NoParams) -> nn.Module:
    c = image_shape("cnn-fednnnn-mnist", input_shape)[0]
    features = nn.Sequential(
        *conv_block(c, 20, 5, 0), nn.MaxPool2d(2),
        *conv_block(20, 50, 5, 0), nn.MaxPool2d(2),
    )
    return ConvNet("cnn-fednnnn-mnist", input_shape, features, fc_stack([500, num_classes]))


@MODELS.register(
    "cnn-fednnnn-cifar", NoParams, "FedNNNN Table 4: six 3×3 conv with BN, fc 2048→382→192→C",
    channels_last=True,
)
def cnn_fednnnn_cifar(input_shape: tuple[int, ...], num_classes: int, params: NoParams) -> nn.Module:
    c = image_shape("cnn-fednnnn-cifar", input_shape)[0]
    layers: list[nn.Module] = []
    for c_in, c_out in ((c, 32), (32, 64), (64, 128)):
        layers += conv_block(c_in, c_out, 3, 1, norm=True)
        layers += conv_block(c_out, c_out, 3, 1, norm=True)
        layers.append(nn.MaxPool2d(2))
    features = nn.Sequential(*layers)
    return ConvNet("cnn-fednnnn-cifar", input_shape, features, fc_stack([382, 192, num_classes]))


@MODELS.register(
    "cnn-cifar", NoParams, "FedSR CNN: conv 32, 64, 64 (3×3, pool), fc 1024→64→C",
    channels_last=True,
)
def cnn_cifar(input_shape: tuple[int, ...], num_classes: int, params: NoParams) -> nn.Module:
    c = image_shape("cnn-cifar", input_shape)[0]
    features = nn.Sequential(
        *conv_block(c, 32, 3, 0), nn.MaxPool2d(2),
        *conv_block(32, 64, 3, 0), nn.MaxPool2d(2),
        *conv_block(64, 64, 3, 0),
    )
    return ConvNet("cnn-cifar", input_shape, features, fc_stack([64, num_classes]))
