"""BHerd: select a beneficial herd of local gradients (docs/spec.md "BHerd"; seed bherd.txt).

Client `i` in round `k` computes `τ_i` mini-batch gradients `g^λ`, `λ = 0 … τ_i − 1`, in the
client's batch order. It then

1. orders them by herding (Algorithm 2): `μ = mean_λ g^λ` (eq. 5), `z^λ = g^λ − μ`, `s = 0`;
   repeatedly append the unused `λ` minimising `‖s + z^λ‖` and set `s ← s + z^λ` (ties → the
   lowest index). With the Gram matrix `Γ = Z Zᵀ`, `‖s + z^j‖² = ‖s‖² + 2 sᵀz^j + Γ_jj` and
   `sᵀz^j` is a running sum of rows of `Γ`, so the cost is `O(τ² d)` once plus `O(τ²)`.
   `criterion="grab-stale"`: the criterion of GraB's reference greedy sorter
   (`StaleGradGreedySort` in the public GraB code, which BHerd says it takes its herding from)
   fills position `t = 0, 1, …` with the unused `j` minimising `‖z^j + t·s‖`
   (`= t²‖s‖² + 2t sᵀz^j + Γ_jj`); positions 0 and 1 agree with `"greedy"`, later ones weigh the
   running sum `t` times;
2. keeps the first `m_i = max(1, ⌊α τ_i⌋)` of the order (eq. 1, default `α = 0.5`);
3. uploads `G_i = (1/m_i) Σ_(λ ∈ kept) g^λ` with `D_i`, `τ_i`, `m_i` (`S_i = m_i G_i` is the
   sum of eq. 6).

Eqs. 6–7 are lost in our copy; three readings of them survive the text (`reading`):
- `mean-tau` **[choice]** (docs/spec.md): `g^λ` at the evolving local model (eq. 3),
  `w_(k+1) = w_k − η_g η Σ_i p_i τ_i G_i`: FedAvg exactly when `α = 1` (then
  `τ_i G_i = Σ_λ g^λ = −Δ_i / η`); `rescale=False` uses `m_i` in place of `τ_i`;
- `sum`: the text's "we **sum** the gradients in the permutation" (eq. 6), `g^λ` at the evolving
  local model, `w_(k+1) = w_k − η_g η Σ_i p_i S_i`; with `η_g = 1` (default) `α = 1` is FedAvg
  exactly, and `α < 1` takes a step about `α` times FedAvg's (identical to `mean-tau` with
  `rescale=False`); `η_g = 1/α` is `mean-tau` up to the floor in `m_i` ("this allows us to
  increase the step size of the global gradient");
- `fixed-point`: Definition 1: every `g^λ = ∇f(w_k; ξ^λ)` at the global model held fixed for
  the round (no local movement), herded and summed as in `sum`:
  `w_(k+1) = w_k − η_g η Σ_i p_i S_i`. With `α = 1` this is one gradient step of size
  `η_g η τ_i` on the client's batches, so it needs `η_g η τ_i < 2/L` to be stable.

Variants:
- `bherd-fednova`: FedNova's rule with `G_i` as the normalised direction:
  `τ_eff = Σ_i p_i a_i`, `w ← w − η τ_eff Σ_i p_i G_i`, `a_i = τ_i` (or `m_i`, `rescale=False`).
- `bherd-scaffold`: local steps use `g − c_i + c` (SCAFFOLD); the corrected gradients are
  herded; the model moves as BHerd's (`reading`); control variates as SCAFFOLD (docs/spec.md):
  option II `c_i⁺ = c_i − c + (x − y_i)/(τ_i η)` with `y_i` the client's actual local model
  after its `τ_i` steps **[choice]** (under `fixed-point`, where `y_i = x`, the mean corrected
  gradient, which `(x − y_i)/(τ_i η)` equals for plain SGD); option I `c_i⁺ = ∇F_i(x)` at the
  received `x`, computed before the local steps as in `scaffold`;
  `c ← c + (|S|/N) Σ_S p_i Δc_i` with the weights of the model step (`weighting`), exactly
  `scaffold`'s rules and helpers (see its docstring for why the two means share weights).

Batches come in one fixed order (the paper's non-RR protocol, §4.1, §2.8) by default; the
client keeps a cursor so fractional epochs walk on through its data across rounds
**[choice]**; `order="reshuffle"` draws a new permutation every round (RR).
Local momentum is rejected: BHerd herds the plain SGD gradients.

Memory: a client holds its `τ × d` float32 gradient buffer (`4 τ d` bytes) plus the `τ × τ`
float64 Gram matrix: one client at a time under the sequential executor, every client of a
stacked chunk under the stacked one (`cohort_chunk` bounds it); see docs/bherd.md for the CIFAR
CNN's numbers. Under the stacked executor the buffers are one `(C, τ_max, d)` tensor written
once per step, and the Gram matrices and herding orders of the clients that finish together are
one stacked computation (`HerdStore`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, TypeVar, cast

import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    PER_CLIENT_COLUMNS,
    Algorithm,
    ClientContext,
    ClientState,
    Message,
    Reply,
    RunInfo,
    ServerState,
    WeightedMean,
    per_client_record,
    require_replies,
)
from fedhet.algorithms.fedavg import CLIENT_SCALARS, client_diagnostics
from fedhet.algorithms.scaffold import (
    Scaffold,
    ScaffoldState,
    corrected,
    option_one_variate,
    option_two_variate,
    variate_step,
)
from fedhet.errors import FedhetError
from fedhet.training.hooks import GradientStore
from fedhet.training.steps import Transform

TIE_TOLERANCE = 1e-9
"""Candidates whose `‖s + z‖²` are within this fraction of `max ‖z‖²` of the best count as tied
(so rounding does not decide ties, e.g. `z^0 = −z^1` when `τ = 2`); the lowest index wins."""

GRAM_CHUNK_ELEMENTS = 1 << 21
"""Float64 elements converted at once while forming the Gram matrix or a mean (16 MB)."""


# -- Algorithm 2: herding order -------------------------------------------------------------
def row_mean(x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of the rows of `x` (or of `rows` of it) in float64, a few rows at a time."""
    idx = torch.arange(x.shape[0], device=x.device) if rows is None else rows
    chunk = max(1, GRAM_CHUNK_ELEMENTS // max(x.shape[1], 1))
    acc = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for start in range(0, len(idx), chunk):
        acc.add_(x[idx[start : start + chunk]].to(torch.float64).sum(0))
    return acc.div_(len(idx))


def centred_gram(x: torch.Tensor) -> torch.Tensor:
    """`Γ = Z Zᵀ` with `z^λ = x^λ − mean(x)`, in float64, without copying `x` (`Γ = H X Xᵀ H`)."""
    return centred_grams(x.unsqueeze(0))[0]


def centred_grams(x: torch.Tensor) -> torch.Tensor:
    """`centred_gram` of `L` clients' `τ × d` buffers at once: `x` is `(L, τ, d)`, the result
    `(L, τ, τ)` float64 (one stacked product per column chunk)."""
    n, tau, d = x.shape
    cols = max(1, GRAM_CHUNK_ELEMENTS // max(n * tau, 1))
    k = torch.zeros(n, tau, tau, dtype=torch.float64, device=x.device)
    for start in range(0, d, cols):
        part = x[:, :, start : start + cols].to(torch.float64)
        k.baddbmm_(part, part.transpose(1, 2))
    r = k.mean(dim=2, keepdim=True)
    return k - r - r.transpose(1, 2) + k.mean(dim=(1, 2), keepdim=True)


CRITERIA = ("greedy", "grab-stale")
Criterion = Literal["greedy", "grab-stale"]


def check_criterion(criterion: str) -> None:
    if criterion not in CRITERIA:
        raise FedhetError(
            f"algorithm.criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}"
        )


def herding_order_gram(gram: torch.Tensor, criterion: Criterion = "greedy") -> torch.Tensor:
    """Algorithm 2 from the Gram matrix of the centred vectors: `O(τ²)`, ties → lowest index."""
    return herding_orders(gram.unsqueeze(0), [criterion])[0]


def herding_orders(grams: torch.Tensor, criteria: Sequence[Criterion] | None = None) -> torch.Tensor:
    """Algorithm 2 for `L` clients at once from their `(L, τ, τ)` centred Gram matrices; returns
    `(L, τ)` orders. Step `t` appends, per client, the unused `j` minimising
    `‖s + z^j‖² − ‖s‖² = 2 sᵀz^j + Γ_jj` (`"greedy"`), or, for a client whose criterion is
    `"grab-stale"`, `‖z^j + t·s‖² − t²‖s‖² = 2t sᵀz^j + Γ_jj` (`sᵀz^j` a running sum of rows of
    `Γ`); candidates within `TIE_TOLERANCE · max_j Γ_jj` of the best tie, and the lowest index
    wins. `criteria`: one per client (None: all `"greedy"`). No device synchronisation: the
    first candidate is an `argmax` over the tie mask."""
    n, tau, _ = grams.shape
    diag = grams.diagonal(dim1=1, dim2=2)
    order = torch.empty(n, tau, dtype=torch.long, device=grams.device)
    if tau == 0:
        return order
    for c in criteria or ():
        check_criterion(c)
    stale = None
    if criteria is not None and "grab-stale" in criteria:
        stale = torch.tensor([c == "grab-stale" for c in criteria], device=grams.device)
        stale = stale.unsqueeze(1)
    tol = TIE_TOLERANCE * diag.max(dim=1, keepdim=True).values
    cross = torch.zeros(n, tau, dtype=grams.dtype, device=grams.device)
    used = torch.zeros(n, tau, dtype=torch.bool, device=grams.device)
    clients = torch.arange(n, device=grams.device)
    for t in range(tau):
        weighted = cross if stale is None else torch.where(stale, cross * t, cross)
        score = (2 * weighted + diag).masked_fill_(used, float("inf"))
        tied = score <= score.min(dim=1, keepdim=True).values + tol
        j = tied.to(torch.uint8).argmax(dim=1)  # the first (lowest-index) tied candidate
        order[:, t] = j
        used[clients, j] = True
        cross += grams[clients, j]
    return order


def herding_order(x: torch.Tensor, criterion: Criterion = "greedy") -> torch.Tensor:
    """Herding order of the rows of `x` (`τ × d`) via the Gram matrix."""
    return herding_order_gram(centred_gram(x), criterion)


def herding_order_direct(x: torch.Tensor, criterion: Criterion = "greedy") -> torch.Tensor:
    """Reference Algorithm 2 on the vectors themselves: `O(τ² d)`, `‖s + z^λ‖` per candidate
    (`"grab-stale"`: `‖z^λ + t·s‖` at position `t`)."""
    check_criterion(criterion)
    z = x.to(torch.float64)
    z = z - z.mean(0)
    tol = TIE_TOLERANCE * float((z * z).sum(1).max()) if len(z) else 0.0
    s = torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)
    left = list(range(z.shape[0]))
    order: list[int] = []
    while left:
        t = len(order) if criterion == "grab-stale" else 1
        sq = [float(torch.linalg.vector_norm(t * s + z[j])) ** 2 - t * t * float(s @ s)
              for j in left]
        best = min(sq) + tol
        j = left.pop(next(a for a in range(len(left)) if sq[a] <= best))
        order.append(j)
        s += z[j]
    return torch.tensor(order, dtype=torch.long, device=x.device)


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
    """`‖G_i − mean_λ g^λ‖` (Fig. 4d) of the herd, also when the guard fell back."""
    mean_all: torch.Tensor
    """`μ = mean_λ g^λ` over all `τ` rows (eq. 5), float64."""
    fallback: bool = False
    """The guard replaced the kept herd by all `τ` rows (`guarded`)."""
    cos: float = 1.0
    """`cos(G_i, μ_i)` of the herd (also when the guard fell back): how far the kept mean turns
    away from the mean of all the client's gradients."""
    ratio: float = 1.0
    """`‖G_i‖ / ‖μ_i‖` of the herd (also when the guard fell back)."""


def herd_select(x: torch.Tensor, alpha: float, order: torch.Tensor | None = None,
                criterion: Criterion = "greedy") -> HerdSelection:
    """Herd the rows of `x`, keep the first `max(1, ⌊α τ⌋)`, return their mean (eqs. 1, 6).
    `order`: the rows' herding order when already known (`HerdStore`)."""
    order = herding_order(x, criterion) if order is None else order
    kept = order[: kept_count(alpha, x.shape[0])]
    g_kept, mu = row_mean(x, kept), row_mean(x)
    distance = float(torch.linalg.vector_norm(g_kept - mu))
    cos, ratio = alignment(g_kept, mu)
    return HerdSelection(order, kept, g_kept.to(torch.float32), distance, mu, cos=cos, ratio=ratio)


def alignment(g: torch.Tensor, mu: torch.Tensor) -> tuple[float, float]:
    """`(cos(g, μ), ‖g‖/‖μ‖)`; `(1, 1)` when `μ = 0` and `g = 0`, NaN when only `μ = 0`."""
    ng, nm = float(torch.linalg.vector_norm(g)), float(torch.linalg.vector_norm(mu))
    if nm == 0.0:
        return (1.0, 1.0) if ng == 0.0 else (math.nan, math.nan)
    cos = float(g @ mu) / (ng * nm) if ng > 0.0 else 0.0
    return cos, ng / nm


def guarded(sel: HerdSelection, max_error: float) -> HerdSelection:
    """Keep all rows instead when `‖G_i − μ‖ > max_error · ‖μ‖` (`max_error > 0`): the kept
    herd no longer stands for the whole set (eq. 1's premise), so the client falls back to
    `α = 1` for this round. `max_error = 0` turns the guard off."""
    if max_error <= 0 or sel.distance <= max_error * float(torch.linalg.vector_norm(sel.mean_all)):
        return sel
    return HerdSelection(sel.order, sel.order, sel.mean_all.to(torch.float32), sel.distance,
                         sel.mean_all, fallback=True, cos=sel.cos, ratio=sel.ratio)


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


class HerdStore(GradientStore):
    """BHerd's `τ × d` gradient buffer (`GradientStore`). Stacked, the herding orders of the
    clients that finish together come from one stacked Gram product and one stacked Algorithm 2
    (`centred_grams`, `herding_orders`) instead of one client at a time."""

    order: torch.Tensor | None = None

    def __init__(self, tau: int, dim: int, device: torch.device | str | None = None,
                 criterion: Criterion = "greedy") -> None:
        super().__init__(tau, dim, device)
        self.criterion: Criterion = criterion

    @classmethod
    def finished(cls, stores: Sequence[HerdStore], grads: torch.Tensor) -> None:
        orders = herding_orders(centred_grams(grads), [s.criterion for s in stores])
        for store, order in zip(stores, orders, strict=True):
            store.order = order


def herd_local_pass(
    w0: torch.Tensor, ctx: ClientContext, batches: Any, alpha: float,
    transforms: Sequence[Transform] = (), fixed_point: bool = False, max_error: float = 0.0,
    criterion: Criterion = "greedy",
) -> HerdPass:
    """Local SGD keeping each step's gradient in a `τ × d` buffer (`HerdStore`), then herd.

    `fixed_point`: the same pass with a zero step, so every gradient is taken at `w0`
    (Definition 1); the returned `w` is `w0`. `max_error`: the guard (`guarded`). `criterion`:
    the herding criterion (`herding_orders`)."""
    store = HerdStore(ctx.tau, w0.numel(), w0.device, criterion)
    sgd = replace(ctx.sgd, lr=0.0) if fixed_point else ctx.sgd
    w, steps, loss = ctx.trainer.sgd(w0, batches, sgd, transforms=transforms, on_step=store)
    grads = store.rows()[:steps]
    order = store.order if store.order is not None and len(store.order) == steps else None
    return HerdPass(w, steps, loss, guarded(herd_select(grads, alpha, order, criterion), max_error))


def herd_reply(ctx: ClientContext, hp: HerdPass, extra: dict[str, torch.Tensor] | None = None):
    sel = hp.selection
    return Message(
        {"G": sel.mean_kept, "kept": sel.kept.to(torch.int32), **(extra or {})},
        {
            "num_samples": float(ctx.num_samples), "steps": float(hp.steps),
            "kept_steps": float(len(sel.kept)), "lr": ctx.sgd.lr, "train_loss": hp.loss,
            "herd_dist": sel.distance, "herd_fallback": float(sel.fallback),
            "herd_cos": sel.cos, "herd_ratio": sel.ratio,
        },
    )


@dataclass(kw_only=True, eq=False)
class BHerdClientState(ClientState):
    """What a BHerd client keeps between rounds."""

    cursor: int = 0
    """Position in the client's fixed batch order (`order="fixed"`) where its next round starts,
    so fractional epochs walk on through its data **[choice]**."""


@dataclass(kw_only=True, eq=False)
class BHerdScaffoldClientState(BHerdClientState):
    """A BHerd-SCAFFOLD client: the batch cursor and SCAFFOLD's control variate."""

    c_i: torch.Tensor | None = None
    """Client control variate `c_i`; None before the client's first round (zeros)."""

    RENAMED: ClassVar[dict[str, str]] = {"c": "c_i"}


# -- parameters --------------------------------------------------------------------------------
READINGS = ("mean-tau", "sum", "fixed-point")
Reading = Literal["mean-tau", "sum", "fixed-point"]


def check_alpha(alpha: float) -> None:
    if not 0.0 < alpha <= 1.0:
        raise FedhetError(
            f"algorithm.alpha must be in (0, 1] (the fraction of local gradients kept), got {alpha}"
        )


@dataclass(frozen=True)
class BHerdFedNovaParams:
    alpha: float = 0.5
    rescale: bool = True
    """`a_i = τ_i` (True) or `m_i` (False) in FedNova's `τ_eff`."""
    order: Literal["fixed", "reshuffle"] = "fixed"
    weighting: Literal["samples", "uniform"] = "samples"
    criterion: Criterion = "greedy"
    """Herding criterion (`herding_orders`): `greedy` (`‖s + z‖`) or `grab-stale` (GraB's
    reference sorter, `‖z + t·s‖` at position `t`)."""

    def validate(self) -> None:
        check_alpha(self.alpha)
        check_criterion(self.criterion)


@dataclass(frozen=True)
class BHerdParams:
    alpha: float = 0.5
    reading: Reading = "mean-tau"
    """Eqs. 6–7 (module docstring): `mean-tau`, `sum` or `fixed-point`."""
    server_lr: float = 1.0
    """`η_g`, multiplies the server step in every reading (as SCAFFOLD's `server_lr`);
    `global_lr` is its old name."""
    rescale: bool = True
    """`mean-tau` only: scale `G_i` by `τ_i` (True, FedAvg at α = 1) or by `m_i` (False)."""
    order: Literal["fixed", "reshuffle"] = "fixed"
    weighting: Literal["samples", "uniform"] = "samples"
    max_herd_error: float = 0.0
    """The guard `ρ` (`guarded`): a client whose kept mean is farther than `ρ ‖μ_i‖` from the
    mean of all its gradients sends that mean instead (`α = 1` for the round); 0 = off."""
    criterion: Criterion = "greedy"
    """Herding criterion (`herding_orders`): `greedy` (`‖s + z‖`, Algorithm 2 as we read it) or
    `grab-stale` (GraB's reference sorter, `‖z + t·s‖` at position `t`)."""

    ALIASES: ClassVar[dict[str, str]] = {"global_lr": "server_lr"}

    def validate(self) -> None:
        check_alpha(self.alpha)
        check_criterion(self.criterion)
        if not (self.max_herd_error >= 0 and math.isfinite(self.max_herd_error)):
            raise FedhetError(
                f"algorithm.max_herd_error must be a number ≥ 0 (0 = off), got {self.max_herd_error}"
            )
        if not (self.server_lr > 0 and math.isfinite(self.server_lr)):
            raise FedhetError(f"algorithm.server_lr must be a positive number, got {self.server_lr}")
        if not self.rescale and self.reading != "mean-tau":
            raise FedhetError(
                f"algorithm.rescale=false applies to reading=mean-tau only (reading={self.reading} "
                "already scales by m_i)"
            )


@dataclass(frozen=True)
class BHerdScaffoldParams(BHerdParams):
    option: Literal["II", "I"] = "II"
    max_herd_error: float = 1.0
    """On by default: without it BHerd-SCAFFOLD collapses where the herd's error outgrows the
    small corrected mean (docs/bherd.md "BHerd-SCAFFOLD")."""


# -- server helpers ----------------------------------------------------------------------------
def herd_diagnostics(num_clients: int, replies: Sequence[Reply]) -> dict[str, Any]:
    """`herd_dist_<i>`, `tau_<i>`, `kept_<i>` columns (NaN for absent clients; beyond
    `PER_CLIENT_COLUMNS` clients only the round's, in diagnostics.jsonl), kept indices, and the
    herd's drift from the full mean, averaged over the round's clients: `herd_cos` (mean of
    `cos(G_i, μ_i)`) and `herd_norm_ratio` (mean of `‖G_i‖/‖μ_i‖`), so a run shows its kept
    means turning away before its loss does (docs/bherd.md)."""
    diag: dict[str, Any] = {}
    by_id = {r.client_id: r.message for r in replies}
    if num_clients > PER_CLIENT_COLUMNS:
        diag.update(per_client_record({
            name: {c: m.scalars[key] for c, m in by_id.items()}
            for name, key in (("herd_dist", "herd_dist"), ("tau", "steps"), ("kept", "kept_steps"))
        }))
    for i in range(num_clients if num_clients <= PER_CLIENT_COLUMNS else 0):
        msg = by_id.get(i)
        diag[f"herd_dist_{i}"] = msg.scalars["herd_dist"] if msg else float("nan")
        diag[f"tau_{i}"] = msg.scalars["steps"] if msg else float("nan")
        diag[f"kept_{i}"] = msg.scalars["kept_steps"] if msg else float("nan")
    diag["herd_fallbacks"] = sum(r.message.scalars.get("herd_fallback", 0.0) for r in replies)
    for name, key in (("herd_cos", "herd_cos"), ("herd_norm_ratio", "herd_ratio")):
        vals = [r.message.scalars[key] for r in replies if key in r.message.scalars]
        diag[name] = sum(vals) / len(vals) if vals else float("nan")
    diag["kept_indices"] = {str(r.client_id): r.message.tensors["kept"].tolist() for r in replies}
    return diag


def step_scale(reply: Reply, rescale: bool) -> float:
    """`η_i τ_i` (`mean-tau`) or `η_i m_i` (`rescale=False`, `sum`, `fixed-point`)."""
    s = reply.message.scalars
    return s["lr"] * (s["steps"] if rescale else s["kept_steps"])


def reading_scale(params: BHerdParams) -> bool:
    """Whether the server scales `G_i` by `τ_i` (else by `m_i`, i.e. steps with `S_i`)."""
    return params.reading == "mean-tau" and params.rescale


BS = TypeVar("BS", bound=ServerState)
"""A BHerd variant's server state."""
BC = TypeVar("BC", bound=BHerdClientState)
"""A BHerd variant's client state (its place in the fixed batch order, and SCAFFOLD's `c_i`)."""


class _BHerdBase(Algorithm[BS, BC]):
    """The BHerd client half and shared server pieces."""

    client_state_class: ClassVar[type[ClientState] | None] = BHerdClientState
    plain_sgd = (
        "it herds the raw mini-batch gradients and the server steps w − η Σ p_i τ_i G_i with "
        "them (eq. 7), the plain SGD update"
    )

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

    def client_init(self, client_id: int) -> BC:
        return cast(BC, BHerdClientState())  # BHerd-SCAFFOLD's clients build their own

    @property
    def fixed_point(self) -> bool:
        return getattr(self.params, "reading", "mean-tau") == "fixed-point"

    def client_update(self, message: Message, ctx: ClientContext, state: BC):
        batches, cursor = local_batches(ctx, self.params.order, state.cursor)
        hp = herd_local_pass(
            message.tensors["w"], ctx, batches, self.params.alpha, fixed_point=self.fixed_point,
            max_error=getattr(self.params, "max_herd_error", 0.0), criterion=self.params.criterion,
        )
        return herd_reply(ctx, hp), replace(state, cursor=cursor)

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
    return (acc.sum("G") * (factor / acc.total)).to(torch.float32)


@ALGORITHMS.register("bherd", BHerdParams, "BHerd-FedAvg: herd local gradients, keep ⌊ατ⌋ (eq. 7)")
class BHerd(_BHerdBase[ServerState, BHerdClientState]):
    name = "bherd"

    def aggregate(self, state: ServerState, round: int, replies: Iterable[Reply]):
        by_tau = reading_scale(self.params)
        acc, light = self.stream(replies, lambda r: step_scale(r, by_tau))
        w = state.w - _step(acc, self.params.server_lr)
        return replace(state, w=w), self.round_diagnostics(acc, light)


@ALGORITHMS.register("bherd-fednova", BHerdFedNovaParams, "BHerd-FedNova: FedNova's τ_eff with G_i")
class BHerdFedNova(_BHerdBase[ServerState, BHerdClientState]):
    name = "bherd-fednova"

    def aggregate(self, state: ServerState, round: int, replies: Iterable[Reply]):
        key = "steps" if self.params.rescale else "kept_steps"
        acc, light = self.stream(replies, lambda r: r.message.scalars["lr"], scalars=(key,))
        tau_eff = acc.scalar(key)
        diag = {**self.round_diagnostics(acc, light), "tau_eff": tau_eff}
        return replace(state, w=state.w - _step(acc, tau_eff)), diag


@ALGORITHMS.register(
    "bherd-scaffold", BHerdScaffoldParams, "BHerd-SCAFFOLD: herd SCAFFOLD-corrected gradients"
)
class BHerdScaffold(_BHerdBase[ScaffoldState, BHerdScaffoldClientState]):
    name = "bherd-scaffold"
    state_class = ScaffoldState
    client_state_class = BHerdScaffoldClientState

    init = Scaffold.init  # w_0 and c = 0
    configure = Scaffold.configure  # (w, c) to every client

    def client_init(self, client_id: int) -> BHerdScaffoldClientState:
        return BHerdScaffoldClientState()

    def client_update(self, message: Message, ctx: ClientContext, state: BHerdScaffoldClientState):
        w0, c = message.tensors["w"], message.tensors["c"]
        c_i = state.c_i
        if self.params.option == "I":  # at the received x, before the local steps move the
            c_new = option_one_variate(ctx, w0)  # shared model's BatchNorm statistics
        batches, cursor = local_batches(ctx, self.params.order, state.cursor)
        hp = herd_local_pass(w0, ctx, batches, self.params.alpha, transforms=(corrected(c, c_i),),
                             fixed_point=self.fixed_point, max_error=self.params.max_herd_error,
                             criterion=self.params.criterion)
        if self.params.option == "II" and self.fixed_point:  # mean corrected gradient at x
            c_new = hp.selection.mean_all.to(torch.float32).sub_(c)
            c_new = c_new if c_i is None else c_new.add_(c_i)
        elif self.params.option == "II":
            c_new = option_two_variate(w0, hp.w, c, c_i, hp.steps, ctx.sgd.lr)
        reply = herd_reply(ctx, hp, {"delta_c": c_new if c_i is None else c_new - c_i})
        return reply, BHerdScaffoldClientState(cursor=cursor, c_i=c_new)

    def aggregate(self, state: ScaffoldState, round: int, replies: Iterable[Reply]):
        by_tau = reading_scale(self.params)
        acc, light = self.stream(replies, lambda r: step_scale(r, by_tau), extra=("delta_c",))
        delta_c = variate_step(acc, self.run.num_clients)  # SCAFFOLD's rule and weights
        w = state.w - _step(acc, self.params.server_lr)
        c = state.c + delta_c
        diag = {**self.round_diagnostics(acc, light), "c_norm": float(c.norm())}
        return replace(state, w=w, c=c), diag
