"""GraB-FedAvg (BHerd paper §1.3, Algorithm 4): FedAvg whose clients order their mini-batches by
GraB's online gradient balancing (Lu, Guo & De Sa, NeurIPS 2022).

Each client cuts its data once into fixed mini-batches ("units"). An epoch visits the units in
the client's current order `σ`; for each unit's gradient `g` it forms `c = g − m` with `m` the
mean gradient of the *previous* epoch (stale mean; zero in the first epoch), and picks the sign
that keeps the running signed sum small: `+` if `‖s + c‖ ≤ ‖s − c‖` (then `s ← s + c` and the
unit goes to the next free slot from the front of `σ'`), else `−` (`s ← s − c`, next free slot
from the back). At the end of the epoch `σ ← σ'` and `m ←` this epoch's mean gradient. The
order, pointers and the two running sums are client state (`GraBState`) kept across rounds, so
an epoch may span rounds (`E < 1`). Extra memory: three `d`-vectors per client.

By default all gradients are used (no selection) and the server is FedAvg's. Cropping
(`alpha < 1`): the seed pairs GraB-FedAvg with BHerd's selection ("the GraB operation replaces
the herding operation in the BHerd strategy", "top ⌊α τ⌋"), so GraB's permutation of the round's
`τ` steps, the `+` steps in visit order then the `−` steps in reverse (the order `σ'` gives
them), replaces the herding order: the client keeps its first `m = max(1, ⌊α τ⌋)`, forms their
mean `G` and uploads `Δ = −η τ G` (`reading="mean-tau"`, FedAvg at `α = 1`) or `Δ = −η m G`
(`reading="sum"`), which FedAvg's server averages. This needs the round's `τ × d` gradients
(BHerd's buffer) on the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedhet.algorithms.base import ALGORITHMS, ClientContext, ClientState, Message
from fedhet.algorithms.bherd import check_alpha, kept_count, row_mean
from fedhet.algorithms.fedavg import FedAvg


@dataclass(kw_only=True, eq=False)
class GraBState(ClientState):
    """A GraB client's balancing state, kept across rounds (an epoch may span rounds); changed
    in place as the client visits its units."""

    order: torch.Tensor
    """`σ`, the order of the units in the current epoch."""
    next: torch.Tensor
    """`σ'`, the next epoch's order being filled: `+` units from the front, `−` from the back.
    A slot not filled yet this epoch holds −1 in the first epoch, the last epoch's unit after."""
    pos: int
    """How many units of `σ` this epoch has visited."""
    left: int
    """The next free slot of `σ'` from the front."""
    right: int
    """The next free slot of `σ'` from the back."""
    mean: torch.Tensor
    """`m`, the previous epoch's mean gradient (the stale mean; zero in the first epoch)."""
    epoch_sum: torch.Tensor
    """`Σ g` over this epoch so far (float64), the next `m` times the number of units."""
    s: torch.Tensor
    """`s`, the running signed sum `Σ ±(g − m)` of this epoch (float64)."""


def grab_init(num_units: int, dim: int, device: torch.device | str = "cpu") -> GraBState:
    """GraB state for `num_units` units: identity order, zero stale mean. The orders are
    bookkeeping read one unit at a time and stay on the CPU; the vectors live on `device`."""
    return GraBState(
        order=torch.arange(num_units, device="cpu"),
        next=torch.full((num_units,), -1, dtype=torch.long, device="cpu"),
        pos=0, left=0, right=num_units - 1,
        mean=torch.zeros(dim, device=device),
        epoch_sum=torch.zeros(dim, dtype=torch.float64, device=device),
        s=torch.zeros(dim, dtype=torch.float64, device=device),
    )


def grab_current_unit(state: GraBState) -> int:
    return int(state.order[state.pos])


def grab_step(state: GraBState, g: torch.Tensor) -> float:
    """Balance the gradient `g` of the current unit; advance; returns `‖s‖` after the step."""
    return grab_balance(state, g)[1]


