"""Replacement objectives that the stacked cohort can compute for many clients at once.

`LocalTrainer.sgd(..., loss_fn=)` replaces the model's objective on every mini-batch with
`loss_fn(module, x, y)`. An arbitrary callable runs one client at a time (the stacked executor
falls back for it). A `StackableLoss` is written in two parts that `torch.func.vmap` can map
over the clients of a stack:

- `targets(module, x, *frozen)`: what the loss needs from parameter vectors that the step does
  not train (`frozen`, one set per client: MOON's global and previous models), computed without
  gradient with `functional_call`;
- `loss(module, x, y, targets)`: the objective at the module's current (trained) parameters.

Alone, `__call__` runs the two in order; stacked, the cohort (`fedhet.training.cohort`)
vmaps `targets` over the rows' `frozen` vectors and `grad(loss)` over the rows' parameters,
grouping rows whose `key` is equal (the same hyper-parameters).

A loss that also has a rows form (`on_program`: `rows_targets`, `rows_loss`) runs on the
model's stacked program (`fedhet.training.program`) where the model taps the representation
it reads (`stacked_tap`): the whole stack's objective as a few stacked operations, no vmap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable

import torch


class StackableLoss(ABC):
    """A `loss_fn` for `LocalTrainer.sgd` that the cohort can also run stacked."""

    frozen: tuple[torch.Tensor, ...] = ()
    """This client's flat parameter vectors that `targets` reads (each `(d,)`)."""

    @property
    @abstractmethod
    def key(self) -> Hashable:
        """Equal for losses that differ only in `frozen` (they share one stacked call, and on
        CUDA one captured step, `fedhet.training.graphs`): it holds every Python number the
        loss reads (MOON's μ and temperature)."""

    @abstractmethod
    def targets(self, module: torch.nn.Module, x: torch.Tensor, *frozen: torch.Tensor) -> tuple:
        """Tensors the loss compares against, from the `frozen` vectors (no gradient). It must
        leave `module` as it found it (mode, BatchNorm running statistics): it runs between the
        training forward passes of the client, sequentially and under `vmap` in the cohort."""

    @abstractmethod
    def loss(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, targets: tuple) -> torch.Tensor:
        """The mini-batch objective at `module`'s parameters (a scalar)."""

    @property
    def on_program(self) -> bool:
        """Whether `rows_targets` and `rows_loss` are written (the stacked program's form)."""
        return False

    def rows_targets(
        self, represent: Callable[[torch.Tensor], torch.Tensor], *frozen: torch.Tensor,
    ) -> tuple:
        """`targets` for every row of a stack at once: `frozen` are the rows' vectors stacked
        `(R, d)`, and `represent(w)` gives the tapped representation `(R, F, B)` of a stack `w`
        on the rows' mini-batches (no gradient)."""
        raise NotImplementedError

    def rows_loss(
        self, logits: torch.Tensor, tapped: torch.Tensor, y: torch.Tensor, targets: tuple,
    ) -> torch.Tensor:
        """Each row's mini-batch objective `(R,)` from its logits `(R, K, B)`, its tapped
        representation `(R, F, B)` and labels `(R, B)`."""
        raise NotImplementedError

    def __call__(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            targets = self.targets(module, x, *self.frozen)
        return self.loss(module, x, y, targets)


__all__ = ["StackableLoss"]
