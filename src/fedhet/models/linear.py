"""Linear models: multinomial logistic regression and the squared SVM."""

from __future__ import annotations

import math

import torch
from torch import nn

from fedhet.models.registry import MODELS
from fedhet.registry import NoParams


class LogisticRegression(nn.Module):
    """`softmax(W x + b)` on flattened inputs."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


@MODELS.register("logreg", NoParams, "multinomial logistic regression")
def logreg(input_shape: tuple[int, ...], num_classes: int, params: NoParams) -> nn.Module:
    return LogisticRegression(math.prod(input_shape), num_classes)
