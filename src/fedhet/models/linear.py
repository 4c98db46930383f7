"""Linear models: multinomial logistic regression and the squared SVM.

Squared SVM (docs/spec.md "Datasets"; FedVeca §IV-A2, BHerd §2.3): binary labels `{0, 1}` are mapped
to `y = ±1` (class 1 → +1), `score = wᵀx + b`, and the loss on a batch `B` is
`(λ/2)‖w‖² + (1/2|B|) Σ max(0, 1 − y·score)²` with `λ = 0.1` **[choice]** (the bias is not
regularised). A sample is predicted as class 1 when `score > 0`.

`model.bias=false` drops `b` (`score = wᵀx`) and `model.init=zeros` starts from `w = 0`: the
setup of the papers' reference [40] (Wang et al. 2019, the public adaptive-federated-learning
code), which FedVeca and BHerd cite for their SVM (docs/bherd.md "ref40").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS
from fedhet.registry import NoParams


class LogisticRegression(nn.Module):
    """`softmax(W x + b)` on flattened inputs."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


@MODELS.register("logreg", NoParams, "multinomial logistic regression", linear=True)
def logreg(input_shape: tuple[int, ...], num_classes: int, params: NoParams) -> nn.Module:
    return LogisticRegression(math.prod(input_shape), num_classes)


@dataclass(frozen=True)
class SVMParams:
    lam: float = 0.1
    """`λ`, the L2 penalty on `w` **[choice]**."""
    bias: bool = True
    """Learn a bias `b` (False: `score = wᵀx`, as reference [40])."""
    init: Literal["default", "zeros"] = "default"
    """`default`: PyTorch's `nn.Linear` initialisation (seeded); `zeros`: `w = 0` (and `b = 0`)."""

    def validate(self) -> None:
        if not (self.lam >= 0 and math.isfinite(self.lam)):
            raise FedhetError(f"model.lam must be a number ≥ 0, got {self.lam}")


class SquaredSVM(nn.Module):
    """One linear score per sample; `loss` and `predict` make it a binary classifier."""

    def __init__(self, in_features: int, lam: float, bias: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, 1, bias=bias)
        self.lam = lam

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)).squeeze(1)

    def loss(self, score: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = 2.0 * target.to(score.dtype) - 1.0
        hinge = torch.clamp(1.0 - y * score, min=0.0)
        return 0.5 * self.lam * self.fc.weight.pow(2).sum() + 0.5 * hinge.pow(2).mean()

    def predict(self, score: torch.Tensor) -> torch.Tensor:
        return (score > 0).long()


@MODELS.register("svm", SVMParams, "squared SVM for binary labels (MNIST even/odd)", linear=True)
def svm(input_shape: tuple[int, ...], num_classes: int, params: SVMParams) -> nn.Module:
    if num_classes != 2:
        raise FedhetError(
            f"model svm needs a binary dataset (2 classes, e.g. mnist-even-odd), got {num_classes} classes"
        )
    model = SquaredSVM(math.prod(input_shape), params.lam, params.bias)
    if params.init == "zeros":
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    return model
