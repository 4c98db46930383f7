"""The local SGD step as a chain of small transforms, written once for a row and for a stack.

One local step of a client (docs/spec.md; PyTorch's `torch.optim.SGD` convention), from the
mini-batch gradient `g` at the local model `w`:

    g ← g + λ w              WeightDecay(λ)          SGDConfig.weight_decay
    g ← g + μ (w − w_k)      Proximal(μ, w_k)        FedProx, FedNova with μ (docs/spec.md "FedProx")
    g ← g − c_i + c          Correction(c − c_i)     SCAFFOLD (docs/spec.md "SCAFFOLD")
    g ← f(g, w, step)        Custom(f)               any other per-step rewrite
      (the `on_step(step, w, g, loss)` hook sees this `g`)
    v ← ρ v + g,  d = v      Momentum(ρ)             SGDConfig.momentum (heavy ball; d = g if ρ = 0)
    w ← w − η d              the step                SGDConfig.lr

With `SGDConfig.optimizer = "adam"` or `"adamw"` the last two lines are Adam's step instead
(`Adam`, Kingma & Ba 2015, Algorithm 1, as `torch.optim.Adam`/`AdamW` compute it):

    w ← (1 − η λ) w          decoupled decay         AdamW only (its `WeightDecay` link is 0)
    m ← β1 m + (1 − β1) g,  v ← β2 v + (1 − β2) g²
    w ← w − (η / (1 − β1^t)) m / (√v / √(1 − β2^t) + ε)      t = 1, 2, … the step count

`LocalStep.of(cfg, transforms)` is that chain for one client: weight decay first, then the
algorithm's `transforms` in the order given, then momentum and the step (or Adam's step). The
chain's state (`init`) lives for one call of the local loop: a momentum buffer, or Adam's `m`
and `v` side by side in one tensor `[m | v]` (`(2d,)` for a row, `(C, 2d)` for a stack), all
zero at the start of every round, as is the step count `t`. `LocalTrainer.sgd`
runs it on one client's `(d,)` vectors; `CohortTrainer` stacks the chains of `C` clients with
`LocalStep.stack` and runs the same code on `(C, d)`: coefficients become per-row, anchors and
shifts are stacked (or broadcast, when every client shares one tensor), and a transform is one
tensor operation for the whole cohort. Only `Custom` runs row by row, on row views.

Bit-identity: a row of a stack gets exactly the arithmetic it gets alone, whatever the other
rows hold. A scaled add is `y.add_(x, alpha=a)` over the rows that share the value `a`
(`Scale`), never a per-row multiply then an add (two roundings where `add_` fuses them into
one); a row whose coefficient is 0 is left alone (no `+ 0·x`: `μ = 0` is FedAvg bit for bit,
`λ = 0` adds nothing, `η = 0` leaves `w` as it is); momentum multiplies each row by its own `ρ`
(one rounding either way) and a `ρ = 0` row's direction is its `g` itself. Adam steps the rows
that share its coefficients `(η, β1, β2, ε, λ)` as one group with Python-number coefficients,
the operations a row alone runs; SGD and Adam rows of one stack step as two sub-stacks. Rows
whose chains differ in shape (another algorithm's runs in the same stack of runs) are stacked
kind by kind within each shape, every stacked transform being zero on the rows of the other
shapes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Self

import torch

ClientOptimizer = Literal["sgd", "adam", "adamw"]
"""The local optimizer: SGD (heavy-ball momentum `ρ`), Adam (weight decay added to the
gradient, `torch.optim.Adam`) or AdamW (decoupled weight decay, `torch.optim.AdamW`)."""


@dataclass
class SGDConfig:
    """The local step (`LocalStep.of`; also importable from `fedhet.training.local`, which
    trains with it): learning rate `η`, momentum `ρ` and weight decay `λ`, and the optimizer
    with Adam's `β1, β2, ε` (used by `adam` and `adamw` only; `torch.optim.Adam`'s defaults)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    optimizer: ClientOptimizer = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


