"""BHerd: select a beneficial herd of local gradients (SPEC.md "BHerd"; seed bherd.txt).

Client `i` in round `k` runs `τ_i` local SGD steps from `w_k` keeping every mini-batch gradient
`g^λ` (at the evolving local model, eq. 3). It then

1. orders them by herding (Algorithm 2): `μ = mean_λ g^λ` (eq. 5), `z^λ = g^λ − μ`, `s = 0`;
   repeatedly append the unused `λ` minimising `‖s + z^λ‖` and set `s ← s + z^λ` (ties → the
   lowest index). With the Gram matrix `Γ = Z Zᵀ`, `‖s + z^j‖² = ‖s‖² + 2 sᵀz^j + Γ_jj` and
   `sᵀz^j` is a running sum of rows of `Γ`, so the cost is `O(τ² d)` once plus `O(τ²)`;
2. keeps the first `m_i = max(1, ⌊α τ_i⌋)` of the order (eq. 1, default `α = 0.5`);
3. uploads `G_i = (1/m_i) Σ_(λ ∈ kept) g^λ` (eq. 6) with `D_i`, `τ_i`, `m_i`.

Server, eq. 7 **[choice]**: `w_(k+1) = w_k − η Σ_i p_i τ_i G_i`, which is FedAvg exactly when
`α = 1` (then `τ_i G_i = Σ_λ g^λ = −Δ_i / η`); `rescale=False` uses `m_i` in place of `τ_i`.

Variants:
- `bherd-fednova`: FedNova's rule with `G_i` as the normalised direction:
  `τ_eff = Σ_i p_i a_i`, `w ← w − η τ_eff Σ_i p_i G_i`, `a_i = τ_i` (or `m_i`, `rescale=False`).
- `bherd-scaffold`: local steps use `g − c_i + c` (SCAFFOLD); the corrected gradients are
  herded; the model moves as BHerd's `x ← x − η_g η Σ p_i τ_i G_i`; control variates as
  SCAFFOLD (SPEC.md): option II `c_i⁺ = c_i − c + (x − y_i)/(τ_i η)` with `y_i` the client's
  actual local model after its `τ_i` steps **[choice]** (option I: `c_i⁺ = ∇F_i(x)` at the
  received `x`, computed before the local steps as in `scaffold`),
  `c ← c + (|S|/N) Σ_S p_i Δc_i` with the weights of the model step (`weighting`), exactly
  `scaffold`'s rules and helpers (see its docstring for why the two means share weights).

Batches come in one fixed order (the paper's non-RR protocol, §4.1, §2.8) by default; the
client keeps a cursor so fractional epochs walk on through its data across rounds
**[choice]**; `order="reshuffle"` draws a new permutation every round (RR).
Local momentum is rejected: BHerd herds the plain SGD gradients.

Memory: one client at a time holds its `τ × d` float32 gradient buffer (`4 τ d` bytes) plus the
`τ × τ` float64 Gram matrix; see docs/bherd.md for the CIFAR CNN's numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
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
    require_replies,
)
from fedhet.algorithms.fedavg import CLIENT_SCALARS, client_diagnostics
from fedhet.algorithms.scaffold import corrected, option_one_variate, option_two_variate, variate_step
from fedhet.errors import FedhetError
from fedhet.training.local import GradTransform

TIE_TOLERANCE = 1e-9
"""Candidates whose `‖s + z‖²` are within this fraction of `max ‖z‖²` of the best count as tied
(so rounding does not decide ties, e.g. `z^0 = −z^1` when `τ = 2`); the lowest index wins."""

GRAM_CHUNK_ELEMENTS = 1 << 21
"""Float64 elements converted at once while forming the Gram matrix or a mean (16 MB)."""


# -- Algorithm 2: herding order -------------------------------------------------------------
def row_mean(x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of the rows of `x` (or of `rows` of it) in float64, a few rows at a time."""
    idx = torch.arange(x.shape[0]) if rows is None else rows
    chunk = max(1, GRAM_CHUNK_ELEMENTS // max(x.shape[1], 1))
    acc = torch.zeros(x.shape[1], dtype=torch.float64)
    for start in range(0, len(idx), chunk):
        acc.add_(x[idx[start : start + chunk]].to(torch.float64).sum(0))
    return acc.div_(len(idx))


def centred_gram(x: torch.Tensor) -> torch.Tensor:
    """`Γ = Z Zᵀ` with `z^λ = x^λ − mean(x)`, in float64, without copying `x` (`Γ = H X Xᵀ H`)."""
    tau, d = x.shape
    cols = max(1, GRAM_CHUNK_ELEMENTS // max(tau, 1))
    k = torch.zeros(tau, tau, dtype=torch.float64)
    for start in range(0, d, cols):
        part = x[:, start : start + cols].to(torch.float64)
        k.addmm_(part, part.T)
    r = k.mean(dim=1, keepdim=True)
    return k - r - r.T + k.mean()


def herding_order_gram(gram: torch.Tensor) -> torch.Tensor:
    """Algorithm 2 from the Gram matrix of the centred vectors: `O(τ²)`, ties → lowest index."""
    tau = gram.shape[0]
    diag = gram.diagonal().clone()
    tol = TIE_TOLERANCE * float(diag.max()) if tau else 0.0
    cross = torch.zeros(tau, dtype=gram.dtype)
    used = torch.zeros(tau, dtype=torch.bool)
    order = torch.empty(tau, dtype=torch.long)
    for t in range(tau):
        score = (2 * cross + diag).masked_fill_(used, float("inf"))  # ‖s + z^j‖² − ‖s‖²
        j = int(torch.nonzero(score <= score.min() + tol)[0])  # ties → the lowest index
        order[t] = j
        used[j] = True
        cross += gram[j]
    return order


def herding_order(x: torch.Tensor) -> torch.Tensor:
    """Herding order of the rows of `x` (`τ × d`) via the Gram matrix."""
    return herding_order_gram(centred_gram(x))


def herding_order_direct(x: torch.Tensor) -> torch.Tensor:
    """Reference Algorithm 2 on the vectors themselves: `O(τ² d)`, `‖s + z^λ‖` per candidate."""
    z = x.to(torch.float64)
    z = z - z.mean(0)
    tol = TIE_TOLERANCE * float((z * z).sum(1).max()) if len(z) else 0.0
    s = torch.zeros(z.shape[1], dtype=torch.float64)
    left = list(range(z.shape[0]))
    order = []
    while left:
        sq = [float(torch.linalg.vector_norm(s + z[j])) ** 2 for j in left]
        best = min(sq) + tol
        j = left.pop(next(a for a in range(len(left)) if sq[a] <= best))
        order.append(j)
        s += z[j]
    return torch.tensor(order, dtype=torch.long)


def kept_count(alpha: float, tau: int) -> int:
    """`m = max(1, ⌊α τ⌋)` (eq. 1); a small tolerance keeps e.g. `⌊0.3·10⌋ = 3`."""
    return max(1, int(alpha * tau + 1e-9))


@dataclass
class HerdSelection:
    """The outcome of herding one client's gradients."""

    order: torch.Tensor
    kept: torch.Tensor
    """The first `m` step indices of `order` (herding order, not sorted)."""
    mean_kept: torch.Tensor
    """`G_i` (eq. 6), float32."""
    distance: float
    """`‖G_i − mean_λ g^λ‖` (Fig. 4d)."""


def herd_select(x: torch.Tensor, alpha: float) -> HerdSelection:
    """Herd the rows of `x`, keep the first `max(1, ⌊α τ⌋)`, return their mean (eqs. 1, 6)."""
    order = herding_order(x)
    kept = order[: kept_count(alpha, x.shape[0])]
    g_kept = row_mean(x, kept)
    distance = float(torch.linalg.vector_norm(g_kept - row_mean(x)))
    return HerdSelection(order, kept, g_kept.to(torch.float32), distance)


# -- client half ------------------------------------------------------------------------------
def fixed_batches(ctx: ClientContext, steps: int, cursor: int) -> tuple[list[torch.Tensor], int]:
    """`steps` batches of the client's fixed order, starting at epoch position `cursor`."""
    per_epoch = ctx.num_samples // min(ctx.batch_size, ctx.num_samples)
    epoch = list(ctx.batches(per_epoch, order="fixed"))
    return [epoch[(cursor + j) % per_epoch] for j in range(steps)], (cursor + steps) % per_epoch


def local_batches(
    ctx: ClientContext, order: str, cursor: int
) -> tuple[Sequence[torch.Tensor] | Iterator[torch.Tensor], int]:
    if order == "fixed":
        return fixed_batches(ctx, ctx.tau, cursor)
    return ctx.batches(ctx.tau, order="reshuffle"), cursor


@dataclass
class HerdPass:
    w: torch.Tensor
    steps: int
    loss: float
    selection: HerdSelection


def herd_local_pass(
    w0: torch.Tensor, ctx: ClientContext, batches: Any, alpha: float,
    transform: GradTransform | None = None,
) -> HerdPass:
    """Local SGD keeping each step's gradient in a preallocated `τ × d` buffer, then herd."""
    grads = torch.empty(ctx.tau, w0.numel())

    def keep(step: int, w: torch.Tensor, g: torch.Tensor, loss: float) -> None:
        grads[step].copy_(g)

    w, steps, loss = ctx.trainer.sgd(w0, batches, ctx.sgd, transform=transform, on_step=keep)
    return HerdPass(w, steps, loss, herd_select(grads[:steps], alpha))


def herd_reply(ctx: ClientContext, hp: HerdPass, extra: dict[str, torch.Tensor] | None = None):
    sel = hp.selection
    return Message(
        {"G": sel.mean_kept, "kept": sel.kept.to(torch.int32), **(extra or {})},
        {
            "num_samples": float(ctx.num_samples), "steps": float(hp.steps),
            "kept_steps": float(len(sel.kept)), "lr": ctx.sgd.lr, "train_loss": hp.loss,
            "herd_dist": sel.distance,
        },
    )


# -- parameters --------------------------------------------------------------------------------
def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha <= 1.0:
        raise FedhetError(
            f"algorithm.alpha must be in (0, 1] (the fraction of local gradients kept), got {alpha}"
        )


@dataclass(frozen=True)
class BHerdParams:
    alpha: float = 0.5
    rescale: bool = True
    """Eq. 7 **[choice]**: scale `G_i` by `τ_i` (True, FedAvg at α = 1) or by `m_i` (False)."""
    order: Literal["fixed", "reshuffle"] = "fixed"
    weighting: Literal["samples", "uniform"] = "samples"

    def validate(self) -> None:
        _check_alpha(self.alpha)


@dataclass(frozen=True)
class BHerdScaffoldParams(BHerdParams):
    option: Literal["II", "I"] = "II"
    global_lr: float = 1.0

    def validate(self) -> None:
        _check_alpha(self.alpha)
        if not self.global_lr > 0:
            raise FedhetError(f"algorithm.global_lr must be > 0, got {self.global_lr}")


# -- server helpers ----------------------------------------------------------------------------
def herd_diagnostics(num_clients: int, replies: Sequence[Reply]) -> dict[str, Any]:
    """`herd_dist_<i>`, `tau_<i>`, `kept_<i>` columns (NaN for absent clients) and kept indices."""
    diag: dict[str, Any] = {}
    by_id = {r.client_id: r.message for r in replies}
    for i in range(num_clients):
        msg = by_id.get(i)
        diag[f"herd_dist_{i}"] = msg.scalars["herd_dist"] if msg else float("nan")
        diag[f"tau_{i}"] = msg.scalars["steps"] if msg else float("nan")
        diag[f"kept_{i}"] = msg.scalars["kept_steps"] if msg else float("nan")
    diag["kept_indices"] = {str(r.client_id): r.message.tensors["kept"].tolist() for r in replies}
    return diag


def step_scale(reply: Reply, rescale: bool) -> float:
    """`η_i τ_i` (eq. 7) or `η_i m_i` (`rescale=False`)."""
    s = reply.message.scalars
    return s["lr"] * (s["steps"] if rescale else s["kept_steps"])


class _BHerdBase(Algorithm):
    """The BHerd client half and shared server pieces."""

    def __init__(self, params: Any, run: RunInfo) -> None:
        super().__init__(params, run)
        if run.momentum:
            raise FedhetError(
                f"{self.name} herds plain SGD gradients; set momentum=0 (got {run.momentum})"
            )

    def check_local_steps(self, steps: Sequence[int]) -> None:
        for i, tau in enumerate(steps):
            if tau < 1:
                raise FedhetError(
                    f"{self.name}: client {i} would take 0 local steps this round (local_epochs × "
                    "samples / batch_size < 1); raise local_epochs or lower batch_size"
                )

    def client_init(self, client_id: int) -> Any:
        return {"cursor": 0}

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        batches, cursor = local_batches(ctx, self.params.order, state["cursor"])
        hp = herd_local_pass(message.tensors["w"], ctx, batches, self.params.alpha)
        return herd_reply(ctx, hp), {**state, "cursor": cursor}

    def stream(
        self, replies: Iterable[Reply], scale, extra: tuple[str, ...] = (), scalars: tuple[str, ...] = ()
    ) -> tuple[WeightedMean, list[Reply]]:
        """One pass: running `Σ w_i scale_i G_i` (and `Σ w_i v_i` for `extra` tensors); keeps per
        client only its scalars and kept indices (a few numbers) for the diagnostics."""
        acc = WeightedMean(self.params.weighting)
        light: list[Reply] = []
        names = tuple(dict.fromkeys((*CLIENT_SCALARS, *scalars)))
        for r in replies:
            acc.add(r, ("G", *extra), names, {"G": scale(r)})
            kept = {"kept": r.message.tensors["kept"]}
            light.append(Reply(r.client_id, Message(kept, dict(r.message.scalars))))
        require_replies(acc.count)
        return acc, light

    def round_diagnostics(self, acc: WeightedMean, replies: Sequence[Reply]) -> dict[str, Any]:
        return {**client_diagnostics(acc), **herd_diagnostics(self.run.num_clients, replies)}


def _step(acc: WeightedMean, factor: float = 1.0) -> torch.Tensor:
    """`factor · Σ_i p_i scale_i G_i` (float64 until the end, as `weighted_sum`)."""
    return (acc.sums["G"] * (factor / acc.total)).to(torch.float32)


@ALGORITHMS.register("bherd", BHerdParams, "BHerd-FedAvg: herd local gradients, keep ⌊ατ⌋ (eq. 7)")
class BHerd(_BHerdBase):
    name = "bherd"

    def aggregate(self, state: dict[str, Any], round: int, replies: Iterable[Reply]):
        acc, light = self.stream(replies, lambda r: step_scale(r, self.params.rescale))
        return {**state, "w": state["w"] - _step(acc)}, self.round_diagnostics(acc, light)


@ALGORITHMS.register("bherd-fednova", BHerdParams, "BHerd-FedNova: FedNova's τ_eff with G_i")
class BHerdFedNova(_BHerdBase):
    name = "bherd-fednova"

    def aggregate(self, state: dict[str, Any], round: int, replies: Iterable[Reply]):
        key = "steps" if self.params.rescale else "kept_steps"
        acc, light = self.stream(replies, lambda r: r.message.scalars["lr"], scalars=(key,))
        tau_eff = acc.scalar(key)
        diag = {**self.round_diagnostics(acc, light), "tau_eff": tau_eff}
        return {**state, "w": state["w"] - _step(acc, tau_eff)}, diag


@ALGORITHMS.register(
    "bherd-scaffold", BHerdScaffoldParams, "BHerd-SCAFFOLD: herd SCAFFOLD-corrected gradients"
)
class BHerdScaffold(_BHerdBase):
    name = "bherd-scaffold"

    def init(self, w0: torch.Tensor) -> dict[str, Any]:
        return {"w": w0.clone(), "c": torch.zeros_like(w0)}

    def configure(self, state: dict[str, Any], client_id: int, round: int) -> Message:
        return Message({"w": state["w"], "c": state["c"]})

    def client_init(self, client_id: int) -> Any:
        return {"cursor": 0, "c": None}

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        w0, c = message.tensors["w"], message.tensors["c"]
        c_i = state["c"]
        if self.params.option == "I":  # at the received x, before the local steps move the
            c_new = option_one_variate(ctx, w0)  # shared model's BatchNorm statistics
        batches, cursor = local_batches(ctx, self.params.order, state["cursor"])
        hp = herd_local_pass(w0, ctx, batches, self.params.alpha, transform=corrected(c, c_i))
        if self.params.option == "II":
            c_new = option_two_variate(w0, hp.w, c, c_i, hp.steps, ctx.sgd.lr)
        reply = herd_reply(ctx, hp, {"delta_c": c_new if c_i is None else c_new - c_i})
        return reply, {"cursor": cursor, "c": c_new}

    def aggregate(self, state: dict[str, Any], round: int, replies: Iterable[Reply]):
        acc, light = self.stream(
            replies, lambda r: step_scale(r, self.params.rescale), extra=("delta_c",)
        )
        delta_c = variate_step(acc, self.run.num_clients)  # SCAFFOLD's rule and weights
        step = _step(acc)
        new = {**state, "w": state["w"] - self.params.global_lr * step, "c": state["c"] + delta_c}
        return new, self.round_diagnostics(acc, light)
