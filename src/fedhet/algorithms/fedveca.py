"""FedVeca: federated vectorized averaging with adaptive bi-directional step sizes.

Seed: `fedveca.txt`, Algorithms 1 (server) and 2 (client); docs/spec.md "FedVeca".

Client `i` in round `k` runs `τ_(k,i)` plain local SGD steps from `w_k` (eq. 1) and returns

- the averaged bi-directional vector `G_(k,i) = (1/τ_(k,i)) Σ_λ g_(k,i)^λ` (eq. 5, FedNova's
  normalised direction with `a_i = τ_(k,i)`),
- `∇F_i(w_k)`, its gradient at the received model over its local data (Algorithm 2 line 9)
  **[choice]** exact, over all local samples in chunks; `grad_batches > 0` estimates it from
  that many random mini-batches of size `B` instead. It is the gradient of the objective the
  local steps descend: with `weight_decay = λ` it includes `λ w_k`, as every `g^λ` does, so
  `β` compares like with like and `∇F(w_k)` is the gradient of the regularised global loss,
- the round's learning rate `η_k` (a scalar; under `lr_schedule = "cosine"` it changes every
  round), which the server uses wherever the rule has `η`,
- from round 1 on, `β_(k,i)` and `δ_(k,i)` (Algorithm 2 lines 15–18), estimated from what the
  client really has: its per-step mini-batch gradients `g^λ` at `w^λ` **[choice]** (standing in
  for `∇F_i(w^λ)`), its own `∇F_i(w_k)`, and the server's `∇F(w_(k−1))` from the downlink:
  `β = max_λ ‖∇F_i(w_k) − g^λ‖ / ‖w_k − w^λ‖` and
  `δ = max_λ ‖Σ_(s≤λ) g^s‖² / ((λ+1) ‖∇F(w_(k−1))‖²)`, both over `λ ∈ [1, τ−1]`
  (`λ = 0` has `w^0 = w_k`, a zero denominator).

The server (Algorithm 1) forms `∇F(w_k) = Σ p_i ∇F_i(w_k)` (eq. 8), updates
`w_(k+1) = w_k − η_k τ_k d_k` with `τ_k = Σ p_i τ_(k,i)`, `d_k = Σ p_i G_(k,i)` (eq. 5) and the
clients' `η_k` of this round (the paper's `η` is constant; with a schedule, the step the clients
took), estimates
`L_(k−1)` one round late (lines 11–16; `‖∇F(w_0)‖/‖w_0‖` at `k = 1`), keeps `L = max` so far,
and predicts the next step counts by eq. 15,
`τ_(k+1,i) = ⌊A_(k,i) / (A_(k,i) − α_k min_j A_(k,j))⌋` with `A = η_k β² δ`, reset to 2 when
`≤ 1` and capped at `τ_max` (§IV-A4). Guards **[choice]** (docs/spec.md): a non-finite or missing
estimate keeps the previous `τ`; `A ≤ 0` or a denominator `≤ 0` gives `τ_max`; the minimum runs
over the clients with a finite positive `A`. The floor allows a 1e-9 slack so that
`⌊1/(1 − 0.95)⌋` is 20 as in exact arithmetic, not 19.

Round 0 and 1 use `τ_(0,i)` (line 25). **[choice]** The server does not know `D_i` before the
first round, so in round 0 it sends no `tau`: the client takes the engine's step count (with the
default `local_epochs = 1` that is `⌊E·D_i/B⌋`, `E = 1`), clips it to `[2, τ_max]`, runs it and
reports it as `steps`; the server copies it to round 1. From then on every downlink carries the
server's `tau` decision. A client that was not sampled yet gets no `tau` and starts the same way.

Per round the diagnostics hold, for every client `i`, `tau_i` (the `τ_(k,i)` it ran; NaN when
not sampled), `beta_i`, `delta_i`, `A_i` (NaN in round 0) (beyond `PER_CLIENT_COLUMNS` clients,
only the round's clients, in diagnostics.jsonl: `base.per_client_record`), and `tau_k`, `tau_sum`
(`Σ_i τ_(k,i)`, whose total over rounds is `τ_all` of §IV-A1), `L_k` (this round's estimate
`L_(k−1)`), `L_max` and `eta_tau_L = η_k τ_k L` (Theorem 1's premise `≥ 1`, Fig. 4). `β`, `δ` and `L` are
ratios of gradient and model differences and do not involve `η`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fedhet.algorithms.base import (
    ALGORITHMS,
    PER_CLIENT_COLUMNS,
    Algorithm,
    ClientContext,
    Message,
    Reply,
    RunInfo,
    ServerState,
    WeightedMean,
    per_client_record,
    require_replies,
)
from fedhet.algorithms.fedavg import CLIENT_SCALARS, client_diagnostics
from fedhet.errors import FedhetError
from fedhet.training.hooks import StackableHook, StackedHook, keep_rows

TAU_RESET = 2
"""`τ ≤ 1` is reset to 2 (Algorithm 1 lines 19–21): the analysis needs `τ > 1`."""
FLOOR_SLACK = 1e-9
SETTLED_ROUNDS = 3
"""Rounds in a row with `τ_k ≤ TAU_RESET` before `FedVeca.note` says τ settled at the bottom."""
GRAD_STREAM = 11
"""Random-stream purpose for the `grad_batches` subsample (SGD batches use purpose 0)."""


@dataclass(frozen=True)
class FedVecaParams:
    alpha: float = 0.95
    """Constant `α_k` of eq. 15 (§IV-A4)."""
    alpha_schedule: tuple[float, ...] = ()
    """Per-round `α_k` (`α_0 … α_(K−1)`; `α_0` is unused); overrides `alpha` when given."""
    tau_max: int = 50
    """Cap on `τ_(k,i)` (§IV-A4)."""
    grad_batches: int = 0
    """0: exact `∇F_i(w_k)` over all local data; `> 0`: from that many random mini-batches."""

    def validate(self) -> None:
        for a in (self.alpha, *self.alpha_schedule):
            if not 0.0 < a < 1.0:
                raise FedhetError(f"algorithm.alpha (α_k) must be in (0, 1), got {a}")
        if self.tau_max < TAU_RESET:
            raise FedhetError(f"algorithm.tau_max must be ≥ {TAU_RESET}, got {self.tau_max}")
        if self.grad_batches < 0:
            raise FedhetError(f"algorithm.grad_batches must be ≥ 0, got {self.grad_batches}")

    def alpha_at(self, round: int) -> float:
        return self.alpha_schedule[round] if self.alpha_schedule else self.alpha


@dataclass(frozen=True, kw_only=True, eq=False)
class FedVecaState(ServerState):
    """FedVeca's server state (Algorithm 1): the model, the step counts it decided, its
    smoothness estimate and the two last rounds' global gradients and models it needs for
    `L_(k−1)` (lines 11–16) and the next downlink."""

    tau: list[int | None]
    """`τ_(k,i)` per client for its next round (eq. 15); None until the client has run once
    (it then takes `τ_(0,i)`, module docstring)."""
    L: float = math.nan
    """`L = max` of the estimates `L_(k−1)` so far; NaN before the first."""
    grad_last: torch.Tensor | None = None
    """`∇F(w_k)` of the last round (eq. 8), sent down as `∇F(w_(k−1))`; None before round 1."""
    w_last: torch.Tensor | None = None
    """`w_k` of the last round, the model `grad_last` was taken at."""
    grad_last2: torch.Tensor | None = None
    """`∇F` of the round before the last (`∇F(w_(k−2))` for `L_(k−1)`)."""
    w_last2: torch.Tensor | None = None
    """The model `grad_last2` was taken at."""


# -- the pieces, as functions of what each side holds -----------------------------------------
def initial_tau(default_steps: int, tau_max: int) -> int:
    """`τ_(0,i)`: the engine's `⌊E·D_i/B⌋` clipped to `[2, τ_max]`."""
    return int(min(max(default_steps, TAU_RESET), tau_max))


