"""FedNova (Wang et al., NeurIPS 2020, eq. 8; docs/spec.md "FedNova"; reference code JYWa/FedNova).

Client `i` runs `τ_i` local steps (SGD with the run's learning rate `η`, local momentum `ρ` and
weight decay, plus an optional proximal term `μ (w − w_k)` as in FedProx) and returns its
normalised direction `d_i = −Δ_i / (η a_i)` and `a_i = ‖a_i‖₁`, the sum of the weights its
`τ_i` gradients carry in `Δ_i`:
- plain SGD: `a_i = τ_i`;
- local momentum `ρ`: `a_i = Σ_(t=1..τ_i) (1 − ρ^t)/(1 − ρ)`;
- proximal `μ`: `a_i = Σ_(t=0..τ_i−1) (1 − ημ)^t`;
- both: the proximal gradient `μ (w − w_k)` enters the momentum buffer with the data gradient
  (as in the authors' code, where the proximal term is added to the buffer in place), and `a_i`
  is the exact weight sum of that linear recursion (`normaliser`, checked against real local
  SGD in tests/test_baselines.py). The authors' code instead adds the two counters
  (`a ← (a + Σ ρ^s)(1 − ημ) + 1` per step), which for one step gives `2 − ημ` where the single
  gradient's weight is 1; its fixed point on the quadratic is then not FedNova's
  (tests/test_quadratic.py).
The server sets `τ_eff` and `w_(k+1) = w_k − η τ_eff Σ_i p_i d_i`; with server momentum `γ > 0`:
`u_(k+1) = γ u_k + τ_eff Σ_i p_i d_i`, `w_(k+1) = w_k − η u_(k+1)`. `τ_eff` scales the server
step and does not move the fixed point:
- `tau_eff = "normaliser"` (default, docs/spec.md): `τ_eff = Σ_i p_i a_i`, so with equal `τ_i`
  FedNova takes exactly FedAvg's (FedProx's, FedAvg-with-momentum's) step;
- `tau_eff = "steps"`: `τ_eff = Σ_i p_i τ_i`, eq. 8 of the paper as written, and what the
  authors' code uses when `μ > 0` (with `μ = 0` it uses `Σ p_i a_i`, as the default does).
  With `μ > 0` it enlarges the step by `Σ p_i τ_i / Σ p_i a_i`; with momentum it shrinks it by
  about `1 − ρ`.
The reply also carries the round's `η` as a scalar, so the server's step matches the clients'
under a learning-rate schedule. With equal `τ_i` and neither momentum nor `μ`, this is FedAvg
(up to rounding).
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
    Message,
    Reply,
    ServerState,
    WeightedMean,
    require_replies,
)
from fedhet.algorithms.fedavg import CLIENT_SCALARS, client_diagnostics, local_sgd_update
from fedhet.errors import FedhetError
from fedhet.training.steps import Proximal


def normaliser(tau: int, lr: float = 0.0, rho: float = 0.0, mu: float = 0.0) -> float:
    """`a_i = ‖a_i‖₁` for `tau` local steps with momentum `rho` and proximal `mu` (module doc).

    The general case runs the scalar recursion `v ← ρ v + 1 + μ x`, `x ← x − η v` (unit
    gradients, `x = w − w_k`) and returns `−x_τ / η`; the closed forms are its special cases.
    """
    if rho == 0 and mu * lr == 0:
        return float(tau)
    if mu * lr == 0:
        return sum((1 - rho**t) / (1 - rho) for t in range(1, tau + 1))
    if rho == 0:
        return sum((1 - lr * mu) ** t for t in range(tau))
    x = v = 0.0
    for _ in range(tau):
        v = rho * v + 1.0 + mu * x
        x -= lr * v
    return -x / lr


@dataclass(frozen=True, kw_only=True, eq=False)
class FedNovaState(ServerState):
    """FedNova's server state: `w_k` and, with server momentum, its buffer."""

    u: torch.Tensor | None = None
    """Server momentum buffer `u_k` (`u_0 = 0`), None when `server_momentum = 0`."""


@dataclass(frozen=True)
class FedNovaParams:
    mu: float = 0.0
    """Proximal coefficient of the local objective (FedNova + FedProx); 0 disables it."""
    server_momentum: float = 0.0
    """Server momentum `γ` (the reference code's `gmf`); 0 disables it."""
    weighting: Literal["samples", "uniform"] = "samples"
    tau_eff: Literal["normaliser", "steps"] = "normaliser"
    """`Σ p_i a_i` (default) or `Σ p_i τ_i` (eq. 8 as written; the reference code with μ > 0)."""

    def validate(self) -> None:
        if not (self.mu >= 0 and math.isfinite(self.mu)):
            raise FedhetError(f"algorithm.mu must be a number ≥ 0, got {self.mu}")
        if not 0.0 <= self.server_momentum < 1.0:
            raise FedhetError(f"algorithm.server_momentum must be in [0, 1), got {self.server_momentum}")


@ALGORITHMS.register("fednova", FedNovaParams, "FedNova: w ← w − η τ_eff Σ p_i d_i, d_i = −Δ_i/(η a_i)")
class FedNova(Algorithm[FedNovaState, None]):
    name = "fednova"
    state_class = FedNovaState
    plain_sgd = (
        "its normaliser a_i counts SGD steps (with momentum or a proximal term), so that "
        "d_i = −Δ_i/(η a_i) is the mean local gradient; Adam's steps have no such a_i"
    )

    # -- server half ----------------------------------------------------------------------
    def init(self, w0: torch.Tensor) -> FedNovaState:
        u = torch.zeros_like(w0) if self.params.server_momentum else None
        return FedNovaState(w=w0.clone(), u=u)

    def aggregate(self, state: FedNovaState, round: int, replies: Iterable[Reply]):
        """One pass: `τ_eff` (`Σ p_i a_i`, or `Σ p_i τ_i`) and `Σ p_i d_i` over the clients that
        returned."""
        acc = WeightedMean(self.params.weighting)
        a: dict[int, float] = {}
        lr: float | None = None
        for r in replies:
            acc.add(r, ("d",), (*CLIENT_SCALARS, "a"))
            a[r.client_id] = r.message.scalars["a"]
            if lr is None:
                lr = r.message.scalars["lr"]
        require_replies(acc.count)
        assert lr is not None, "set by the first reply, and require_replies refused none"
        tau_eff = acc.scalar("a" if self.params.tau_eff == "normaliser" else "steps")
        step = acc.mean("d").mul_(tau_eff)
        u = state.u
        if self.params.server_momentum:
            assert u is not None, "init keeps a momentum buffer when server_momentum > 0"
            u = step = u.mul(self.params.server_momentum).add_(step)
        new = replace(state, w=state.w - lr * step, u=u)
        diag: dict[str, Any] = client_diagnostics(acc)
        diag["tau_eff"] = tau_eff
        diag["a"] = a
        return new, diag

    # -- client half ----------------------------------------------------------------------
    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        w0 = message.tensors["w"]
        _, _, reply = local_sgd_update(message, ctx, (Proximal(self.params.mu, w0),))
        lr = ctx.sgd.lr
        a = normaliser(int(reply.scalars["steps"]), lr, ctx.sgd.momentum, self.params.mu)
        d = reply.tensors.pop("delta").div_(-lr * a)
        reply.tensors["d"] = d
        reply.scalars.update({"a": a, "lr": lr})
        return reply, state
