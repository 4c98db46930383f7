"""FedNNNN: norm-normalised aggregation with server momentum (Nagura et al.; SPEC.md "FedNNNN").

NWDA (§3.1, eqs. 4–5). With client updates `Δ_i = w_(k,i)^τ − w_k` and weights `p_i`:
`Δ̄ = Σ_i p_i Δ_i`, `N = ‖Δ̄‖`, `E = Σ_i p_i ‖Δ_i‖`, and `N ≤ E` (Proposition 1). The
integrated server movement is `𝒩 = Σ_k ‖w_(k+1) − w_k‖` (Fig. 4).

- `norm-norm` (eq. 8): `w_(k+1) = w_k + β (E/N) Δ̄`, so `‖w_(k+1) − w_k‖ = β E` (eq. 9).
  It accepts `gamma` too (default 0); with `γ > 0` it is FedNNNN.
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    Message,
    Reply,
    RunInfo,
    WeightedMean,
    weighted_sum,
)
from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta
from fedhet.errors import FedhetError
from fedhet.training.flat import Layer

KINDS = ("conv", "fc", "norm", "other")


# -- NWDA: pure functions on flat vectors ---------------------------------------------------
class LayerIndex:
    """Which layer each coordinate of the flat vector belongs to, and how layers group.

    Built once from `RunInfo.layers` (parameter slices with a kind). Without layers the whole
    vector is one layer of kind `other`.
    """

    def __init__(self, layers: Sequence[Layer], dim: int) -> None:
        if not layers:
            layers = (Layer("all", 0, dim, (dim,), "other"),)
        if sum(layer.stop - layer.start for layer in layers) != dim:
            raise ValueError("layers do not cover the parameter vector")
        self.layers = tuple(layers)
        self.layer_ids = torch.empty(dim, dtype=torch.int64)
        for i, layer in enumerate(self.layers):
            self.layer_ids[layer.start : layer.stop] = i
        self.kinds: dict[str, list[int]] = {}
        modules: dict[str, list[int]] = {}
        for i, layer in enumerate(self.layers):
            self.kinds.setdefault(layer.kind, []).append(i)
            modules.setdefault(layer.name.rsplit(".", 1)[0], []).append(i)
        self.kinds = {k: self.kinds[k] for k in KINDS if k in self.kinds}
        self.modules: list[list[int]] = list(modules.values())
        self.all: list[int] = list(range(len(self.layers)))

    def __len__(self) -> int:
        return len(self.layers)

    def sq_norms(self, v: torch.Tensor) -> torch.Tensor:
        """`‖v_ℓ‖²` for each layer `ℓ` (float64)."""
        v = v.to(torch.float64)
        return torch.zeros(len(self), dtype=torch.float64).index_add_(0, self.layer_ids, v * v)

    def expand(self, per_layer: torch.Tensor) -> torch.Tensor:
        """A per-layer value spread over the layer's coordinates (float32)."""
        return per_layer.to(torch.float32)[self.layer_ids]


@dataclass
class NWDA:
    """One round's update statistics: `Δ̄`, and squared layer norms of `Δ̄` and each `Δ_i`."""

    p: torch.Tensor
    delta_bar: torch.Tensor
    bar_sq: torch.Tensor
    """`‖Δ̄_ℓ‖²` per layer, shape `(L,)`."""
    client_sq: torch.Tensor
    """`‖Δ_(i,ℓ)‖²` per client and layer, shape `(m, L)`."""

    def N(self, group: Sequence[int]) -> float:
        """Eq. 4 restricted to the layers in `group`: `‖Δ̄_g‖`."""
        return math.sqrt(float(self.bar_sq[list(group)].sum()))

    def E(self, group: Sequence[int]) -> float:
        """Eq. 5 restricted to the layers in `group`: `Σ_i p_i ‖Δ_(i,g)‖`."""
        norms = self.client_sq[:, list(group)].sum(dim=1).sqrt()
        return float(self.p @ norms)


def nwda(p: torch.Tensor, deltas: Sequence[torch.Tensor], index: LayerIndex) -> NWDA:
    """NWDA statistics of one round's client updates `deltas` under weights `p` (eqs. 4–5)."""
    delta_bar = weighted_sum(p, deltas)
    client_sq = torch.stack([index.sq_norms(d) for d in deltas])
    return NWDA(p.to(torch.float64), delta_bar, index.sq_norms(delta_bar), client_sq)


def nwda_diagnostics(
    stats: NWDA, move: torch.Tensor, index: LayerIndex, cum_move: float
) -> dict[str, float]:
    """Metric columns: `N`, `E`, `move`, `cum_move`, and `N_/E_/move_<kind>` per layer kind.

    `move` is the server step `w_(k+1) − w_k`; `cum_move` the integrated norm `𝒩` up to and
    including this round.
    """
    move_sq = index.sq_norms(move)
    out = {
        "N": stats.N(index.all),
        "E": stats.E(index.all),
        "move": math.sqrt(float(move_sq.sum())),
        "cum_move": cum_move,
    }
    for kind, group in index.kinds.items():
        out[f"N_{kind}"] = stats.N(group)
        out[f"E_{kind}"] = stats.E(group)
        out[f"move_{kind}"] = math.sqrt(float(move_sq[group].sum()))
    return out


