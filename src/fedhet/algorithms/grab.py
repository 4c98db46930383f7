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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from fedhet.algorithms.base import ALGORITHMS, ClientContext, ClientState, Message, RunInfo
from fedhet.algorithms.bherd import check_alpha, kept_count, row_mean
from fedhet.algorithms.fedavg import FedAvg, FedAvgState
from fedhet.errors import FedhetError
from fedhet.training.hooks import GradientStore, StackableHook, StackedHook


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
    plus = bool(balance_signs(state.s.unsqueeze(0), g.unsqueeze(0), state.mean.unsqueeze(0),
                              state.epoch_sum.unsqueeze(0))[0])
    if grab_place(state, plus):
        state.mean = (state.epoch_sum / len(state.order)).to(torch.float32)
        state.epoch_sum.zero_()
        state.s.zero_()
    return plus, float(torch.linalg.vector_norm(state.s))


def balance_signs(
    s: torch.Tensor, g: torch.Tensor, mean: torch.Tensor, epoch_sum: torch.Tensor
) -> torch.Tensor:
    """The vector half of one GraB step for `R` clients at once, in place: `c = g − m`, the sign
    `+` where `‖s + c‖ ≤ ‖s − c‖`, `s ← s ± c`, `epoch_sum += g`. `s`, `epoch_sum`: `(R, d)`
    float64; `g`, `mean`: `(R, d)`. Returns the signs, `(R,)` bool (True = `+`)."""
    g64 = g.to(torch.float64)
    c = g64 - mean.to(torch.float64)
    plus = torch.linalg.vector_norm(s + c, dim=1) <= torch.linalg.vector_norm(s - c, dim=1)
    s.add_(torch.where(plus.unsqueeze(1), c, -c))
    epoch_sum.add_(g64)
    return plus


def grab_place(state: GraBState, plus: bool) -> bool:
    """The bookkeeping half of a GraB step: the current unit goes to the next free slot of `σ'`
    from the front (`+`) or the back (`−`). After the epoch's last unit `σ ← σ'`, the pointers
    restart and it returns True: the caller then sets `m ←` the epoch's mean gradient and zeroes
    `Σ g` and `s` (wherever it keeps them: the state, or a stack's rows)."""
    unit = grab_current_unit(state)
    if plus:
        state.next[state.left] = unit
        state.left += 1
    else:
        state.next[state.right] = unit
        state.right -= 1
    state.pos += 1
    if state.pos < len(state.order):
        return False
    state.order = state.next.clone()
    state.pos, state.left, state.right = 0, 0, len(state.order) - 1
    return True


def grab_epoch(vectors: torch.Tensor, state: GraBState) -> list[float]:
    """One whole epoch of balancing over fixed vectors (one row per unit); returns `‖s‖` per step.

    Offline counterpart of what the client does with live gradients (tests, analysis)."""
    norms = []
    for _ in range(len(state.order)):
        norms.append(grab_step(state, vectors[grab_current_unit(state)]))
    return norms


class Balancer(StackableHook):
    """GraB's `on_step` hook: balances each step's gradient into the client's `GraBState`
    (`grab_balance`), records the signs of the round (`plus`) and, for cropping, keeps the
    gradients (`store`). Stacked, the vector half of a step (`balance_signs`) is one set of
    tensor operations for the whole stack and one device synchronisation for the signs; the
    orders and pointers stay per client (they choose each client's next unit)."""

    def __init__(self, state: GraBState, store: GradientStore | None = None) -> None:
        self.state = state
        self.store = store
        self.plus: list[bool] = []

    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor, loss: float) -> None:
        self.plus.append(grab_balance(self.state, g)[0])
        if self.store is not None:
            self.store(step, w, g, loss)

    @classmethod
    def stack(cls, hooks: Sequence[Balancer]) -> StackedHook:
        return _StackedBalancer(list(hooks))


class _StackedBalancer(StackedHook):
    """Members' `s`, `epoch_sum` and `m` as `(R, d)` stacks, written back when they leave."""

    def __init__(self, hooks: list[Balancer]) -> None:
        self.hooks = hooks
        self.s = torch.stack([h.state.s for h in hooks])
        self.epoch_sum = torch.stack([h.state.epoch_sum for h in hooks])
        self.mean = torch.stack([h.state.mean for h in hooks])
        stores = [h.store for h in hooks if h.store is not None]
        self.stored = [m for m, h in enumerate(hooks) if h.store is not None]
        self.store = GradientStore.stack(stores) if stores else None

    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor) -> None:
        plus = balance_signs(self.s, g, self.mean, self.epoch_sum).tolist()
        for m, (h, p) in enumerate(zip(self.hooks, plus, strict=True)):
            h.plus.append(p)
            if grab_place(h.state, p):  # this step ended the client's epoch
                self.mean[m] = (self.epoch_sum[m] / len(h.state.order)).to(self.mean.dtype)
                self.epoch_sum[m].zero_()
                self.s[m].zero_()
        if self.store is not None:
            if len(self.stored) == len(self.hooks):
                self.store(step, w, g)
            else:
                ix = torch.tensor(self.stored, device=g.device)
                self.store(step, w.index_select(0, ix), g.index_select(0, ix))

    def leave(self, members: Sequence[int], steps: int) -> None:
        gone = set(members)
        for m in members:
            st = self.hooks[m].state
            st.s, st.epoch_sum, st.mean = self.s[m].clone(), self.epoch_sum[m].clone(), self.mean[m].clone()
        if self.store is not None:
            leaving = [k for k, m in enumerate(self.stored) if m in gone]
            if leaving:
                self.store.leave(leaving, steps)
        stay = [m for m in range(len(self.hooks)) if m not in gone]
        renumber = {m: k for k, m in enumerate(stay)}
        self.stored = [renumber[m] for m in self.stored if m not in gone]
        self.hooks = [self.hooks[m] for m in stay]
        if stay:
            ix = torch.tensor(stay, device=self.s.device)
            self.s, self.epoch_sum, self.mean = (
                t.index_select(0, ix) for t in (self.s, self.epoch_sum, self.mean)
            )


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
class GraBFedAvg(FedAvg[FedAvgState, GraBState | None]):
    name = "grab-fedavg"
    client_state_class = GraBState

    def __init__(self, params: GraBParams, run: RunInfo) -> None:
        super().__init__(params, run)
        if params.alpha < 1.0 and run.client_optimizer != "sgd":
            raise FedhetError(
                f"grab-fedavg with alpha < 1 needs client_optimizer=sgd, got "
                f"{run.client_optimizer}: it uploads Δ = −η τ G from the kept raw gradients, the "
                "plain SGD update (alpha=1 uploads the model change and takes any optimizer)"
            )

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

        store = GradientStore(ctx.tau, w0.numel(), w0.device) if self.params.alpha < 1.0 else None
        balance = Balancer(state, store)

        w, steps, loss = ctx.trainer.sgd(w0, batches(), ctx.sgd, on_step=balance)
        scalars = {"num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss}
        if store is None:
            return Message({"delta": w - w0}, scalars), state
        kept = torch.tensor(
            round_order(balance.plus)[: kept_count(self.params.alpha, steps)], device=w0.device
        )
        scale = ctx.sgd.lr * (steps if self.params.reading == "mean-tau" else len(kept))
        delta = row_mean(store.rows()[:steps], kept).mul_(-scale).to(torch.float32)
        return Message({"delta": delta}, {**scalars, "kept_steps": float(len(kept))}), state
