"""FedSR's MLP: 784 → 200 → 200 → 10 with ReLU (199,210 parameters on MNIST)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS


@dataclass(frozen=True)
class MLPParams:
    hidden: int = 200

    def validate(self) -> None:
        if self.hidden < 1:
            raise FedhetError("model.hidden must be ≥ 1")


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def stacked_layers(self) -> list[nn.Module]:
        """The steps of `forward` (`fedhet.models.sequence`)."""
        return [self.net]


@MODELS.register("mlp", MLPParams, "FedSR MLP, two hidden layers of 200")
def mlp(input_shape: tuple[int, ...], num_classes: int, params: MLPParams) -> nn.Module:
    return MLP(math.prod(input_shape), num_classes, params.hidden)