def grab_balance(state: GraBState, g: torch.Tensor) -> tuple[bool, float]:
    """`grab_step` that also says whether the unit took the `+` sign (front of `σ'`)."""
    unit = grab_current_unit(state)
    g64 = g.to(torch.float64)
    c = g64 - state.mean.to(torch.float64)
    s = state.s
    plus = bool(torch.linalg.vector_norm(s + c) <= torch.linalg.vector_norm(s - c))
    if plus:
        s.add_(c)
        state.next[state.left] = unit
        state.left += 1
    else:
        s.sub_(c)
        state.next[state.right] = unit
        state.right -= 1
    state.epoch_sum.add_(g64)
    state.pos += 1
    if state.pos == len(state.order):
        grab_end_epoch(state)
    return plus, float(torch.linalg.vector_norm(s))


def grab_end_epoch(state: GraBState) -> None:
    n = len(state.order)
    state.order = state.next.clone()
    state.mean = (state.epoch_sum / n).to(torch.float32)
    state.epoch_sum.zero_()
    state.s.zero_()
    state.pos, state.left, state.right = 0, 0, n - 1


def grab_epoch(vectors: torch.Tensor, state: GraBState) -> list[float]:
    """One whole epoch of balancing over fixed vectors (one row per unit); returns `‖s‖` per step.

    Offline counterpart of what the client does with live gradients (tests, analysis)."""
    norms = []
    for _ in range(len(state.order)):
        norms.append(grab_step(state, vectors[grab_current_unit(state)]))
    return norms


def round_order(plus: list[bool]) -> list[int]:
    """GraB's permutation of one round's steps: `+` steps in visit order, then `−` reversed."""
    front = [j for j, p in enumerate(plus) if p]
    back = [j for j, p in enumerate(plus) if not p]
    return front + back[::-1]


@dataclass(frozen=True)
class GraBParams:
    weighting: Literal["samples", "uniform"] = "samples"
    alpha: float = 1.0
    """Cropping: keep the first `max(1, ⌊α τ⌋)` steps of GraB's order; 1 = keep all."""
    reading: Literal["mean-tau", "sum"] = "mean-tau"
    """With cropping, the upload `−η τ G` (`mean-tau`) or `−η m G` (`sum`), as `bherd`'s."""

    def validate(self) -> None:
        check_alpha(self.alpha)


@ALGORITHMS.register("grab-fedavg", GraBParams, "GraB-FedAvg: GraB online balancing order, FedAvg")
class GraBFedAvg(FedAvg):
    name = "grab-fedavg"
    client_state_class = GraBState

    def client_update(self, message: Message, ctx: ClientContext, state: GraBState | None):
        """`state` is None before the client's first round, which builds it (`grab_init`: it
        needs the client's number of units)."""
        per_epoch = ctx.num_samples // min(ctx.batch_size, ctx.num_samples)
        units = list(ctx.batches(per_epoch, order="fixed"))
        w0 = message.tensors["w"]
        if state is None:
            state = grab_init(len(units), w0.numel(), w0.device)

        def batches():
            for _ in range(ctx.tau):
                yield units[grab_current_unit(state)]

        crop = self.params.alpha < 1.0
        grads = torch.empty(ctx.tau, w0.numel(), device=w0.device) if crop else None
        plus: list[bool] = []

        def balance(step: int, w: torch.Tensor, g: torch.Tensor, loss: float) -> None:
            plus.append(grab_balance(state, g)[0])
            if grads is not None:
                grads[step].copy_(g)

        w, steps, loss = ctx.trainer.sgd(w0, batches(), ctx.sgd, on_step=balance)
        scalars = {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss}
        if grads is None:
            return Message({"delta": w - w0}, scalars), state
        kept = torch.tensor(
            round_order(plus)[: kept_count(self.params.alpha, steps)], device=w0.device
        )
        scale = ctx.sgd.lr * (steps if self.params.reading == "mean-tau" else len(kept))
        delta = row_mean(grads[:steps], kept).mul_(-scale).to(torch.float32)
        return Message({"delta": delta}, {**scalars, "kept_steps": float(len(kept))}), state