class NWDACollector:
    """NWDA statistics gathered in one pass: per reply only its `L` squared layer norms are kept
    (an `m × L` table of scalars), never the update itself; `Δ̄` comes from the streaming mean."""

    def __init__(self, index: LayerIndex) -> None:
        self.index = index
        self.rows: list[torch.Tensor] = []
        self.weights: list[float] = []

    def __call__(self, reply: Reply, weight: float) -> None:
        self.rows.append(self.index.sq_norms(reply.message.tensors["delta"]))
        self.weights.append(weight)

    def stats(self, acc: WeightedMean, delta_bar: torch.Tensor) -> NWDA:
        p = torch.tensor(self.weights, dtype=torch.float64) / acc.total
        return NWDA(p, delta_bar, self.index.sq_norms(delta_bar), torch.stack(self.rows))


def nwda_record(
    old: Mapping[str, Any], new: dict[str, Any], stats: NWDA, index: LayerIndex,
) -> tuple[dict[str, Any], dict[str, float]]:
    """NWDA columns for an algorithm that moved the server model from `old["w"]` to `new["w"]`.

    Returns the new state with the running `cum_move` (`𝒩`) and the diagnostics.
    """
    move = new["w"] - old["w"]
    cum = float(old.get("cum_move", 0.0)) + math.sqrt(float(index.sq_norms(move).sum()))
    return {**new, "cum_move": cum}, nwda_diagnostics(stats, move, index, cum)


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
@dataclass(frozen=True)
class FedNNNNParams:
    beta: float = 0.7
    """Norm multiplier `β` (Table 5, MNIST non-IID balanced)."""
    gamma: float = 0.8
    """Server momentum `γ` (Table 5, MNIST non-IID balanced)."""
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
        if not 0.0 <= self.gamma < 1.0:
            raise FedhetError(f"algorithm.gamma must be in [0, 1), got {self.gamma}")
        if not 0.0 <= self.eps < 1.0:
            raise FedhetError(f"algorithm.eps must be in [0, 1), got {self.eps}")


@dataclass(frozen=True)
class NormNormParams(FedNNNNParams):
    beta: float = 1.0
    """Norm multiplier `β` (Table 5, MNIST non-IID balanced)."""
    gamma: float = 0.0
    """0 gives eq. 8; any `γ > 0` turns Norm-Norm into FedNNNN."""


@ALGORITHMS.register("fednnnn", FedNNNNParams, "FedNNNN: d ← γd + β(E/N)Δ̄, w ← w + d (eqs. 12–13)")
class FedNNNN(Algorithm):
    """Server of Algorithm 3; the client is FedAvg's (Algorithm 2)."""

    name = "fednnnn"

    def __init__(self, params: FedNNNNParams, run: RunInfo) -> None:
        super().__init__(params, run)
        self.index = LayerIndex(run.layers, run.dim)
        self.groups = [self.index.all] if params.scope == "model" else self.index.modules

    def init(self, w0: torch.Tensor) -> dict[str, Any]:
        return {"w": w0.clone(), "d": torch.zeros_like(w0), "w_avg": w0.clone(), "cum_move": 0.0}

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state: dict[str, Any], round: int, replies: Iterable[Reply]):
        collect = NWDACollector(self.index)
        acc, delta_bar = mean_delta(replies, self.params.weighting, collect)
        stats = collect.stats(acc, delta_bar)
        w, d = state["w"].clone(), state["d"].clone()
        skipped = 0
        for group in self.groups:
            idx = self.coordinates(group)
            w_g, d_g, applied = normalized_step(
                w[idx], d[idx], stats.delta_bar[idx], stats.N(group), stats.E(group),
                self.params.beta, self.params.gamma, self.params.eps,
            )
            w[idx], d[idx] = w_g, d_g
            skipped += not applied
        new = {**state, "w": w, "d": d, "w_avg": state["w"] + stats.delta_bar}
        diag = {**client_diagnostics(acc), "skipped": float(skipped)}
        if self.params.scope == "model":
            N, E = stats.N(self.index.all), stats.E(self.index.all)
            diag["scale"] = self.params.beta * E / N if not skipped else 0.0
        if self.params.nwda:
            move = w - state["w"]
            new["cum_move"] = float(state["cum_move"]) + float(move.to(torch.float64).norm())
            diag.update(nwda_diagnostics(stats, move, self.index, new["cum_move"]))
        return new, diag

    def coordinates(self, group: Sequence[int]) -> slice | torch.Tensor:
        """The flat-vector coordinates of a group of layers (a slice when contiguous)."""
        layers = [self.index.layers[i] for i in group]
        if all(a.stop == b.start for a, b in zip(layers, layers[1:], strict=False)):
            return slice(layers[0].start, layers[-1].stop)
        return torch.cat([torch.arange(x.start, x.stop) for x in layers])

    def eval_params(self, state: dict[str, Any]) -> torch.Tensor:
        return state["w_avg"] if self.params.eval_model == "average" else state["w"]

    def extra_eval_params(self, state: dict[str, Any]) -> dict[str, torch.Tensor]:
        if self.params.eval_model == "average":
            return {"norm": state["w"]}
        return {"avg": state["w_avg"]}


@ALGORITHMS.register("norm-norm", NormNormParams, "Norm-Norm: w ← w + β(E/N)Δ̄ (eq. 8)")
class NormNorm(FedNNNN):
    name = "norm-norm"


__all__ = [
    "FedNNNN",
    "FedNNNNParams",
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