def predict_tau(
    A: Sequence[float], alpha: float, tau_max: int, tau_prev: Sequence[int]
) -> list[int]:
    """Eq. 15 with the reset to 2, the cap `τ_max` and the SPEC guards (module docstring)."""
    usable = [a for a in A if math.isfinite(a) and a > 0]
    a_min = min(usable) if usable else math.nan
    out = []
    for a, prev in zip(A, tau_prev, strict=True):
        if not math.isfinite(a):
            out.append(int(prev))
            continue
        denominator = a - alpha * a_min
        if a <= 0 or denominator <= 0:
            out.append(tau_max)
            continue
        ratio = a / denominator
        if not math.isfinite(ratio):
            out.append(int(prev))
            continue
        tau = math.floor(ratio + FLOOR_SLACK)
        out.append(min(TAU_RESET if tau <= 1 else tau, tau_max))
    return out


def smoothness(
    grad: torch.Tensor, w: torch.Tensor, grad_prev: torch.Tensor | None, w_prev: torch.Tensor | None
) -> float:
    """`L_(k−1)` (Algorithm 1 lines 11–14): `‖∇F(w_(k−1)) − ∇F(w_(k−2))‖ / ‖w_(k−1) − w_(k−2)‖`,
    or `‖∇F(w_0)‖ / ‖w_0‖` when there is no earlier model (`k = 1`). NaN when undefined."""
    if grad_prev is None or w_prev is None:
        num, den = _norm(grad), _norm(w)
    else:
        num, den = _norm(grad - grad_prev), _norm(w - w_prev)
    return num / den if den > 0 else math.nan