GradTransform = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""`(g, w, step) -> g'`: an arbitrary rewrite of one client's gradient before the momentum and
the step (wrap it in `Custom`). May work in place on `g`; must not modify `w`."""

Device = torch.device | str | None


class Scale:
    """Per-row coefficients `a_r` of the scaled add `y_r ← y_r + a_r x_r`, one value for a row
    `(d,)`, `C` values for a stack `(C, d)`; rows with `a_r = 0` are never touched.

    The rows that share a value are one `add_(x, alpha=a)`, the operation a row alone runs."""

    def __init__(self, values: Sequence[float], device: Device = None) -> None:
        self.values = tuple(float(a) for a in values)
        if len(set(self.values)) == 1:
            a = self.values[0]
            self.groups: list[tuple[float, torch.Tensor | None]] = [(a, None)] if a else []
        else:
            self.groups = [
                (a, torch.tensor([r for r, b in enumerate(self.values) if b == a], device=device))
                for a in dict.fromkeys(self.values) if a
            ]

    def __bool__(self) -> bool:
        """False when every coefficient is 0 (the add is skipped altogether)."""
        return bool(self.groups)

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """`y_r += a_r x_r` in place (`x` of `y`'s shape, or a `(d,)` row broadcast to all)."""
        for a, rows in self.groups:
            if rows is None:
                y.add_(x, alpha=a)
            else:
                xr = x.index_select(0, rows) if x.dim() == y.dim() else x
                y.index_copy_(0, rows, y.index_select(0, rows).add_(xr, alpha=a))

    def select(self, keep: Sequence[int], device: Device = None) -> Scale:
        return Scale([self.values[k] for k in keep], device)


def _values(coef: float | Sequence[float]) -> tuple[float, ...]:
    return (float(coef),) if isinstance(coef, int | float) else tuple(coef)


def _stacked(tensors: Sequence[torch.Tensor | None], device: Device) -> torch.Tensor:
    """`(C, d)` rows (zeros for `None`), or the one `(d,)` tensor when every row has it."""
    present = [t for t in tensors if t is not None]
    first = present[0]
    if all(t is first for t in tensors):
        return first.to(device)
    zero = torch.zeros_like(first, device=device)
    return torch.stack([zero if t is None else t.to(device) for t in tensors])


def _rows(t: torch.Tensor, keep: Sequence[int]) -> torch.Tensor:
    """The rows `keep` of a stacked `(C, d)` tensor; a broadcast `(d,)` one stays as it is."""
    if t.dim() == 1:
        return t
    return t.index_select(0, torch.tensor(list(keep), device=t.device))


class Transform(ABC):
    """One link `g ← T(g, w)` of the chain, in place, on a row `(d,)` or a stack `(C, d)`.

    A new kind of link implements the three methods; `LocalStep.stack` lines links up by kind."""

    @abstractmethod
    def apply(self, g: torch.Tensor, w: torch.Tensor, step: int) -> torch.Tensor:
        """The rewritten gradient (`g` itself for the typed transforms)."""
        raise NotImplementedError

    @property
    def active(self) -> bool:
        """False when `apply` would touch no row (every coefficient 0): the chain skips it."""
        return True

    @classmethod
    @abstractmethod
    def stack(cls, links: Sequence[Self | None], device: Device = None) -> Self:
        """One transform over a stack of rows, from one row transform per row; `None` marks a
        row this transform leaves alone."""
        raise NotImplementedError

    @abstractmethod
    def select(self, keep: Sequence[int], device: Device = None) -> Self:
        """The rows `keep` of a stacked transform (the clients still stepping)."""
        raise NotImplementedError


class WeightDecay(Transform):
    """`g ← g + λ w`: the gradient of `(λ/2)‖w‖²` folded in, as `torch.optim.SGD` does."""

    def __init__(self, lam: float | Sequence[float], device: Device = None) -> None:
        self.lam = Scale(_values(lam), device)

    def apply(self, g: torch.Tensor, w: torch.Tensor, step: int) -> torch.Tensor:
        self.lam.add_to(g, w)
        return g

    @property
    def active(self) -> bool:
        return bool(self.lam)

    @classmethod
    def stack(cls, links: Sequence[WeightDecay | None], device: Device = None) -> WeightDecay:
        return cls([t.lam.values[0] if t is not None else 0.0 for t in links], device)

    def select(self, keep: Sequence[int], device: Device = None) -> WeightDecay:
        return WeightDecay([self.lam.values[k] for k in keep], device)


class Proximal(Transform):
    """FedProx (docs/spec.md "FedProx"): `g ← g + μ (w − w_k)`, the gradient of the proximal
    term `(μ/2)‖w − w_k‖²` at the current local model; `anchor` is `w_k`. `μ = 0`: nothing."""

    def __init__(
        self, mu: float | Sequence[float], anchor: torch.Tensor, device: Device = None
    ) -> None:
        self.mu = Scale(_values(mu), device)
        self.anchor = anchor

    def apply(self, g: torch.Tensor, w: torch.Tensor, step: int) -> torch.Tensor:
        if self.mu:
            self.mu.add_to(g, w - self.anchor)
        return g

    @property
    def active(self) -> bool:
        return bool(self.mu)

    @classmethod
    def stack(cls, links: Sequence[Proximal | None], device: Device = None) -> Proximal:
        mus = [t.mu.values[0] if t is not None else 0.0 for t in links]
        return cls(mus, _stacked([t.anchor if t is not None else None for t in links], device), device)

    def select(self, keep: Sequence[int], device: Device = None) -> Proximal:
        mus = [self.mu.values[k] for k in keep]
        return Proximal(mus, _rows(self.anchor, keep), device)


class Correction(Transform):
    """SCAFFOLD's corrected gradient (docs/spec.md "SCAFFOLD"): `g ← g − c_i + c`, with
    `shift = c − c_i` computed once per round."""

    def __init__(self, shift: torch.Tensor, on: Scale | None = None) -> None:
        self.shift = shift
        self.on = on if on is not None else Scale((1.0,))
        """`1` on the rows that are corrected (`g.add_(shift, alpha=1)` is `g + shift`)."""

    def apply(self, g: torch.Tensor, w: torch.Tensor, step: int) -> torch.Tensor:
        self.on.add_to(g, self.shift)
        return g

    @property
    def active(self) -> bool:
        return bool(self.on)

    @classmethod
    def stack(cls, links: Sequence[Correction | None], device: Device = None) -> Correction:
        on = Scale([1.0 if t is not None else 0.0 for t in links], device)
        return cls(_stacked([t.shift if t is not None else None for t in links], device), on)

    def select(self, keep: Sequence[int], device: Device = None) -> Correction:
        return Correction(_rows(self.shift, keep), self.on.select(keep, device))


class Custom(Transform):
    """Any `(g, w, step) -> g'` callable (`GradTransform`). In a stack it runs row by row on the
    row views `g[r]`, `w[r]` (live buffers, as in the sequential loop; a returned new tensor is
    copied into the row). A row whose callable raises is recorded in `failed` and the others go
    on; `LocalStep.failures` hands the record to the cohort."""

    def __init__(self, fn: GradTransform | Sequence[GradTransform | None]) -> None:
        """`fn`: the callable of a row, or one per row of a stack (`None`: not this row)."""
        self.fn = fn
        self.failed: list[tuple[int, BaseException]] = []

    def apply(self, g: torch.Tensor, w: torch.Tensor, step: int) -> torch.Tensor:
        if callable(self.fn):
            return self.fn(g, w, step)
        for r, fn in enumerate(self.fn):
            if fn is None:
                continue
            try:
                out = fn(g[r], w[r], step)
                if out.data_ptr() != g[r].data_ptr():
                    g[r].copy_(out)
            except Exception as e:  # noqa: BLE001  (one client's transform failed: drop it)
                self.failed.append((r, e))
        return g

    @classmethod
    def stack(cls, links: Sequence[Custom | None], device: Device = None) -> Custom:
        return cls([None if t is None else t.row_fn() for t in links])

    def row_fn(self) -> GradTransform:
        """The one callable of a row's `Custom` (what `stack` lines up)."""
        if not callable(self.fn):
            raise TypeError("a stacked Custom is made of one-row Customs")
        return self.fn

    def select(self, keep: Sequence[int], device: Device = None) -> Custom:
        assert not callable(self.fn)
        return Custom([self.fn[k] for k in keep])


class Momentum:
    """Heavy ball as `torch.optim.SGD` (no dampening, no Nesterov): `v ← ρ v + g`, direction
    `d = v`, `v_0 = 0`; with `ρ = 0` there is no buffer and `d = g`. Per-row `ρ` in a stack."""

    def __init__(self, rho: float | Sequence[float], device: Device = None) -> None:
        self.rho = _values(rho)
        mixed = len(set(self.rho)) > 1
        self._column = torch.tensor(self.rho, device=device).unsqueeze(1) if mixed else None
        zeros = [r for r, a in enumerate(self.rho) if not a]
        self._plain = torch.tensor(zeros, device=device) if mixed and zeros else None
        """Rows with `ρ = 0` in a mixed stack: their direction is their `g`, copied exactly."""

    def init(self, w: torch.Tensor) -> torch.Tensor | None:
        """The buffer `v_0 = 0`, or `None` when no row has momentum."""
        return torch.zeros_like(w) if any(self.rho) else None

    def direction(self, g: torch.Tensor, v: torch.Tensor | None) -> torch.Tensor:
        """`d`: `v ← ρ v + g` in place (the buffer is the direction), or `g` without momentum."""
        if v is None:
            return g
        if self._column is None:
            return v.mul_(self.rho[0]).add_(g)
        v.mul_(self._column).add_(g)
        if self._plain is not None:
            v.index_copy_(0, self._plain, g.index_select(0, self._plain))
        return v

    @classmethod
    def stack(cls, links: Sequence[Momentum], device: Device = None) -> Momentum:
        return cls([t.rho[0] for t in links], device)

    def select(self, keep: Sequence[int], device: Device = None) -> Momentum:
        return Momentum([self.rho[k] for k in keep], device)


AdamRow = tuple[float, float, float, float, float]
"""One row's Adam coefficients `(η, β1, β2, ε, λ_decoupled)`; `λ_decoupled = 0` is Adam."""


class Adam:
    """Adam's moments and step (module docstring), per row: `torch.optim.Adam`'s single-tensor
    arithmetic (`m.lerp_(g, 1 − β1)`, `v.mul_(β2).addcmul_(g, g, 1 − β2)`, the bias corrections
    as Python numbers, `w.addcdiv_(m, √v/√(1 − β2^t) + ε, −η/(1 − β1^t))`), and AdamW's
    `w ← (1 − η λ) w` before it. Rows that share their coefficients step as one group."""

    def __init__(self, rows: Sequence[AdamRow], device: Device = None) -> None:
        self.rows: tuple[AdamRow, ...] = tuple(
            (float(r[0]), float(r[1]), float(r[2]), float(r[3]), float(r[4])) for r in rows)
        distinct = tuple(dict.fromkeys(self.rows))
        self.groups: list[tuple[tuple[float, ...], torch.Tensor | None]] = (
            [(distinct[0], None)] if len(distinct) == 1 else [
                (c, torch.tensor([r for r, b in enumerate(self.rows) if b == c], device=device))
                for c in distinct
            ]
        )

    @staticmethod
    def init(w: torch.Tensor) -> torch.Tensor:
        """`[m | v] = 0`: `(2d,)` for a row, `(C, 2d)` for a stack."""
        return torch.zeros(*w.shape[:-1], 2 * w.shape[-1], dtype=w.dtype, device=w.device)

    def step(self, w: torch.Tensor, g: torch.Tensor, state: torch.Tensor, t: int) -> None:
        """Step `t` (1, 2, …) in place on `w` and `state = [m | v]`."""
        for coef, rows in self.groups:
            if rows is None:
                _adam_step(coef, w, g, state, t)
                continue
            w_r, s_r = w.index_select(0, rows), state.index_select(0, rows)
            _adam_step(coef, w_r, g.index_select(0, rows), s_r, t)
            w.index_copy_(0, rows, w_r)
            state.index_copy_(0, rows, s_r)

    def select(self, keep: Sequence[int], device: Device = None) -> Adam:
        return Adam([self.rows[k] for k in keep], device)


def _adam_step(coef: tuple[float, ...], w: torch.Tensor, g: torch.Tensor, state: torch.Tensor,
               t: int) -> None:
    lr, beta1, beta2, eps, decay = coef
    d = w.shape[-1]
    m, v = state[..., :d], state[..., d:]
    if decay:
        w.mul_(1 - lr * decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction2_sqrt = (1 - beta2**t) ** 0.5
    denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
    w.addcdiv_(m, denom, value=-lr / (1 - beta1**t))


def adam_row(cfg: SGDConfig) -> AdamRow | None:
    """`cfg`'s Adam coefficients, None for SGD."""
    if cfg.optimizer == "sgd":
        return None
    decay = cfg.weight_decay if cfg.optimizer == "adamw" else 0.0
    return (cfg.lr, cfg.betas[0], cfg.betas[1], cfg.eps, decay)


class LocalStep:
    """The chain of the module docstring: `w ← w − η d`, `d = Momentum(T_k(… T_1(g)))`, or
    Adam's step on `T_k(… T_1(g))`, for a row (`of`) or a stack (`stack`)."""

    def __init__(
        self, transforms: Sequence[Transform], momentum: Momentum, lr: Sequence[float],
        device: Device = None, adam: Sequence[AdamRow | None] | None = None, t: int = 0,
    ) -> None:
        self.transforms = tuple(transforms)
        self._live = tuple(t for t in self.transforms if t.active)
        """The links that touch some row (a zero `λ` or `μ` everywhere is skipped)."""
        self._custom = tuple(t for t in self.transforms if isinstance(t, Custom))
        self.momentum = momentum
        self.lr = tuple(lr)
        """`η` per row."""
        self.descent = Scale([-a for a in self.lr], device)
        """`−η` per row: the step is `w ← w + (−η) d`."""
        self.adam_rows = tuple(adam) if adam is not None else (None,) * len(self.lr)
        """Each row's Adam coefficients (`adam_row`), None for an SGD row."""
        self.t = t
        """Steps taken (Adam's bias corrections use `t + 1` at the next one)."""
        self._adam: Adam | None = None
        self._sgd_part: tuple[torch.Tensor, LocalStep] | None = None
        adam_ix = [r for r, a in enumerate(self.adam_rows) if a is not None]
        if adam_ix:
            rows = [self.adam_rows[r] for r in adam_ix]
            self._adam = Adam(rows, device)  # type: ignore[arg-type]
            sgd_ix = [r for r, a in enumerate(self.adam_rows) if a is None]
            self._adam_ix = torch.tensor(adam_ix, device=device) if sgd_ix else None
            if sgd_ix:
                self._sgd_part = (torch.tensor(sgd_ix, device=device), LocalStep(
                    (), momentum.select(sgd_ix, device), [self.lr[r] for r in sgd_ix], device))

    @property
    def shape(self) -> tuple[type[Transform], ...]:
        """The kinds of the transforms, in order (what `stack` lines up)."""
        return tuple(type(t) for t in self.transforms)

    @classmethod
    def of(cls, cfg: SGDConfig, transforms: Sequence[Transform | GradTransform] = ()) -> LocalStep:
        """One client's chain: `WeightDecay(cfg.weight_decay)` (0 for AdamW, whose decay is
        decoupled), `transforms` in order (a bare callable is wrapped in `Custom`), then
        `Momentum(cfg.momentum)` and the step `cfg.lr`, or Adam's step (`cfg.optimizer`)."""
        links: list[Transform] = [WeightDecay(0.0 if cfg.optimizer == "adamw" else cfg.weight_decay)]
        links += [t if isinstance(t, Transform) else Custom(t) for t in transforms]
        return cls(links, Momentum(cfg.momentum), (cfg.lr,), adam=(adam_row(cfg),))

    def gradient(self, g: torch.Tensor, w: torch.Tensor, step: int) -> torch.Tensor:
        """`g` after every transform (what the `on_step` hook sees)."""
        for t in self._live:
            g = t.apply(g, w, step)
        return g

    def init(self, w: torch.Tensor) -> torch.Tensor | None:
        """The chain's state for `w` (row or stack): the momentum buffer, if any, or Adam's
        `[m | v]` (SGD rows of a mixed stack keep their momentum buffer in the `m` half)."""
        return self.momentum.init(w) if self._adam is None else Adam.init(w)

    def update(self, w: torch.Tensor, g: torch.Tensor, v: torch.Tensor | None) -> None:
        """`w ← w − η d` in place, `d` the momentum direction of the transformed `g`; Adam's
        step for Adam rows."""
        self.t += 1
        if self._adam is None:
            self.descent.add_to(w, self.momentum.direction(g, v))
            return
        assert v is not None
        if self._sgd_part is None:
            self._adam.step(w, g, v, self.t)
            return
        for ix, part in ((self._sgd_part[0], "sgd"), (self._adam_ix, "adam")):
            assert ix is not None
            w_r, g_r, s_r = w.index_select(0, ix), g.index_select(0, ix), v.index_select(0, ix)
            if part == "adam":
                self._adam.step(w_r, g_r, s_r, self.t)
            else:
                sgd = self._sgd_part[1]
                buf = s_r[:, : w.shape[-1]] if any(sgd.momentum.rho) else None
                sgd.descent.add_to(w_r, sgd.momentum.direction(g_r, buf))
            w.index_copy_(0, ix, w_r)
            v.index_copy_(0, ix, s_r)

    def failures(self) -> list[tuple[int, BaseException]]:
        """Rows whose `Custom` callable raised since the last call (then forgotten)."""
        out = []
        for t in self._custom:
            out += t.failed
            t.failed = []
        return out

    @classmethod
    def stack(cls, steps: Sequence[LocalStep], device: Device = None) -> LocalStep:
        """The chains of `C` clients as one chain over a `(C, d)` stack. Chains of one shape are
        lined up link by link; each further shape adds its own links, zero on the other rows."""
        links: list[Transform] = []
        shapes = [s.shape for s in steps]
        for shape in dict.fromkeys(shapes):
            for k, kind in enumerate(shape):
                rows = [s.transforms[k] if sh == shape else None for s, sh in zip(steps, shapes, strict=True)]
                links.append(kind.stack(rows, device))
        momentum = Momentum.stack([s.momentum for s in steps], device)
        return cls(links, momentum, [s.lr[0] for s in steps], device,
                   adam=[s.adam_rows[0] for s in steps], t=steps[0].t)

    def select(self, keep: Sequence[int], device: Device = None) -> LocalStep:
        """The chain of the rows `keep` (the clients still stepping), in that order."""
        return LocalStep(
            [t.select(keep, device) for t in self.transforms], self.momentum.select(keep, device),
            [self.lr[k] for k in keep], device, adam=[self.adam_rows[k] for k in keep], t=self.t,
        )


__all__ = [
    "Adam", "AdamRow", "ClientOptimizer", "Correction", "Custom", "GradTransform", "LocalStep",
    "Momentum", "Proximal", "SGDConfig", "Scale", "Transform", "WeightDecay", "adam_row",
]
