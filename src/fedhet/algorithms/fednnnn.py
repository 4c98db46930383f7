"""FedNNNN: norm-normalised aggregation with server momentum (Nagura et al.; docs/spec.md "FedNNNN").

NWDA (§3.1, eqs. 4–5). With client updates `Δ_i = w_(k,i)^τ − w_k` and weights `p_i`:
`Δ̄ = Σ_i p_i Δ_i`, `N = ‖Δ̄‖`, `E = Σ_i p_i ‖Δ_i‖`, and `N ≤ E` (Proposition 1). The
integrated server movement is `𝒩 = Σ_k ‖w_(k+1) − w_k‖` (Fig. 4).

- `norm-norm` (eq. 8): `w_(k+1) = w_k + β (E/N) Δ̄`, so `‖w_(k+1) − w_k‖ = β E` (eq. 9).
  It accepts `server_momentum` (`γ`) too (default 0); with `γ > 0` it is FedNNNN.
- `fednnnn` (eqs. 12–13, Algorithm 3): `d_(k+1) = γ d_k + β (E/N) Δ̄`, `w_(k+1) = w_k + d_(k+1)`,
  `d_0 = 0`. ("Momentum", eqs. 10–11, is `fedavgm` in `fedavg.py`.)
- The `N ≈ 0` rule (§4.2): when `N = 0` or `N < ε E`, the server does not normalise and returns
  `w_k` as is. **[choice]** The whole round is skipped: `w_(k+1) = w_k` and `d_(k+1) = d_k`
  (the paper says only "return `w_t` as is"; decaying `d` would move `w`).
- Norms over the whole flattened parameter vector **[choice]** (`scope="model"`);
  `scope="layer"` normalises each layer (a module's weight and bias together) on its own, each
  with its own `N`, `E` and `N ≈ 0` rule.
- The evaluation model (§4.1): the normalised model `w_(k+1)` is carried to the next round; the
  plain average `w_k + Δ̄` ("Average Aggregation") is the model the paper evaluates — §4.1 says
  the normalised model's accuracy "remains extremely poor", so Table 2 reports the average.
  **[choice]** `eval_model="average"`: `test_accuracy` is the plain average and
  `test_accuracy_norm` the carried normalised model; `eval_model="normalized"` swaps them
  (`test_accuracy` the carried model, `test_accuracy_avg` the average).
- Unbalanced setting: `weighting="uniform"` gives `p_i = 1/m` (the server does not know `D_i`).

Diagnostics each round (metrics.csv columns): `N`, `E`, `move = ‖w_(k+1) − w_k‖`, `cum_move`
(`𝒩`), and per layer kind present in the model (`conv`, `fc`, `norm`, `other`): `N_<kind>`,
`E_<kind>`, `move_<kind>`. The appendix figures (eq. 24) plot `move_<kind>` as their "N".
`nwda_record` adds the same columns to any algorithm that has `Δ_i`, `p_i` and both models
(FedAvg, FedAvgM and FedProx with `nwda=true`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    Message,
    Reply,
    RunInfo,
    ServerState,
)
from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta
from fedhet.algorithms.nwda import NWDA, LayerIndex, NWDACollector, nwda, nwda_diagnostics, nwda_record
from fedhet.errors import FedhetError


def normalized_step(
    w: torch.Tensor, d: torch.Tensor, delta_bar: torch.Tensor, N: float, E: float,
    beta: float, gamma: float, eps: float,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Eqs. 12–13 on one vector (or one layer): returns `(w_(k+1), d_(k+1), applied)`.

    `d_(k+1) = γ d_k + β (E/N) Δ̄`, `w_(k+1) = w_k + d_(k+1)`; when `N = 0` or `N < ε E` the
    step is skipped and `(w_k, d_k)` come back unchanged (§4.2, SPEC [choice]).
    """
    if N <= 0.0 or eps * E > N:
        return w, d, False
    d_next = gamma * d + (beta * E / N) * delta_bar
    return w + d_next, d_next, True


# -- the algorithms --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, eq=False)
class FedNNNNState(ServerState):
    """FedNNNN's (and Norm-Norm's) server state (eqs. 12–13, §4.1)."""

    d: torch.Tensor
    """Server momentum `d_k` (`d_0 = 0`; stays 0 with `γ = 0`, Norm-Norm)."""
    w_avg: torch.Tensor
    """The plain average `w_(k−1) + Δ̄` of the last round ("Average Aggregation", §4.1);
    `w_0` before the first round."""
    cum_move: float = 0.0
    """`𝒩 = Σ_k ‖w_(k+1) − w_k‖`, the integrated movement of the carried model (Fig. 4)."""