def _norm(v: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(v.to(torch.float64)))


class LocalEstimates(StackableHook):
    """An `on_step` hook: accumulates `Σ g^λ` for `G` and the running maxima of `β^λ`, `δ^λ`.

    Works online (nothing per step is kept), so `τ = 50` costs no memory on a large model, and
    without a device synchronisation per step (`β`, `δ` stay tensors until read). Stacked
    (`StackableHook`), the stacked executor updates every client's estimates with one set of
    tensor operations per step (`estimate_step`, the same code on a `(1, d)` row alone).
    `grad_local` is `∇F_i(w_k)`; `grad_global_prev` is the server's `∇F(w_(k−1))` (None in
    round 0, when neither estimate is made).
    """

    def __init__(
        self, w0: torch.Tensor, grad_local: torch.Tensor, grad_global_prev: torch.Tensor | None
    ) -> None:
        self.w0 = w0.to(torch.float64)
        self.grad_local = grad_local.to(torch.float64)
        self.g_sum = torch.zeros_like(self.w0)
        self.steps = 0
        self._beta = torch.full((), math.nan, dtype=torch.float64, device=self.w0.device)
        self._delta = self._beta.clone()
        prev_sq = math.nan if grad_global_prev is None else _norm(grad_global_prev) ** 2
        self._prev_sq = torch.tensor([prev_sq], dtype=torch.float64, device=self.w0.device)
        """`‖∇F(w_(k−1))‖²`, NaN in round 0 (no estimates then), as `estimate_step` takes it."""

    @property
    def beta(self) -> float:
        return float(self._beta)

    @property
    def delta(self) -> float:
        return float(self._delta)

    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor, loss: float) -> None:
        estimate_step(
            step, w.unsqueeze(0), g.unsqueeze(0), self.w0.unsqueeze(0),
            self.grad_local.unsqueeze(0), self.g_sum.unsqueeze(0),
            self._beta.view(1), self._delta.view(1), self._prev_sq,
        )
        self.steps = step + 1

    def direction(self) -> torch.Tensor:
        """`G_(k,i) = (1/τ) Σ_λ g^λ` (eq. 5)."""
        return (self.g_sum / max(self.steps, 1)).to(torch.float32)

    @classmethod
    def stack(cls, hooks: Sequence[LocalEstimates]) -> StackedHook:
        return _StackedEstimates(list(hooks))


