"""Per-step hooks that the stacked cohort runs once per step for the whole stack.

A local pass may watch its steps through `on_step(step, w, g, loss)` (`fedhet.training.local`):
BHerd keeps every step's gradient, GraB balances them, FedVeca accumulates its estimates. Run
row by row, such a hook costs the stacked executor one Python call (and, for a norm that decides
something, one device synchronisation) per client per step. A `StackableHook` says how to do
the same work for several clients at once: `cls.stack(hooks)` returns a `StackedHook` that the
cohort (`fedhet.training.cohort.CohortTrainer`) calls once per step with the members' rows of
the stack, `w` and `g` as `(R, d)` tensors in member order, and tells when members take their
last step (`leave`), at which point their state goes back into their own hook objects. The
algorithm reads its hooks after `sgd` returns exactly as after a sequential pass.

Rules for both halves: `w` and `g` are live and read-only (clone what you keep); every member
of a stack has taken the same number of steps (`step`), because the cohort steps its rows
together and a client leaves the stack when its batches run out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Self

import torch


class StackedHook(ABC):
    """The per-step work of several clients' hooks (the members) on their rows of the stack."""

    @abstractmethod
    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor) -> None:
        """`w`, `g`: `(R, d)`, row `r` is the `r`-th current member; read-only."""

    @abstractmethod
    def leave(self, members: Sequence[int], steps: int) -> None:
        """`members` (positions among the current members) took their last step, `steps` in all:
        hand their state back to their own hooks. The other members keep their relative order
        and are renumbered from 0."""


class StackableHook(ABC):
    """An `on_step` hook (`fedhet.training.local.StepHook`) that can also run stacked."""

    @abstractmethod
    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor, loss: float) -> None: ...

    @classmethod
    @abstractmethod
    def stack(cls, hooks: Sequence[Self]) -> StackedHook:
        """One `StackedHook` for `hooks` (all of this class), member `r` being `hooks[r]`."""


class GradientStore(StackableHook):
    """Keeps step `λ`'s gradient `g^λ` as row `λ` of a `τ × d` float32 buffer (BHerd's herd,
    GraB's cropping). Alone, the buffer is allocated at the first step; stacked, one
    `(C, τ_max, d)` buffer holds every member's (each store's `grads` is its view of it) and a
    step is one copy for the whole stack.

    `finished(stores, grads)` runs when stores leave a stack together, with their `(L, t, d)`
    buffers: a subclass computes there what it would otherwise compute one store at a time."""

    def __init__(self, tau: int, dim: int, device: torch.device | str | None = None) -> None:
        self.tau = tau
        self.dim = dim
        self.device = device
        self.grads: torch.Tensor | None = None
        self.steps = 0

    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor, loss: float) -> None:
        if self.grads is None:
            self.grads = torch.empty(self.tau, self.dim, device=self.device)
        self.grads[step].copy_(g)
        self.steps = step + 1

    def rows(self) -> torch.Tensor:
        """The kept gradients, `steps × d`."""
        if self.grads is None:
            return torch.empty(0, self.dim, device=self.device)
        return self.grads[: self.steps]

    @classmethod
    def finished(cls, stores: Sequence[Self], grads: torch.Tensor) -> None:
        """`stores` left a stack after the same number of steps; `grads` is their `(L, t, d)`."""

    @classmethod
    def stack(cls, hooks: Sequence[Self]) -> StackedHook:
        return _StackedStore(list(hooks))


class _StackedStore(StackedHook):
    def __init__(self, stores: list[GradientStore]) -> None:
        first = stores[0]
        tau = max(s.tau for s in stores)
        self.buf = torch.empty(len(stores), tau, first.dim, device=first.device)
        for m, s in enumerate(stores):
            s.grads = self.buf[m, : s.tau]
        self.stores = stores
        self.members = list(range(len(stores)))
        self.alive: torch.Tensor | None = None
        """Rows of `buf` of the current members; None while they are all of them, in order."""

    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor) -> None:
        col = self.buf[:, step]
        if self.alive is None:
            col.copy_(g)
        else:
            col.index_copy_(0, self.alive, g)

    def leave(self, members: Sequence[int], steps: int) -> None:
        rows = [self.members[m] for m in members]
        for r in rows:
            self.stores[r].steps = steps
        if rows == list(range(rows[0], rows[-1] + 1)):
            grads = self.buf[rows[0] : rows[-1] + 1, :steps]
        else:
            grads = self.buf[torch.tensor(rows, device=self.buf.device), :steps]
        type(self.stores[rows[0]]).finished([self.stores[r] for r in rows], grads)
        gone = set(rows)
        self.members = [r for r in self.members if r not in gone]
        self.alive = torch.tensor(self.members, device=self.buf.device, dtype=torch.long)


def keep_rows(n: int, leaving: Sequence[int], device: torch.device) -> torch.Tensor | None:
    """The indices of the `n` current members that stay after `leaving` go; None if none stay."""
    gone = set(leaving)
    stay = [r for r in range(n) if r not in gone]
    return torch.tensor(stay, device=device, dtype=torch.long) if stay else None


__all__ = ["GradientStore", "StackableHook", "StackedHook", "keep_rows"]
