"""FedAvg and FedAvgM (docs/spec.md "FedAvg", "FedAvgM").

FedAvg: each client runs `τ_i` local SGD steps from `w_k` and returns `Δ_i = w_(k,i)^τ − w_k`;
the server sets `w_(k+1) = w_k + Σ_i p_i Δ_i`, with `p_i = D_i / Σ_S D_j` over the clients that
took part (`weighting="samples"`) or `1/m` (`weighting="uniform"`, FedNNNN's unbalanced
setting where the server does not know `D_i`).

FedAvgM ("Momentum" in FedNNNN Table 2, eqs. 10–11): `d_(k+1) = γ d_k + Σ_i p_i Δ_i`,
`w_(k+1) = w_k + d_(k+1)`, `d_0 = 0`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, TypeVar

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
from fedhet.algorithms.nwda import LayerIndex, NWDACollector, nwda_record
from fedhet.errors import FedhetError
from fedhet.training.steps import Transform


def local_sgd_update(
    message: Message, ctx: ClientContext, transforms: Sequence[Transform] = ()
) -> tuple[torch.Tensor, torch.Tensor, Message]:
    """The common client step: SGD for `τ` steps from the received `w`, the algorithm's
    `transforms` (`fedhet.training.steps`) in the local step's chain.

    `τ` is the message's `tau` if the server sent one, else the engine's `ctx.tau`. Returns
    `(w0, w_final, reply)` where the reply carries `delta`, `num_samples`, `steps`, `train_loss`.
    """
    w0 = message.tensors["w"]
    tau = int(message.scalars.get("tau", ctx.tau))
    w, steps, loss = ctx.trainer.sgd(w0, ctx.batches(tau), ctx.sgd, transforms=transforms)
    reply = Message(
        {"delta": w - w0},
        {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss},
    )
    return w0, w, reply


CLIENT_SCALARS = ("steps", "train_loss")
"""Reply scalars every star aggregate averages for `client_diagnostics`."""


def client_diagnostics(acc: WeightedMean) -> dict[str, float]:
    """Round-level `p`-weighted means of what the clients reported about their local work."""
    return {
        "local_steps_mean": acc.scalar("steps"),
        "local_train_loss": acc.scalar("train_loss"),
    }


def mean_delta(
    replies: Iterable[Reply], weighting: str, on_reply=None
) -> tuple[WeightedMean, torch.Tensor]:
    """One pass over the replies: `Σ_i p_i Δ_i` (float64 accumulation) and the accumulator.

    `on_reply(reply, w_i)` sees each reply once as it is added (NWDA's per-client norms)."""
    acc = WeightedMean(weighting)
    for r in replies:
        w = acc.add(r, ("delta",), CLIENT_SCALARS)
        if on_reply is not None:
            on_reply(r, w)
    require_replies(acc.count)
    return acc, acc.mean("delta")


@dataclass(frozen=True, kw_only=True, eq=False)
class FedAvgState(ServerState):
    """FedAvg's server state: `w_k`, and `𝒩` when it logs NWDA."""

    cum_move: float = 0.0
    """`𝒩 = Σ_k ‖w_(k+1) − w_k‖`, the integrated server movement (FedNNNN Fig. 4), kept with
    `nwda=true` (`nwda.nwda_record`); 0 otherwise."""


@dataclass(frozen=True, kw_only=True, eq=False)
class FedAvgMState(FedAvgState):
    """FedAvgM's server state (FedNNNN eqs. 10–11)."""

    d: torch.Tensor
    """Server momentum `d_k` (`d_0 = 0`)."""


@dataclass(frozen=True)
class FedAvgParams:
    weighting: Literal["samples", "uniform"] = "samples"
    nwda: bool = False
    """Log FedNNNN's NWDA columns (N, E per layer kind, server movement; `fednnnn.py`)."""


FS = TypeVar("FS", bound=FedAvgState)
"""The server state of a FedAvg-family algorithm."""
FC = TypeVar("FC", bound=ClientState | None)
"""A FedAvg-family client's state (None for FedAvg's own)."""


@ALGORITHMS.register("fedavg", FedAvgParams, "FedAvg: w ← w + Σ p_i Δ_i")
class FedAvg(Algorithm[FS, FC]):
    """FedAvg; the family (FedAvgM, FedProx, MOON, GraB, FedOpt) extends it with its own
    states."""

    name = "fedavg"
    state_class: ClassVar[type[ServerState]] = FedAvgState

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state: FS, round: int, replies: Iterable[Reply]):
        """Single pass over `replies` (a generator from the round runner is fine)."""
        nwda = self.nwda_collector()
        acc, delta = mean_delta(replies, self.params.weighting, nwda)
        new = replace(state, w=state.w + delta)
        return self.with_nwda(state, new, acc, delta, nwda, client_diagnostics(acc))

    def nwda_collector(self):
        """Per-client layer norms for NWDA (`nwda=true`), gathered as replies stream by."""
        if not getattr(self.params, "nwda", False):
            return None
        if not hasattr(self, "_layer_index"):
            self._layer_index = LayerIndex(self.run.layers, self.run.dim)
        return NWDACollector(self._layer_index)

    def with_nwda(self, old: FedAvgState, new: FedAvgState, acc: WeightedMean,
                  delta_bar: torch.Tensor, nwda, diag: dict[str, Any]) -> tuple[FedAvgState, dict]:
        """Add FedNNNN's NWDA diagnostics when the params ask for them (`nwda=true`)."""
        if nwda is None:
            return new, diag
        new, extra = nwda_record(old, new, nwda.stats(acc, delta_bar), self._layer_index)
        return new, {**diag, **extra}


@dataclass(frozen=True)
class FedAvgMParams:
    server_momentum: float = 0.9
    """Server momentum `γ` (FedNNNN eqs. 10–11); `gamma` is its old name."""
    weighting: Literal["samples", "uniform"] = "samples"
    nwda: bool = False
    ALIASES: ClassVar[dict[str, str]] = {"gamma": "server_momentum"}

    def validate(self) -> None:
        if not 0.0 <= self.server_momentum < 1.0:
            raise FedhetError(
                f"algorithm.server_momentum (γ) must be in [0, 1), got {self.server_momentum}"
            )


@ALGORITHMS.register("fedavgm", FedAvgMParams, "FedAvgM: server momentum d ← γd + Σ p_i Δ_i")
class FedAvgM(FedAvg[FedAvgMState, None]):
    name = "fedavgm"
    state_class = FedAvgMState

    def init(self, w0: torch.Tensor) -> FedAvgMState:
        return FedAvgMState(w=w0.clone(), d=torch.zeros_like(w0))

    def aggregate(self, state: FedAvgMState, round: int, replies: Iterable[Reply]):
        nwda = self.nwda_collector()
        acc, delta = mean_delta(replies, self.params.weighting, nwda)
        d = self.params.server_momentum * state.d + delta
        new = replace(state, w=state.w + d, d=d)
        return self.with_nwda(state, new, acc, delta, nwda, client_diagnostics(acc))
