"""MOON: model-contrastive federated learning (docs/spec.md "MOON"; a FedSR baseline).

The model is `encoder → projection head → classifier` (`moon-mlp`, `moon-cnn`), with `z` the
projection. Each local step minimises `CE + μ ℓ_con` with
`ℓ_con = −log( e^(cos(z, z_glob)/τ) / (e^(cos(z, z_glob)/τ) + e^(cos(z, z_prev)/τ)) )`,
`z_glob` from the received global model and `z_prev` from the client's own model at the end of
its previous round (both frozen; that model is client state, `MoonClientState`, kept and
checkpointed by the engine).

The frozen models are evaluated in eval mode, as the authors' code does: with a BatchNorm
encoder each reads its own running statistics — the global model's (the statistics the client
received with it) and the previous model's (the client's at the end of its previous round,
kept with `w_prev`) — and neither pass touches the statistics of the model being trained,
which only its own training forward passes update.
In a client's first round there is no previous model and the term is absent **[choice]** (which
is the same as `ℓ_con = 0`). Aggregation is FedAvg's. `μ = 0` reproduces FedAvg.

The contrastive loss reaches the trainer through `LocalTrainer.sgd(..., loss_fn=)`, which
replaces the model's objective on each mini-batch; it is a `StackableLoss`, so the stacked
executor computes it for a whole stack of clients (`z_glob`, `z_prev` vmapped over the clients'
frozen models, the gradient over their parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.func import functional_call
from torch.nn import functional as F

from fedhet.algorithms.base import ALGORITHMS, BUFFERS, ClientContext, ClientState, Message, RunInfo
from fedhet.algorithms.fedavg import FedAvg, FedAvgState
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
    b_prev: torch.Tensor | None = None
    """That model's BatchNorm running statistics (flat, `FlatModel.buffers`); None without
    BatchNorm."""

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
    logits = contrastive_logits(z, z_glob, z_prev, temperature)
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def contrastive_logits(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The two-class logits of `ℓ_con = −log(e^{s⁺} / (e^{s⁺} + e^{s⁻}))`, the positive as class
    0: `s⁺ = cos(z, z_glob)/T`, `s⁻ = cos(z, z_prev)/T`, the features along dim 1 (`(B, P)`
    gives `(B, 2)`; a stack of rows `(R, P, B)` gives `(R, 2, B)`)."""
    pos = F.cosine_similarity(z, z_glob, dim=1) / temperature
    neg = F.cosine_similarity(z, z_prev, dim=1) / temperature
    return torch.stack([pos, neg], dim=1)


