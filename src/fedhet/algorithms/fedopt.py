"""Adaptive server optimizers: FedAdagrad, FedYogi, FedAdam (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2).

The clients run FedAvg's local steps (FedProx's with `mu > 0`, any local optimizer). The
round's FedAvg-family aggregate `x' = x_t + Σ_i p_i Δ_i` gives the pseudo-gradient
`Δ_t = x' − x_t`, and the server treats it as a gradient step of its own optimizer:

    m_t = β1 m_(t−1) + (1 − β1) Δ_t
    v_t = v_(t−1) + Δ_t²                                      FedAdagrad
    v_t = v_(t−1) − (1 − β2) Δ_t² sign(v_(t−1) − Δ_t²)        FedYogi
    v_t = β2 v_(t−1) + (1 − β2) Δ_t²                          FedAdam
    x_(t+1) = x_t + η m_t / (√v_t + τ)

elementwise, `t = 0, 1, …` the server's steps, `η` the server learning rate, `τ` the degree of
adaptivity. Initial values: `m_(−1) = 0` and `v_(−1) = τ²` (**[choice]**: the paper asks for
`v_(−1) ≥ τ²`; the least such value is taken; `v_init="zero"` starts from `v_(−1) = 0` as
Flower's strategies do, which differs only while `v` is near `τ²`). FedAdam with
`bias_correction=true` scales the step by Kingma & Ba's `√(1 − β2^(t+1)) / (1 − β1^(t+1))`, as
Flower's `FedAdam` does (the paper's Algorithm 2 has no bias correction, the default).

Defaults (**[choice]**; the paper tunes `η` and `τ` per task over grids and fixes `β1 = 0.9`,
`β2 = 0.99`): Flower 1.41's strategy defaults. FedAdam `η = 0.1`, `β1 = 0.9`, `β2 = 0.99`,
`τ = 1e-9`; FedYogi `η = 0.01`, `β1 = 0.9`, `β2 = 0.99`, `τ = 1e-3`; FedAdagrad `η = 0.1`,
`β1 = 0` (Adagrad without momentum, as Flower's `FedAdagrad` fixes it), `τ = 1e-9`.

The server step is `AdaptiveServer`, a mixin placed before any FedAvg-family class whose state
is a `FedAvgState` (FedAvg, FedProx, MOON, GraB-FedAvg): `class MoonAdam(AdaptiveServer, Moon)`
with `rule = "adam"` runs MOON's clients under FedAdam's server (its parameter dataclass then
needs both classes' fields; tests/test_fedopt.py builds one). The client half and the messages
are the family's own: the downlink is `w`, the reply `delta` and the scalars, so every executor
and Flower's deployment run it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch

from fedhet.algorithms.base import ALGORITHMS, Reply
from fedhet.algorithms.fedavg import FedAvg, FedAvgState
from fedhet.algorithms.fedprox import FedProx
from fedhet.errors import FedhetError

Rule = Literal["adagrad", "yogi", "adam"]


@dataclass(frozen=True, kw_only=True, eq=False)
class FedOptState(FedAvgState):
    """The server's model `x_t` (`w`) and its optimizer's moments."""

    m: torch.Tensor
    """First moment `m_(t−1)` (zeros at start)."""
    v: torch.Tensor
    """Second moment `v_(t−1)` (`τ²`, or zeros with `v_init="zero"`, at start)."""
    t: int = 0
    """Server steps taken so far (rounds in which some client replied)."""


def second_moment(rule: Rule, v: torch.Tensor, d2: torch.Tensor, beta2: float) -> torch.Tensor:
    """`v_t` from `v_(t−1)` and `Δ_t²` (Algorithm 2's three variants, module docstring)."""
    if rule == "adagrad":
        return v + d2
    if rule == "yogi":
        return v - (1 - beta2) * d2 * torch.sign(v - d2)
    return beta2 * v + (1 - beta2) * d2


def server_step(
    rule: Rule, x: torch.Tensor, delta: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
    t: int, eta: float, beta1: float, beta2: float, tau: float, bias_correction: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(x_(t+1), m_t, v_t)` from the pseudo-gradient `Δ_t` (module docstring); `t` counts from 0."""
    m = beta1 * m + (1 - beta1) * delta
    v = second_moment(rule, v, delta * delta, beta2)
    if bias_correction:
        eta = eta * math.sqrt(1 - beta2 ** (t + 1)) / (1 - beta1 ** (t + 1))
    return x + eta * m / (torch.sqrt(v) + tau), m, v


class _Checked:
    """The checks every adaptive server's parameters share."""

    def validate(self) -> None:
        p: Any = self
        beta2 = getattr(p, "beta2", 0.0)
        checks = [
            (p.server_lr > 0 and math.isfinite(p.server_lr),
             f"algorithm.server_lr (η) must be a positive number, got {p.server_lr}"),
            (0 <= p.beta1 < 1, f"algorithm.beta1 must be in [0, 1), got {p.beta1}"),
            (0 <= beta2 < 1, f"algorithm.beta2 must be in [0, 1), got {beta2}"),
            (p.tau > 0 and math.isfinite(p.tau),
             f"algorithm.tau (τ) must be a positive number, got {p.tau}"),
            (p.mu >= 0 and math.isfinite(p.mu), f"algorithm.mu must be a number ≥ 0, got {p.mu}"),
        ]
        for ok, message in checks:
            if not ok:
                raise FedhetError(message)


@dataclass(frozen=True)
class FedAdagradParams(_Checked):
    server_lr: float = 0.1
    """Server learning rate `η`."""
    beta1: float = 0.0
    """First-moment decay `β1` (0: Adagrad without momentum)."""
    tau: float = 1e-9
    """Degree of adaptivity `τ` (added to `√v_t`)."""
    v_init: Literal["tau2", "zero"] = "tau2"
    """`v_(−1)`: `τ²` (the paper's `v_(−1) ≥ τ²`) or 0 (Flower's strategies)."""
    mu: float = 0.0
    """The clients' proximal term `μ` (FedProx's local steps; 0: FedAvg's)."""
    weighting: Literal["samples", "uniform"] = "samples"
    """`p_i` of the pseudo-gradient `Δ_t = Σ_i p_i Δ_i`."""


@dataclass(frozen=True)
class FedYogiParams(_Checked):
    server_lr: float = 0.01
    """Server learning rate `η`."""
    beta1: float = 0.9
    """First-moment decay `β1`."""
    beta2: float = 0.99
    """Second-moment rate `β2`."""
    tau: float = 1e-3
    """Degree of adaptivity `τ` (added to `√v_t`)."""
    v_init: Literal["tau2", "zero"] = "tau2"
    """`v_(−1)`: `τ²` (the paper's `v_(−1) ≥ τ²`) or 0 (Flower's strategies)."""
    mu: float = 0.0
    """The clients' proximal term `μ` (FedProx's local steps; 0: FedAvg's)."""
    weighting: Literal["samples", "uniform"] = "samples"
    """`p_i` of the pseudo-gradient `Δ_t = Σ_i p_i Δ_i`."""


@dataclass(frozen=True)
class FedAdamParams(_Checked):
    server_lr: float = 0.1
    """Server learning rate `η`."""
    beta1: float = 0.9
    """First-moment decay `β1`."""
    beta2: float = 0.99
    """Second-moment decay `β2`."""
    tau: float = 1e-9
    """Degree of adaptivity `τ` (added to `√v_t`)."""
    v_init: Literal["tau2", "zero"] = "tau2"
    """`v_(−1)`: `τ²` (the paper's `v_(−1) ≥ τ²`) or 0 (Flower's strategies)."""
    bias_correction: bool = False
    """Scale `η` by `√(1 − β2^(t+1)) / (1 − β1^(t+1))` (Flower's `FedAdam`; not in the paper)."""
    mu: float = 0.0
    """The clients' proximal term `μ` (FedProx's local steps; 0: FedAvg's)."""
    weighting: Literal["samples", "uniform"] = "samples"
    """`p_i` of the pseudo-gradient `Δ_t = Σ_i p_i Δ_i`."""


class AdaptiveServer(FedAvg[FedOptState, Any]):
    """The server half of Algorithm 2 over a FedAvg-family aggregate (module docstring). Put it
    before the family's class, whose client half and aggregate it builds on:
    `class FedAdam(AdaptiveServer, FedProx)`."""

    rule: ClassVar[Rule]
    state_class = FedOptState

    def init(self, w0: torch.Tensor) -> FedOptState:
        p = self.params
        v0 = p.tau**2 if p.v_init == "tau2" else 0.0
        return FedOptState(w=w0.clone(), m=torch.zeros_like(w0), v=torch.full_like(w0, v0))

    def aggregate(self, state: FedOptState, round: int, replies: Iterable[Reply]):
        averaged, diag = super().aggregate(state, round, replies)
        delta = averaged.w - state.w
        p = self.params
        w, m, v = server_step(
            self.rule, state.w, delta, state.m, state.v, state.t, p.server_lr, p.beta1,
            getattr(p, "beta2", 0.0), p.tau, getattr(p, "bias_correction", False),
        )
        diag = {**diag, "pseudo_grad_norm": float(delta.norm())}
        return replace(averaged, w=w, m=m, v=v, t=state.t + 1), diag


@ALGORITHMS.register("fedadagrad", FedAdagradParams,
                     "FedAdagrad: server Adagrad on Δ = Σ p_i Δ_i (Reddi et al. 2021)")
class FedAdagrad(AdaptiveServer, FedProx[FedOptState, None]):
    name = "fedadagrad"
    rule = "adagrad"


@ALGORITHMS.register("fedyogi", FedYogiParams,
                     "FedYogi: server Yogi on Δ = Σ p_i Δ_i (Reddi et al. 2021)")
class FedYogi(AdaptiveServer, FedProx[FedOptState, None]):
    name = "fedyogi"
    rule = "yogi"


@ALGORITHMS.register("fedadam", FedAdamParams,
                     "FedAdam: server Adam on Δ = Σ p_i Δ_i (Reddi et al. 2021)")
class FedAdam(AdaptiveServer, FedProx[FedOptState, None]):
    name = "fedadam"
    rule = "adam"
