"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1; docs/spec.md "SCAFFOLD").

Server state (`ScaffoldState`): model `x` and control variate `c`; client state
(`ScaffoldClientState`): its own control variate `c_i` (zeros before its first round, kept
across rounds by the engine). The downlink carries `x` and
`c`; client `i` runs `τ_i` local steps `y ← y − η (g(y) − c_i + c)` from `y = x`, then sets
- option II (default): `c_i⁺ = c_i − c + (x − y)/(τ_i η)`;
- option I: `c_i⁺ = ∇F_i(x)`, an extra exact pass over the local data (plus weight decay, so
  `c_i` estimates the gradient the local steps use);
and uploads `Δy_i = y − x` and `Δc_i = c_i⁺ − c_i`. The server sets
`x ← x + η_g Σ_S p_i Δy_i` and `c ← c + (|S|/N) Σ_S p_i Δc_i`.

Weights **[choice]**: `weighting = "samples"` (default) uses the data weights
`p_i = D_i / Σ_S D_j` in both means, matching FedAvg; `weighting = "uniform"` uses `1/|S|` in both,
the paper's Algorithm 1. The two means must use the same weights: with full participation
`c = Σ_i p_i c_i` at every round, so at a fixed point `c = 0` means `Σ_i p_i ∇F_i(x) = 0`. Mixing
data-weighted `Δy` with a plain mean of `Δc` (docs/spec.md's literal rule) makes SCAFFOLD converge to
the minimiser of `(1/N) Σ_i F_i` instead of `Σ_i p_i F_i` when client sizes differ (see
tests/test_quadratic.py).

Local momentum `ρ` (**[choice]**; the paper uses plain SGD): the corrected gradient
`g − c_i + c` goes through the momentum buffer like any gradient, so after `τ_i` steps the model
has moved by `η Σ_t a_t (g_t − c_i + c)` with weights `a_t` summing to FedNova's
`a_i = Σ_(t=1..τ_i) (1 − ρ^t)/(1 − ρ)` (`fednova.normaliser`), not to `τ_i`. Option II therefore
divides by `a_i η`: `c_i⁺ = c_i − c + (x − y)/(a_i η)` is then exactly the `a`-weighted mean of
the raw gradients `g_t`, as `(x − y)/(τ_i η)` is the plain mean without momentum (`a_i = τ_i`).
Dividing by `τ_i η` overshoots by `a_i/τ_i`: each round then multiplies the gap between `c_i` and
`c` by about `1 − a_i/τ_i`, which diverges once `a_i/τ_i > 2` (`ρ ≳ 0.5` with a few steps;
tests/test_quadratic.py, tests/test_baselines.py).

With `c = c_i = 0` (every client's first round) the local steps are plain SGD, so the first
round equals FedAvg's; with one client `c = c_1` always holds and SCAFFOLD follows FedAvg.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    ClientState,
    Message,
    Reply,
    ServerState,
    WeightedMean,
    require_replies,
)
from fedhet.algorithms.fedavg import CLIENT_SCALARS, client_diagnostics, local_sgd_update
from fedhet.algorithms.fednova import normaliser
from fedhet.errors import FedhetError
from fedhet.training.steps import Correction


@dataclass(frozen=True, kw_only=True, eq=False)
class ScaffoldState(ServerState):
    """SCAFFOLD's server state: the model `x` (`w`) and the server control variate `c`."""

    c: torch.Tensor
    """Server control variate `c` (zeros at start), the running `Σ_i p_i c_i` under full
    participation."""


@dataclass(kw_only=True, eq=False)
class ScaffoldClientState(ClientState):
    """One client's control variate, kept on the client across rounds."""

    c_i: torch.Tensor | None = None
    """Client control variate `c_i`; None before the client's first round (where it is zeros)."""

    @classmethod
    def from_legacy(cls, value: Any) -> ScaffoldClientState:
        """Older checkpoints kept `c_i` itself as the client's state."""
        if isinstance(value, torch.Tensor):
            return cls(c_i=value)
        return super().from_legacy(value)


@dataclass(frozen=True)
class ScaffoldParams:
    option: Literal["I", "II"] = "II"
    """Control-variate update: `II` reuses the local steps, `I` computes `∇F_i(x)` exactly."""
    server_lr: float = 1.0
    """Global step size `η_g`."""
    weighting: Literal["samples", "uniform"] = "samples"
    """Weights of the `Δy_i` and `Δc_i` means **[choice]**: data-weighted by default."""

    def validate(self) -> None:
        if not (self.server_lr > 0 and math.isfinite(self.server_lr)):
            raise FedhetError(f"algorithm.server_lr must be a positive number, got {self.server_lr}")


def option_one_variate(ctx: ClientContext, x: torch.Tensor) -> torch.Tensor:
    """Option I: `c_i⁺ = ∇F_i(x)` over the client's data, plus the weight decay the steps use."""
    return ctx.objective_gradient(x)


def option_two_variate(
    x: torch.Tensor, y: torch.Tensor, c: torch.Tensor, c_i: torch.Tensor | None, steps: int, lr: float,
    momentum: float = 0.0,
) -> torch.Tensor:
    """Option II: `c_i⁺ = c_i − c + (x − y)/(a_i η)` (`c_i = 0` before the client's first round),
    `a_i = τ_i` for plain SGD and FedNova's momentum normaliser otherwise (module docstring)."""
    moved = normaliser(max(steps, 1), lr, momentum)
    c_new = (x - y).div_(moved * lr).sub_(c)
    return c_new if c_i is None else c_new.add_(c_i)


def variate_step(acc: WeightedMean, num_clients: int) -> torch.Tensor:
    """The server's `c` increment `(|S|/N) Σ_S p_i Δc_i`, with the weights of the model mean
    (`acc` has accumulated `delta_c` over the `|S|` clients that returned)."""
    share = acc.count / num_clients
    return (acc.sum("delta_c") * (share / acc.total)).to(torch.float32)


def corrected(c: torch.Tensor, c_i: torch.Tensor | None) -> Correction:
    """The local step's gradient `g − c_i + c` (`c_i = 0` before the client's first round)."""
    return Correction(c if c_i is None else c - c_i)


@ALGORITHMS.register("scaffold", ScaffoldParams, "SCAFFOLD: control variates c, c_i correct client drift")
class Scaffold(Algorithm[ScaffoldState, ScaffoldClientState]):
    name = "scaffold"
    state_class = ScaffoldState
    client_state_class = ScaffoldClientState
    plain_sgd = (
        "its control variates correct SGD's drift: the step y ← y − η (g − c_i + c) and option "
        "II's c_i⁺ = c_i − c + (x − y)/(a_i η) hold for (momentum) SGD steps only"
    )

    # -- server half ----------------------------------------------------------------------
    def init(self, w0: torch.Tensor) -> ScaffoldState:
        return ScaffoldState(w=w0.clone(), c=torch.zeros_like(w0))

    def configure(self, state: ScaffoldState, client_id: int, round: int) -> Message:
        return Message({"w": state.w, "c": state.c})

    def aggregate(self, state: ScaffoldState, round: int, replies: Iterable[Reply]):
        """One pass: running `Σ p_i Δy_i` and `Σ p_i Δc_i`; `|S|` is the number that returned."""
        acc = WeightedMean(self.params.weighting)
        for r in replies:
            acc.add(r, ("delta", "delta_c"), CLIENT_SCALARS)
        require_replies(acc.count)
        w = state.w + self.params.server_lr * acc.mean("delta")
        c = state.c + variate_step(acc, self.run.num_clients)
        diag = client_diagnostics(acc)
        diag["c_norm"] = float(c.norm())
        return replace(state, w=w, c=c), diag

    # -- client half ----------------------------------------------------------------------
    def client_init(self, client_id: int) -> ScaffoldClientState:
        return ScaffoldClientState()

    def client_update(self, message: Message, ctx: ClientContext, state: ScaffoldClientState):
        x, c = message.tensors["w"], message.tensors["c"]
        c_i = state.c_i
        if self.params.option == "I":
            c_new = option_one_variate(ctx, x)
        _, y, reply = local_sgd_update(message, ctx, (corrected(c, c_i),))
        if self.params.option == "II":
            c_new = option_two_variate(
                x, y, c, c_i, int(reply.scalars["steps"]), ctx.sgd.lr, ctx.sgd.momentum
            )
        reply.tensors["delta_c"] = c_new if c_i is None else c_new - c_i
        return reply, ScaffoldClientState(c_i=c_new)
