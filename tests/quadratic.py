"""FedNova's objective-inconsistency example as a dataset and a model the engine can run.

Client `i` holds `n_i` copies of the vector `e_i`; the model is one parameter vector `x` whose
loss on a batch is `½ mean ‖x − e‖²`, so client `i`'s local objective is `F_i(x) = ½‖x − e_i‖²`
and every mini-batch gradient is the exact local gradient `x − e_i`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from fedhet.data.base import Dataset
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.models.registry import MODELS
from fedhet.papers.fednova.inconsistency import HalfSquare as Quadratic
from fedhet.registry import NoParams

MODEL = "quadratic-test"
"""The quadratic `½ mean ‖x − e‖²` (`fedhet.papers.fednova.inconsistency.HalfSquare`)."""


def quadratic_data(e: torch.Tensor, sizes: list[int]) -> Dataset:
    """Client `i` holds `sizes[i]` copies of row `e[i]` (its natural partition)."""
    x = torch.cat([e[i].repeat(n, 1) for i, n in enumerate(sizes)]).float()
    y = torch.zeros(len(x), dtype=torch.long)
    bounds = np.cumsum([0, *sizes])
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    return Dataset("quadratic", x, y, x[:1], y[:1], num_classes=1, natural_partition=parts)


def run_quadratic(
    algorithm: str, e: torch.Tensor, sizes: list[int], steps: list[int], lr: float, rounds: int,
    model: str = MODEL, **settings,
) -> Simulation:
    """Run `rounds` rounds through the real engine; returns the finished `Simulation`."""
    values = {
        "algorithm": algorithm, "dataset": "digits", "partition": "natural", "model": model,
        "clients": len(sizes), "rounds": rounds, "lr": lr, "batch_size": max(sizes),
        "client_steps": list(steps), "eval_every": rounds, **settings,
    }
    with registered_models():
        cfg = config_of(values)
        sim = assemble(cfg, store=None, data=quadratic_data(e, sizes), log=lambda _: None)
        sim.run()
    return sim


LINEAR_MODEL = "linear-test"


class Linear(nn.Module):
    """Loss `mean_batch eᵀx`: every gradient on client `i` is the constant `e_i`."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(dim))

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return e @ self.x

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return out.mean()

    def predict(self, out: torch.Tensor) -> torch.Tensor:
        return torch.zeros(out.shape[0], dtype=torch.long)


@contextlib.contextmanager
def registered_models() -> Iterator[None]:
    """The two test models, registered for the length of a `with` block only."""
    with (
        MODELS.added(MODEL, lambda shape, classes, params: Quadratic(shape[0]), NoParams,
                     "test only: ½‖x − e‖²"),
        MODELS.added(LINEAR_MODEL, lambda shape, classes, params: Linear(shape[0]), NoParams,
                     "test only: eᵀx"),
    ):
        yield