def estimate_step(
    step: int, w: torch.Tensor, g: torch.Tensor, w0: torch.Tensor, grad_local: torch.Tensor,
    g_sum: torch.Tensor, beta: torch.Tensor, delta: torch.Tensor, prev_sq: torch.Tensor,
) -> None:
    """One step of `LocalEstimates` for `R` clients at once (Algorithm 2 lines 15–18), in place:
    `g_sum += g`; from step 1 on, for the rows with a `‖∇F(w_(k−1))‖²` (`prev_sq`, NaN where
    none), `β ← max(β, ‖∇F_i(w_k) − g‖ / ‖w_k − w‖)` (skipped while `w = w_k`) and
    `δ ← max(δ, ‖g_sum‖² / ((λ+1) prev_sq))` (`∞` when `prev_sq = 0`). `w`, `g`: `(R, d)` of
    any float dtype; the rest float64, `w0`, `grad_local`, `g_sum` `(R, d)`, the others `(R,)`."""
    g64 = g.to(torch.float64)
    g_sum.add_(g64)
    if step == 0:
        return
    known = ~prev_sq.isnan()
    dist = torch.linalg.vector_norm(w0 - w.to(torch.float64), dim=1)
    ratio = torch.linalg.vector_norm(grad_local - g64, dim=1) / dist
    beta.copy_(torch.where(known & (dist > 0), torch.fmax(beta, ratio), beta))
    ratio = torch.linalg.vector_norm(g_sum, dim=1).square() / ((step + 1) * prev_sq)
    ratio = torch.where(prev_sq > 0, ratio, torch.full_like(ratio, math.inf))
    delta.copy_(torch.where(known, torch.fmax(delta, ratio), delta))


class _StackedEstimates(StackedHook):
    """Members' `LocalEstimates` as `(R, d)` stacks; written back when they leave."""

    def __init__(self, hooks: list[LocalEstimates]) -> None:
        self.hooks = hooks
        self.w0 = torch.stack([h.w0 for h in hooks])
        self.grad_local = torch.stack([h.grad_local for h in hooks])
        self.g_sum = torch.stack([h.g_sum for h in hooks])
        self.beta = torch.stack([h._beta for h in hooks])
        self.delta = torch.stack([h._delta for h in hooks])
        self.prev_sq = torch.cat([h._prev_sq for h in hooks])

    def __call__(self, step: int, w: torch.Tensor, g: torch.Tensor) -> None:
        estimate_step(
            step, w, g, self.w0, self.grad_local, self.g_sum, self.beta, self.delta, self.prev_sq
        )

    def leave(self, members: Sequence[int], steps: int) -> None:
        for m in members:
            h = self.hooks[m]
            h.g_sum, h._beta, h._delta = self.g_sum[m].clone(), self.beta[m].clone(), self.delta[m].clone()
            h.steps = steps
        stay = keep_rows(len(self.hooks), members, self.w0.device)
        if stay is None:
            self.hooks = []
            return
        gone = set(members)
        self.hooks = [h for m, h in enumerate(self.hooks) if m not in gone]
        for name in ("w0", "grad_local", "g_sum", "beta", "delta", "prev_sq"):
            setattr(self, name, getattr(self, name).index_select(0, stay))


def _nanmax(a: float, b: float) -> float:
    return b if math.isnan(a) else max(a, b)