def named_params(layers: tuple[Layer, ...], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """A flat parameter vector as the `{name: tensor}` dict `functional_call` takes."""
    return {layer.name: flat[layer.start : layer.stop].view(layer.shape) for layer in layers}


def named_buffers(module: torch.nn.Module, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Flat BatchNorm statistics (the order of `FlatModel.buffers`: the module's floating-point
    buffers) as a `{name: tensor}` dict for `functional_call`."""
    out, offset = {}, 0
    for name, b in module.named_buffers():
        if b.is_floating_point():
            out[name] = flat[offset : offset + b.numel()].view(b.shape)
            offset += b.numel()
    return out


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """`module` in eval mode for the block, then back in the mode it was in."""
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


class ContrastiveLoss(StackableLoss):
    """MOON's `CE + μ ℓ_con` for one client, stackable (`fedhet.training.losses`): the targets
    are `z_glob` and `z_prev`, the projections of the global and the previous model (frozen),
    computed in eval mode. With BatchNorm statistics (`b_glob`, `b_prev`) each frozen model
    reads its own; `frozen` is then `(w_glob, b_glob, w_prev, b_prev)`, else `(w_glob, w_prev)`."""

    def __init__(
        self, layers: tuple[Layer, ...], w_glob: torch.Tensor, w_prev: torch.Tensor, mu: float,
        temperature: float, b_glob: torch.Tensor | None = None, b_prev: torch.Tensor | None = None,
    ) -> None:
        self.layers = layers
        if b_glob is not None and b_glob.numel() > 0:
            self.with_buffers = True
            self.frozen = (w_glob, b_glob, w_prev, b_glob if b_prev is None else b_prev)
        else:
            self.with_buffers = False
            self.frozen = (w_glob, w_prev)
        self.mu = mu
        self.temperature = temperature

    @property
    def key(self) -> tuple:
        # `frozen` has four vectors with BatchNorm statistics, two without: not one stack
        return (self.mu, self.temperature) + (("buffers",) if self.with_buffers else ())

    def targets(self, module: torch.nn.Module, x: torch.Tensor, *frozen: torch.Tensor) -> tuple:
        """`(z_glob, z_prev)`: eval-mode forward passes of the frozen models; the running
        statistics they read are theirs (passed in), so the module's own are left untouched."""
        models = (
            [(frozen[0], frozen[1]), (frozen[2], frozen[3])] if self.with_buffers
            else [(w, None) for w in frozen]
        )
        out = []
        with eval_mode(module):
            for w, b in models:
                tensors = named_params(self.layers, w)
                if b is not None:
                    tensors.update(named_buffers(module, b))
                out.append(functional_call(module, tensors, (x,), {"with_z": True})[1])
        return tuple(out)

    def loss(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, targets: tuple) -> torch.Tensor:
        out, z = module(x, with_z=True)
        z_glob, z_prev = targets
        return objective(module, out, y) + self.mu * contrastive_loss(z, z_glob, z_prev, self.temperature)

    @property
    def on_program(self) -> bool:
        """The rows form reads `z` from the program's tap; with BatchNorm statistics (which no
        program has) the loss stays on vmap."""
        return not self.with_buffers

    def rows_targets(self, represent: Callable[[torch.Tensor], torch.Tensor], *frozen: torch.Tensor) -> tuple:
        """`(z_glob, z_prev)` of every row, `(R, 256, B)`: the stacked frozen models' `z`."""
        w_glob, w_prev = frozen
        return represent(w_glob), represent(w_prev)

    def rows_loss(self, logits: torch.Tensor, tapped: torch.Tensor, y: torch.Tensor,
                  targets: tuple) -> torch.Tensor:
        """Each row's `CE + μ ℓ_con` (MOON eq. 3) over its mini-batch: `logits (R, K, B)`, `z`
        = `tapped (R, 256, B)`; `ℓ_con = −log(e^{s⁺} / (e^{s⁺} + e^{s⁻}))`, `s⁺ = cos(z, z_glob)/T`,
        `s⁻ = cos(z, z_prev)/T` (`contrastive_loss` per row)."""
        z_glob, z_prev = targets
        ce = F.cross_entropy(logits, y, reduction="none").mean(dim=1)
        pair = contrastive_logits(tapped, z_glob, z_prev, self.temperature)  # (R, 2, B)
        con = F.cross_entropy(pair, torch.zeros_like(y), reduction="none").mean(dim=1)
        return ce + self.mu * con


@ALGORITHMS.register("moon", MoonParams, "MOON: local CE + μ model-contrastive loss, FedAvg server",
                     example={"model": "moon-mlp"})
class Moon(FedAvg[FedAvgState, MoonClientState]):
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

    def loss_fn(
        self, w_glob: torch.Tensor, w_prev: torch.Tensor | None, b_glob: torch.Tensor | None = None,
        b_prev: torch.Tensor | None = None,
    ) -> ContrastiveLoss | None:
        """The local objective: `CE + μ ℓ_con`, or None (the model's own CE) in a client's
        first round."""
        if w_prev is None:
            return None
        return ContrastiveLoss(self.run.layers, w_glob, w_prev, self.params.mu, self.params.temperature,
                               b_glob, b_prev)

    def client_update(self, message: Message, ctx: ClientContext, state: MoonClientState):
        w0 = message.tensors["w"].clone()
        tau = int(message.scalars.get("tau", ctx.tau))
        # the global model's BatchNorm statistics: those sent with it (else the client's own
        # before training, the same thing on the sequential path)
        b_glob = message.tensors.get(BUFFERS)
        b_glob = b_glob.clone() if b_glob is not None and b_glob.numel() else _buffers(ctx)
        loss_fn = self.loss_fn(w0, state.w_prev, b_glob, state.b_prev)
        w, steps, loss = ctx.trainer.sgd(w0, ctx.batches(tau), ctx.sgd, loss_fn=loss_fn)
        reply = Message(
            {"delta": w - w0},
            {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss},
        )
        # after `sgd` the trainer's model holds this client's statistics (both executors)
        return reply, MoonClientState(w_prev=w, b_prev=_buffers(ctx))


def _buffers(ctx: ClientContext) -> torch.Tensor | None:
    """The BatchNorm statistics the client's model holds now (None without BatchNorm)."""
    model = getattr(ctx.trainer, "model", None)
    bufs = getattr(model, "buffers", None)
    return bufs.clone() if isinstance(bufs, torch.Tensor) and bufs.numel() else None
