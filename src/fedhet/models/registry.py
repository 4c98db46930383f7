"""The model registry: `build_model(name, input_shape, num_classes, params)`.

A model is an `nn.Module`. Models whose objective is not cross-entropy (the squared SVM)
define `loss(output, target)` and `predict(output)`; `objective` and `predictions` below fall
back to cross-entropy and arg-max for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fedhet.registry import Registry

ModelFactory = Callable[[tuple[int, ...], int, Any], nn.Module]
MODELS: Registry[ModelFactory] = Registry("model")
"""Filled by the model modules, which `fedhet.models` imports (so any import of this one does)."""


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, params: Any) -> nn.Module:
    return MODELS.get(name).factory(tuple(input_shape), num_classes, params)


def objective(model: nn.Module, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The model's training loss on one batch (mean over the batch)."""
    loss = getattr(model, "loss", None)
    return loss(output, target) if loss is not None else F.cross_entropy(output, target)


def predictions(model: nn.Module, output: torch.Tensor) -> torch.Tensor:
    predict = getattr(model, "predict", None)
    return predict(output) if predict is not None else output.argmax(dim=1)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
