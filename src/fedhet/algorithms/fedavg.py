"""FedAvg and FedAvgM (SPEC.md "FedAvg", "FedAvgM").

FedAvg: each client runs `τ_i` local SGD steps from `w_k` and returns `Δ_i = w_(k,i)^τ − w_k`;
the server sets `w_(k+1) = w_k + Σ_i p_i Δ_i`, with `p_i = D_i / Σ_S D_j` over the clients that
took part (`weighting="samples"`) or `1/m` (`weighting="uniform"`, FedNNNN's unbalanced
setting where the server does not know `D_i`).

FedAvgM ("Momentum" in FedNNNN Table 2, eqs. 10–11): `d_(k+1) = γ d_k + Σ_i p_i Δ_i`,
`w_(k+1) = w_k + d_(k+1)`, `d_0 = 0`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    Message,
    Reply,
    sample_weights,
    weighted_sum,
)
from fedhet.errors import FedhetError
from fedhet.training.local import GradTransform


def local_sgd_update(
    message: Message, ctx: ClientContext, transform: GradTransform | None = None
) -> tuple[torch.Tensor, torch.Tensor, Message]:
    """The common client step: SGD for `τ` steps from the received `w`.

    `τ` is the message's `tau` if the server sent one, else the engine's `ctx.tau`. Returns
    `(w0, w_final, reply)` where the reply carries `delta`, `num_samples`, `steps`, `train_loss`.
    """
    w0 = message.tensors["w"]
    tau = int(message.scalars.get("tau", ctx.tau))
    w, steps, loss = ctx.trainer.sgd(w0, ctx.batches(tau), ctx.sgd, transform=transform)
    reply = Message(
        {"delta": w - w0},
        {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss},
    )
    return w0, w, reply


def client_diagnostics(weights: torch.Tensor, replies: Sequence[Reply]) -> dict[str, float]:
    """Round-level means of what the clients reported about their local work."""
    steps = [r.message.scalars.get("steps", float("nan")) for r in replies]
    losses = [r.message.scalars.get("train_loss", float("nan")) for r in replies]
    p = weights.tolist()
    return {
        "local_steps_mean": sum(pi * s for pi, s in zip(p, steps, strict=True)),
        "local_train_loss": sum(pi * s for pi, s in zip(p, losses, strict=True)),
    }


@dataclass(frozen=True)
class FedAvgParams:
    weighting: Literal["samples", "uniform"] = "samples"
    nwda: bool = False
    """Log FedNNNN's NWDA columns (N, E per layer kind, server movement; `fednnnn.py`)."""


@ALGORITHMS.register("fedavg", FedAvgParams, "FedAvg: w ← w + Σ p_i Δ_i")
class FedAvg(Algorithm):
    name = "fedavg"

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def average_delta(self, replies: Sequence[Reply]) -> tuple[torch.Tensor, torch.Tensor]:
        p = sample_weights(replies, self.params.weighting)
        return p, weighted_sum(p, [r.message.tensors["delta"] for r in replies])

    def aggregate(self, state: dict[str, Any], round: int, replies: Sequence[Reply]):
        p, delta = self.average_delta(replies)
        new = {**state, "w": state["w"] + delta}
        return self.with_nwda(state, new, p, replies, client_diagnostics(p, replies))

    def with_nwda(self, old: dict[str, Any], new: dict[str, Any], p: torch.Tensor,
                  replies: Sequence[Reply], diag: dict[str, Any]) -> tuple[dict, dict]:
        """Add FedNNNN's NWDA diagnostics when the params ask for them (`nwda=true`)."""
        if not getattr(self.params, "nwda", False):
            return new, diag
        from fedhet.algorithms.fednnnn import LayerIndex, nwda_record

        if not hasattr(self, "_layer_index"):
            self._layer_index = LayerIndex(self.run.layers, self.run.dim)
        new, extra = nwda_record(old, new, p, replies, self._layer_index)
        return new, {**diag, **extra}


@dataclass(frozen=True)
class FedAvgMParams:
    gamma: float = 0.9
    weighting: Literal["samples", "uniform"] = "samples"
    nwda: bool = False

    def validate(self) -> None:
        if not 0.0 <= self.gamma < 1.0:
            raise FedhetError(f"algorithm.gamma must be in [0, 1), got {self.gamma}")


@ALGORITHMS.register("fedavgm", FedAvgMParams, "FedAvgM: server momentum d ← γd + Σ p_i Δ_i")
class FedAvgM(FedAvg):
    name = "fedavgm"

    def init(self, w0: torch.Tensor) -> dict[str, Any]:
        return {"w": w0.clone(), "d": torch.zeros_like(w0)}

    def aggregate(self, state: dict[str, Any], round: int, replies: Sequence[Reply]):
        p, delta = self.average_delta(replies)
        d = self.params.gamma * state["d"] + delta
        new = {**state, "w": state["w"] + d, "d": d}
        return self.with_nwda(state, new, p, replies, client_diagnostics(p, replies))