@dataclass(frozen=True)
class FedNNNNParams:
    beta: float = 0.7
    """Norm multiplier `β` (Table 5, MNIST non-IID balanced)."""
    server_momentum: float = 0.8
    """Server momentum `γ` (Table 5, MNIST non-IID balanced); `gamma` is its old name."""
    ALIASES: ClassVar[dict[str, str]] = {"gamma": "server_momentum"}
    eps: float = 1e-4
    """`N ≈ 0` threshold: skip the round when `N < ε E` **[choice]**."""
    scope: Literal["model", "layer"] = "model"
    weighting: Literal["samples", "uniform"] = "samples"
    eval_model: Literal["average", "normalized"] = "average"
    nwda: bool = True
    """Log the NWDA columns (N, E per layer kind, server movement)."""

    def validate(self) -> None:
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise FedhetError(f"algorithm.beta must be a positive number, got {self.beta}")
        if not 0.0 <= self.server_momentum < 1.0:
            raise FedhetError(
                f"algorithm.server_momentum (γ) must be in [0, 1), got {self.server_momentum}"
            )
        if not 0.0 <= self.eps < 1.0:
            raise FedhetError(f"algorithm.eps must be in [0, 1), got {self.eps}")


@dataclass(frozen=True)
class NormNormParams(FedNNNNParams):
    beta: float = 1.0
    """Norm multiplier `β` (Table 5, MNIST non-IID balanced)."""
    server_momentum: float = 0.0
    """`γ`: 0 gives eq. 8; any `γ > 0` turns Norm-Norm into FedNNNN."""


@ALGORITHMS.register("fednnnn", FedNNNNParams, "FedNNNN: d ← γd + β(E/N)Δ̄, w ← w + d (eqs. 12–13)")
class FedNNNN(Algorithm[FedNNNNState, None]):
    """Server of Algorithm 3; the client is FedAvg's (Algorithm 2)."""

    name = "fednnnn"
    state_class = FedNNNNState

    def __init__(self, params: FedNNNNParams, run: RunInfo) -> None:
        super().__init__(params, run)
        self.index = LayerIndex(run.layers, run.dim)
        self.groups = [self.index.all] if params.scope == "model" else self.index.modules

    def init(self, w0: torch.Tensor) -> FedNNNNState:
        return FedNNNNState(w=w0.clone(), d=torch.zeros_like(w0), w_avg=w0.clone())

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state: FedNNNNState, round: int, replies: Iterable[Reply]):
        collect = NWDACollector(self.index)
        acc, delta_bar = mean_delta(replies, self.params.weighting, collect)
        stats = collect.stats(acc, delta_bar)
        w, d = state.w.clone(), state.d.clone()
        skipped = 0
        for group in self.groups:
            idx = self.coordinates(group, w.device)
            w_g, d_g, applied = normalized_step(
                w[idx], d[idx], stats.delta_bar[idx], stats.N(group), stats.E(group),
                self.params.beta, self.params.server_momentum, self.params.eps,
            )
            w[idx], d[idx] = w_g, d_g
            skipped += not applied
        cum_move = state.cum_move
        diag = {**client_diagnostics(acc), "skipped": float(skipped)}
        if self.params.scope == "model":
            N, E = stats.N(self.index.all), stats.E(self.index.all)
            diag["scale"] = self.params.beta * E / N if not skipped else 0.0
        if self.params.nwda:
            move = w - state.w
            cum_move = float(state.cum_move) + float(move.to(torch.float64).norm())
            diag.update(nwda_diagnostics(stats, move, self.index, cum_move))
        new = replace(state, w=w, d=d, w_avg=state.w + stats.delta_bar, cum_move=cum_move)
        return new, diag

    def coordinates(self, group: Sequence[int], device: torch.device) -> slice | torch.Tensor:
        """The flat-vector coordinates of a group of layers (a slice when contiguous; else an
        index on `device`)."""
        layers = [self.index.layers[i] for i in group]
        if all(a.stop == b.start for a, b in zip(layers, layers[1:], strict=False)):
            return slice(layers[0].start, layers[-1].stop)
        return torch.cat([torch.arange(x.start, x.stop, device=device) for x in layers])

    def eval_params(self, state: FedNNNNState) -> torch.Tensor:
        return state.w_avg if self.params.eval_model == "average" else state.w

    def extra_eval_params(self, state: FedNNNNState) -> dict[str, torch.Tensor]:
        if self.params.eval_model == "average":
            return {"norm": state.w}
        return {"avg": state.w_avg}


@ALGORITHMS.register("norm-norm", NormNormParams, "Norm-Norm: w ← w + β(E/N)Δ̄ (eq. 8)")
class NormNorm(FedNNNN):
    name = "norm-norm"


__all__ = [
    "FedNNNN",
    "FedNNNNParams",
    "FedNNNNState",
    "LayerIndex",
    "NWDA",
    "NWDACollector",
    "NormNorm",
    "NormNormParams",
    "normalized_step",
    "nwda",
    "nwda_diagnostics",
    "nwda_record",
]
