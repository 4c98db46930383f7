"""NWDA, the norm of the weighted delta average (FedNNNN §3.1, eqs. 4–5), as diagnostics any
star-topology algorithm can log.

With client updates `Δ_i = w_(k,i)^τ − w_k` and weights `p_i`: `Δ̄ = Σ_i p_i Δ_i`, `N = ‖Δ̄‖`,
`E = Σ_i p_i ‖Δ_i‖`, and `N ≤ E` (Proposition 1). The integrated server movement is
`𝒩 = Σ_k ‖w_(k+1) − w_k‖` (Fig. 4). Columns: `N`, `E`, `move`, `cum_move`, and per layer kind
present in the model (`conv`, `fc`, `norm`, `other`) `N_<kind>`, `E_<kind>`, `move_<kind>`.
FedNNNN normalises with these quantities (`fednnnn.py`); FedAvg, FedAvgM and FedProx log them
with `nwda=true` (`fedavg.py`). Both import them from here, so neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import Field, dataclass, replace
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from fedhet.algorithms.base import Reply, WeightedMean, weighted_sum
from fedhet.training.flat import Layer

KINDS = ("conv", "fc", "norm", "other")


class MovingState(Protocol):
    """A server state dataclass with a `cum_move` field (`FedAvgState`, `FedNNNNState`)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def w(self) -> torch.Tensor: ...

    @property
    def cum_move(self) -> float: ...


S = TypeVar("S", bound=MovingState)
"""The state type `nwda_record` is given and returns."""


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
        self.layer_ids = torch.empty(dim, dtype=torch.int64, device="cpu")
        """The layer of each coordinate; moved once to the device of the vectors it meets."""
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
        """`‖v_ℓ‖²` for each layer `ℓ` (float64): shape `(L,)` for a vector `(d,)` (one
        segment sum over the layers' coordinates), `(n, L)` for `n` vectors stacked `(n, d)`
        (a sum over each layer's slice of every row: contiguous reads, where a segment sum
        along the rows would gather columns)."""
        v = v.to(torch.float64)
        if v.dim() == 2:
            return torch.stack([v[:, layer.start : layer.stop].square().sum(dim=1)
                                for layer in self.layers], dim=1)
        out = torch.zeros(len(self), dtype=torch.float64, device=v.device)
        return out.index_add_(0, self._ids_on(v.device), v * v)

    def expand(self, per_layer: torch.Tensor) -> torch.Tensor:
        """A per-layer value spread over the layer's coordinates (float32)."""
        return per_layer.to(torch.float32)[self._ids_on(per_layer.device)]

    def _ids_on(self, device: torch.device) -> torch.Tensor:
        if self.layer_ids.device != device:
            self.layer_ids = self.layer_ids.to(device)
        return self.layer_ids


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
    (an `m × L` table of scalars); `Δ̄` comes from the streaming mean. The updates wait in
    blocks as `WeightedMean`'s do (`WeightedMean.block_bytes`, `blocks_on_cpu`), and a
    block's norms are one sum per layer over the stacked `(n, d)` updates."""

    def __init__(self, index: LayerIndex) -> None:
        self.index = index
        self.rows: list[torch.Tensor] = []
        """`(n, L)` squared layer norms, one block of replies each."""
        self.weights: list[float] = []
        self._waiting: list[torch.Tensor] = []

    def __call__(self, reply: Reply, weight: float) -> None:
        delta = reply.message.tensors["delta"]
        self._waiting.append(delta)
        self.weights.append(weight)
        if WeightedMean.block_full(len(self._waiting), delta):
            self._flush()

    def _flush(self) -> None:
        if len(self._waiting) == 1:
            self.rows.append(self.index.sq_norms(self._waiting[0]).unsqueeze(0))
        elif self._waiting:
            self.rows.append(self.index.sq_norms(torch.stack(self._waiting)))
        self._waiting = []

    def stats(self, acc: WeightedMean, delta_bar: torch.Tensor) -> NWDA:
        self._flush()
        p = torch.tensor(self.weights, dtype=torch.float64, device=delta_bar.device) / acc.total
        return NWDA(p, delta_bar, self.index.sq_norms(delta_bar), torch.cat(self.rows))


def nwda_record(old: S, new: S, stats: NWDA, index: LayerIndex) -> tuple[S, dict[str, float]]:
    """NWDA columns for an algorithm that moved the server model from `old.w` to `new.w`.

    Returns the new state with the running `cum_move` (`𝒩`, a field of the state) and the
    diagnostics.
    """
    move = new.w - old.w
    cum = float(old.cum_move) + math.sqrt(float(index.sq_norms(move).sum()))
    return replace(new, cum_move=cum), nwda_diagnostics(stats, move, index, cum)