# -- the algorithm --------------------------------------------------------------------------
@ALGORITHMS.register("fedveca", FedVecaParams, "FedVeca: FedNova update with adaptive τ_(k,i) (eq. 15)")
class FedVeca(Algorithm[FedVecaState, None]):
    name = "fedveca"
    state_class = FedVecaState
    plain_sgd = (
        "it is defined for plain local SGD (eq. 1): its step-count rule (eq. 15) and the "
        "server step w − η τ_k d_k read the local steps as w ← w − η g"
    )

    def __init__(self, params: FedVecaParams, run: RunInfo) -> None:
        super().__init__(params, run)
        self._low_rounds = 0
        """Rounds in a row whose median client `τ_(k,i)` sat at `TAU_RESET` (`note`)."""
        self._median_tau = math.inf
        self._noted = False
        """The median `τ_(k,i)` the clients of the last aggregated round ran (`note`)."""
        if params.alpha_schedule and len(params.alpha_schedule) < run.rounds:
            raise FedhetError(
                f"algorithm.alpha_schedule has {len(params.alpha_schedule)} values but the run has "
                f"{run.rounds} rounds; give one α_k per round (α_0 … α_{run.rounds - 1})"
            )
        if run.momentum:
            raise FedhetError(
                "FedVeca is defined for plain local SGD (eq. 1); set momentum=0 for it"
            )

    # -- server half ----------------------------------------------------------------------
    def init(self, w0: torch.Tensor) -> FedVecaState:
        return FedVecaState(w=w0.clone(), tau=[None] * self.run.num_clients)

    def configure(self, state: FedVecaState, client_id: int, round: int) -> Message:
        message = Message({"w": state.w})
        tau = state.tau[client_id]
        if tau is not None:
            message.scalars["tau"] = float(tau)
        if state.grad_last is not None:
            message.tensors["grad_prev"] = state.grad_last
        return message

    def aggregate(self, state: FedVecaState, round: int, replies: Iterable[Reply]):
        """One pass: running `Σ p_i G_i`, `Σ p_i ∇F_i` and `Σ p_i τ_i`; per client only its
        scalars (`τ`, `β`, `δ`) are kept for eq. 15 and the diagnostics."""
        acc = WeightedMean()
        seen: list[Reply] = []
        for r in replies:
            acc.add(r, ("G", "grad"), (*CLIENT_SCALARS,))
            seen.append(Reply(r.client_id, Message({}, dict(r.message.scalars))))
        require_replies(acc.count)
        eta = round_lr(seen, self.run.lr)
        taus = [int(r.message.scalars["steps"]) for r in seen]
        self._median_tau = float(np.median(taus))  # advisory only (`note`), not in the state
        tau_k = float(acc.scalar("steps"))
        d_k = acc.mean("G")
        grad_k = acc.mean("grad")  # eq. 8
        replies = seen
        w_k = state.w
        A = [math.nan] * len(replies)
        L_k, L = math.nan, state.L
        if round >= 1 and state.grad_last is not None and state.w_last is not None:
            L_k = smoothness(state.grad_last, state.w_last, state.grad_last2, state.w_last2)
            if math.isfinite(L_k):
                L = _nanmax(state.L, L_k)
            A = [eta * _scalar(r, "beta") ** 2 * _scalar(r, "delta") for r in replies]
            next_taus = predict_tau(A, self.params.alpha_at(round), self.params.tau_max, taus)
        else:
            next_taus = taus  # Algorithm 1 line 25: τ_(1,i) = τ_(0,i)
        tau_table = list(state.tau)
        for r, t in zip(replies, next_taus, strict=True):
            tau_table[r.client_id] = int(t)
        new = replace(
            state, w=w_k - eta * tau_k * d_k, tau=tau_table, L=L,
            grad_last=grad_k, w_last=w_k, grad_last2=state.grad_last, w_last2=state.w_last,
        )
        diag = self._diagnostics(replies, taus, A, acc)
        diag.update(
            tau_k=tau_k, tau_sum=float(sum(taus)), L_k=L_k, L_max=new.L,
            eta_tau_L=eta * tau_k * new.L,
        )
        return new, diag

    def note(self, round: int, diagnostics: Mapping[str, Any]) -> str | None:
        """Said once when the round's median client `τ_(k,i)` has sat at the bottom of its range
        (`≤ 2`, the reset of §IV-A4) for `SETTLED_ROUNDS` rounds in a row: eq. 15 then gives
        most clients two local steps, and the run learns slowly."""
        self._low_rounds = self._low_rounds + 1 if self._median_tau <= TAU_RESET else 0
        if self._low_rounds != SETTLED_ROUNDS or self._noted:
            return None
        self._noted = True
        return (
            f"FedVeca's τ settled at the bottom of its range (the median client's τ ≤ {TAU_RESET} "
            f"for {SETTLED_ROUNDS} rounds by round {round + 1}): eq. 15 gives a client "
            f"{TAU_RESET} local steps whenever its A = ηβ²δ is about twice the round's smallest "
            "or more (A/(A − α·min A) < 2), so the run takes few steps a round and may learn "
            "slowly; the tau_i and A_i diagnostics show it (docs/fedveca.md)"
        )

    def _diagnostics(
        self, replies: Sequence[Reply], taus: list[int], A: list[float], acc: WeightedMean
    ) -> dict[str, Any]:
        cols: dict[str, dict[int, float]] = {name: {} for name in ("tau", "beta", "delta", "A")}
        for r, t, a in zip(replies, taus, A, strict=True):
            i = r.client_id
            cols["tau"][i], cols["A"][i] = float(t), a
            cols["beta"][i], cols["delta"][i] = _scalar(r, "beta"), _scalar(r, "delta")
        n = self.run.num_clients
        if n > PER_CLIENT_COLUMNS:
            diag: dict[str, Any] = per_client_record(cols)
        else:
            diag = {f"{name}_{i}": vs.get(i, math.nan) for name, vs in cols.items() for i in range(n)}
        diag.update(client_diagnostics(acc))
        return diag

    # -- client half ----------------------------------------------------------------------
    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        w0 = message.tensors["w"]
        if "tau" in message.scalars:
            tau = int(message.scalars["tau"])
        else:
            tau = initial_tau(ctx.tau, self.params.tau_max)
        grad_local = self.local_gradient(w0, ctx)
        est = LocalEstimates(w0, grad_local, message.tensors.get("grad_prev"))
        _, steps, loss = ctx.trainer.sgd(w0, ctx.batches(tau), ctx.sgd, on_step=est)
        scalars = {
            "num_samples": float(ctx.num_samples), "steps": float(steps), "train_loss": loss,
            "lr": ctx.sgd.lr,
        }
        if "grad_prev" in message.tensors:
            scalars.update(beta=est.beta, delta=est.delta)
        return Message({"G": est.direction(), "grad": grad_local}, scalars), state

    def local_gradient(self, w: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        """`∇F_i(w_k)` (Algorithm 2 line 9) of the objective the local steps use (weight decay
        included): exact, or from `grad_batches` random mini-batches."""
        indices = ctx.indices
        if self.params.grad_batches:
            n = min(len(indices), self.params.grad_batches * ctx.batch_size)
            pick = np.sort(ctx.rng(GRAD_STREAM).permutation(len(indices))[:n])
            indices = indices[torch.from_numpy(pick)]
        return ctx.objective_gradient(w, indices)


def round_lr(replies: Sequence[Reply], default: float) -> float:
    """The round's `η_k` as the clients report it (all clients of a round share it); `default`
    (the run's initial `η`) for replies from a client that does not send it."""
    for r in replies:
        if "lr" in r.message.scalars:
            return float(r.message.scalars["lr"])
    return default


def _scalar(reply: Reply, name: str) -> float:
    return float(reply.message.scalars.get(name, math.nan))
