"""FedProx (Li et al., MLSys 2020; docs/spec.md "FedProx").

Client `i` minimises `F_i(w) + (μ/2)‖w − w_k‖²` with `τ_i` local SGD steps: each step uses the
gradient `g + μ (w − w_k)` (the proximal term's gradient at the current local model). The server
aggregates as FedAvg, `w_(k+1) = w_k + Σ_i p_i Δ_i`.

The term is the local step's `Proximal(μ, w_k)` transform (`fedhet.training.steps`). With
`μ = 0` it adds nothing at all (not even `0·(w − w_k)`), so FedProx reproduces FedAvg bit for
bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from fedhet.algorithms.base import ALGORITHMS, ClientContext, Message
from fedhet.algorithms.fedavg import FC, FS, FedAvg, local_sgd_update
from fedhet.errors import FedhetError
from fedhet.training.steps import Proximal


@dataclass(frozen=True)
class FedProxParams:
    mu: float = 0.01
    """Proximal coefficient `μ`."""
    weighting: Literal["samples", "uniform"] = "samples"
    nwda: bool = False
    """Log FedNNNN's NWDA diagnostics (N, E per layer kind) each round."""

    def validate(self) -> None:
        if not (self.mu >= 0 and math.isfinite(self.mu)):
            raise FedhetError(f"algorithm.mu must be a number ≥ 0, got {self.mu}")


@ALGORITHMS.register("fedprox", FedProxParams, "FedProx: local steps on F_i + (μ/2)‖w − w_k‖²")
class FedProx(FedAvg[FS, FC]):
    name = "fedprox"

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        w0 = message.tensors["w"]
        _, _, reply = local_sgd_update(message, ctx, (Proximal(self.params.mu, w0),))
        return reply, state
