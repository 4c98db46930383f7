"""MOON: model-contrastive federated learning (docs/spec.md "MOON"; a FedSR baseline).

The model is `encoder → projection head → classifier` (`moon-mlp`, `moon-cnn`), with `z` the
projection. Each local step minimises `CE + μ ℓ_con` with
`ℓ_con = −log( e^(cos(z, z_glob)/τ) / (e^(cos(z, z_glob)/τ) + e^(cos(z, z_prev)/τ)) )`,
`z_glob` from the received global model and `z_prev` from the client's own model at the end of
its previous round (both frozen; that model is client state, `MoonClientState`, kept and
checkpointed by the engine).
In a client's first round there is no previous model and the term is absent **[choice]** (which
is the same as `ℓ_con = 0`). Aggregation is FedAvg's. `μ = 0` reproduces FedAvg.

The contrastive loss reaches the trainer through `LocalTrainer.sgd(..., loss_fn=)`, which
replaces the model's objective on each mini-batch; it is a `StackableLoss`, so the batched
executor computes it for a whole stack of clients (`z_glob`, `z_prev` vmapped over the clients'
frozen models, the gradient over their parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.func import functional_call
from torch.nn import functional as F

from fedhet.algorithms.base import ALGORITHMS, ClientContext, ClientState, Message, RunInfo
from fedhet.algorithms.fedavg import FedAvg
from fedhet.errors import FedhetError
from fedhet.models.registry import objective
from fedhet.training.flat import Layer
from fedhet.training.losses import StackableLoss


@dataclass(kw_only=True, eq=False)
class MoonClientState(ClientState):
    """What a MOON client keeps between rounds."""

    w_prev: torch.Tensor | None = None
    """The client's local model at the end of its previous round (`z_prev`'s model); None
    before its first round."""

    @classmethod
    def from_legacy(cls, value: Any) -> MoonClientState:
        """Older checkpoints kept the previous model itself as the client's state."""
        if isinstance(value, torch.Tensor):
            return cls(w_prev=value)
        return super().from_legacy(value)


@dataclass(frozen=True)
class MoonParams:
    mu: float = 1.0
    temperature: float = 0.5
    weighting: Literal["samples", "uniform"] = "samples"

    def validate(self) -> None:
        if self.mu < 0:
            raise FedhetError(f"algorithm.mu must be ≥ 0, got {self.mu}")
        if not self.temperature > 0:
            raise FedhetError(f"algorithm.temperature must be > 0, got {self.temperature}")


def contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """`ℓ_con` averaged over the batch; 0 when there is no previous model."""
    if z_prev is None:
        return z.new_zeros(())
    pos = F.cosine_similarity(z, z_glob, dim=1) / temperature
    neg = F.cosine_similarity(z, z_prev, dim=1) / temperature
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def named_params(layers: tuple[Layer, ...], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """A flat parameter vector as the `{name: tensor}` dict `functional_call` takes."""
    return {layer.name: flat[layer.start : layer.stop].view(layer.shape) for layer in layers}


class ContrastiveLoss(StackableLoss):
    """MOON's `CE + μ ℓ_con` for one client, stackable (`fedhet.training.losses`): the targets
    are `z_glob` and `z_prev`, the projections of the global and the previous model (frozen)."""

    def __init__(
        self, layers: tuple[Layer, ...], w_glob: torch.Tensor, w_prev: torch.Tensor, mu: float,
        temperature: float,
    ) -> None:
        self.layers = layers
        self.frozen = (w_glob, w_prev)
        self.mu = mu
        self.temperature = temperature

    @property
    def key(self) -> tuple[float, float]:
        return (self.mu, self.temperature)

    def targets(self, module: torch.nn.Module, x: torch.Tensor, *frozen: torch.Tensor) -> tuple:
        return tuple(
            functional_call(module, named_params(self.layers, w), (x,), {"with_z": True})[1]
            for w in frozen
        )

    def loss(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, targets: tuple) -> torch.Tensor:
        out, z = module(x, with_z=True)
        z_glob, z_prev = targets
        return objective(module, out, y) + self.mu * contrastive_loss(z, z_glob, z_prev, self.temperature)


@ALGORITHMS.register("moon", MoonParams, "MOON: local CE + μ model-contrastive loss, FedAvg server")
class Moon(FedAvg):
    name = "moon"
    client_state_class = MoonClientState

    def __init__(self, params: MoonParams, run: RunInfo) -> None:
        super().__init__(params, run)
        if not any(layer.name.startswith("projection.") for layer in run.layers):
            raise FedhetError(
                "moon needs a model with a projection head; use --model moon-mlp or moon-cnn"
            )

    def client_init(self, client_id: int) -> MoonClientState:
        return MoonClientState()

    def loss_fn(self, w_glob: torch.Tensor, w_prev: torch.Tensor | None) -> ContrastiveLoss | None:
        """The local objective: `CE + μ ℓ_con`, or None (the model's own CE) in a client's
        first round."""
        if w_prev is None:
            return None
        return ContrastiveLoss(self.run.layers, w_glob, w_prev, self.params.mu, self.params.temperature)

    def client_update(self, message: Message, ctx: ClientContext, state: MoonClientState):
        w0 = message.tensors["w"].clone()
        tau = int(message.scalars.get("tau", ctx.tau))
        loss_fn = self.loss_fn(w0, state.w_prev)
        w, steps, loss = ctx.trainer.sgd(w0, ctx.batches(tau), ctx.sgd, loss_fn=loss_fn)
        reply = Message(
            {"delta": w - w0},
            {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss},
        )
        return reply, MoonClientState(w_prev=w)
