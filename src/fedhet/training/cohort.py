"""Stacked local SGD for a cohort of clients: `C` flat parameter vectors as one `(C, d)` tensor.

`CohortTrainer.sgd_many(jobs)` runs several `LocalTrainer.sgd` calls side by side and returns
what each would have returned. Per step it takes every active client's next mini-batch, computes
all mini-batch gradients in one call, then applies each client's weight decay, its own
`transform(g, w, step)` and `on_step(step, w, g, loss)` on row views `g[c]`, `w[c]` (the same
live-buffer contract as the sequential loop), the per-client momentum buffers (stacked), and
the step. Clients whose batch stream ends earlier simply leave the active set (unequal `τ` is
exact, not padded). Clients whose mini-batches differ in size (`min(B, n_i)`) are grouped by
size within a step, so no loss is padded or reweighted.

Gradients come from `torch.func.vmap(grad(loss))` over `functional_call` of the shared module
(the module's own `objective`, evaluated inside the functional call so that a loss that reads
the module's weights, the squared SVM's `λ‖w‖²`, sees the client's weights). BatchNorm running
statistics are per client: the stacked buffers go in with the parameters and the new running
mean and (unbiased) variance are computed from each BatchNorm input seen by a forward pre-hook,
with the module's own momentum, because the in-place update inside `vmap(grad(...))` does not
reach the caller. For the two linear models (`LogisticRegression`, `SquaredSVM`) a closed-form
batched gradient (`bmm`) replaces `vmap`.

Not covered here (the executor runs these clients sequentially): a custom `loss_fn` (MOON) and
modules with dropout (their randomness would differ from the sequential stream).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from fedhet.models.linear import LogisticRegression, SquaredSVM
from fedhet.models.registry import objective
from fedhet.training.flat import FlatModel
from fedhet.training.local import GradTransform, SGDConfig, StepHook


@dataclass
class SGDJob:
    """One parked `LocalTrainer.sgd` call."""

    w0: torch.Tensor
    batches: Iterator[torch.Tensor]
    cfg: SGDConfig
    transform: GradTransform | None = None
    on_step: StepHook | None = None
    buffers: torch.Tensor | None = None
    """The client's BatchNorm running statistics before the call (flat; updated per step)."""
    result: tuple[torch.Tensor, int, float] | None = None
    error: BaseException | None = None
    buffers_out: torch.Tensor | None = field(default=None, repr=False)


@dataclass
class GradJob:
    """One parked `LocalTrainer.full_gradient` call."""

    params: torch.Tensor
    indices: torch.Tensor
    chunk: int = 1024
    max_batches: int = 0
    result: torch.Tensor | None = None
    error: BaseException | None = None


FULL_GRADIENT_SAMPLES = 16384
"""**[choice]** Samples in one stacked full-gradient call (clients × chunk), so that a cohort of
100 CNN clients does not push 100 × 1024 images through the model at once."""


def unsupported_reason(module: nn.Module) -> str | None:
    """Why `module` cannot be trained stacked (the executor then runs it sequentially)."""
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd | nn.AlphaDropout):
            return f"{type(m).__name__} draws per-client randomness"
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is None:
            return "BatchNorm with momentum=None (cumulative average) is not stacked"
    return None


class _WithObjective(nn.Module):
    """`forward(x, y) = objective(inner, inner(x), y)` so the loss runs inside `functional_call`."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return objective(self.inner, self.inner(x), y)


class CohortTrainer:
    """Stacked SGD over the shared `FlatModel` (its parameter layout, its module)."""

    def __init__(
        self, model: FlatModel, x: torch.Tensor, y: torch.Tensor, chunk: int = 0,
        log: Callable[[str], None] = print,
    ) -> None:
        self.model = model
        self.x = x
        self.y = y
        self.chunk = chunk
        self.log = log
        module = model.module
        self.linear = type(module) in (LogisticRegression, SquaredSVM)
        self.wrapper = _WithObjective(module)
        self.param_names = [f"inner.{layer.name}" for layer in model.layers]
        self.param_slices = [(layer.start, layer.stop, layer.shape) for layer in model.layers]
        named_float = [(n, b) for n, b in module.named_buffers() if b.is_floating_point()]
        self.buffer_specs = []
        offset = 0
        for name, b in named_float:
            self.buffer_specs.append((f"inner.{name}", offset, offset + b.numel(), tuple(b.shape)))
            offset += b.numel()
        self.norms = {
            f"inner.{name}": m for name, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        }
        self._vgrad = vmap(grad(self._loss, has_aux=True), in_dims=(0, 0, 0, 0, None))

    # -- gradients --------------------------------------------------------------------------
    def _loss(self, ws, bufs, x, y, fixed):
        tensors = dict(zip(self.param_names, ws, strict=True))
        tensors.update(fixed)
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            m.register_forward_pre_hook(lambda _m, args, name=name: seen.__setitem__(name, args[0].detach()))
            for name, m in self.norms.items()
        ]
        # Batch statistics only inside the transform (no in-place running-stat update, which
        # vmap(grad(...)) handles badly); the running statistics are updated below instead.
        for m in self.norms.values():
            m.track_running_stats = False
        try:
            loss = functional_call(self.wrapper, tensors, (x, y))
        finally:
            for h in hooks:
                h.remove()
            for m in self.norms.values():
                m.track_running_stats = True
        parts = []
        for name, a, b, _shape in self.buffer_specs:
            owner, _, kind = name.rpartition(".")
            old = bufs[a:b]
            if owner in seen and kind in ("running_mean", "running_var"):
                inp = seen[owner]
                dims = [0, *range(2, inp.dim())]
                stat = inp.mean(dims) if kind == "running_mean" else inp.var(dims, unbiased=True)
                m = self.norms[owner].momentum
                old = old * (1 - m) + stat * m
            parts.append(old.flatten())
        new_bufs = torch.cat(parts) if parts else bufs
        return loss, (loss.detach(), new_bufs)

    def gradients(
        self, w: torch.Tensor, bufs: torch.Tensor, batch: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mini-batch gradients `(G, d)`, losses `(G,)` and new buffers for stacked `w`, batches
        `(G, b)` of indices (all of one size)."""
        x, y = self.x[batch], self.y[batch]
        if self.linear:
            g, loss = self._linear_gradients(w, x, y)
            return g, loss, bufs
        fixed = {
            f"inner.{n}": b.clone() for n, b in self.model.module.named_buffers()
            if not b.is_floating_point()
        }
        n = w.shape[0]
        ws = tuple(w[:, a:b].view(n, *s) for a, b, s in self.param_slices)
        gs, (loss, new_bufs) = self._vgrad(ws, bufs, x, y, fixed)
        return torch.cat([g.reshape(n, -1) for g in gs], dim=1), loss, new_bufs

    def _linear_gradients(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
        """Closed-form gradients for `fc.weight (k, D)`, `fc.bias (k,)` stacked per client."""
        module = self.model.module
        fc = module.fc
        k, dim_in = fc.weight.shape
        n_clients, b = y.shape
        xf = x.reshape(n_clients, b, dim_in)
        weight = w[:, : k * dim_in].view(n_clients, k, dim_in)
        bias = w[:, k * dim_in : k * dim_in + k]
        scores = torch.baddbmm(bias.unsqueeze(1), xf, weight.transpose(1, 2))  # (C, b, k)
        if isinstance(module, SquaredSVM):
            s = scores.squeeze(2)
            sign = 2.0 * y.to(s.dtype) - 1.0
            hinge = torch.clamp(1.0 - sign * s, min=0.0)
            reg = 0.5 * module.lam * weight.pow(2).sum(dim=(1, 2))
            loss = reg + 0.5 * hinge.pow(2).mean(dim=1)
            dscore = (-sign * hinge / b).unsqueeze(2)  # (C, b, 1)
            g_w = torch.bmm(dscore.transpose(1, 2), xf) + module.lam * weight
        else:
            logp = F.log_softmax(scores, dim=2)
            loss = -logp.gather(2, y.unsqueeze(2)).squeeze(2).mean(dim=1)
            dscore = logp.exp()
            dscore.scatter_add_(2, y.unsqueeze(2), torch.full_like(dscore[..., :1], -1.0))
            dscore.div_(b)
            g_w = torch.bmm(dscore.transpose(1, 2), xf)
        g_b = dscore.sum(dim=1)
        return torch.cat([g_w.reshape(n_clients, -1), g_b], dim=1), loss

    # -- SGD --------------------------------------------------------------------------------
    def sgd_many(self, jobs: list[SGDJob]) -> None:
        """Run every job (results and errors are stored on the jobs), `chunk` at a time; on a
        CUDA out-of-memory error in a chunk's first step, retry it with half the chunk."""
        chunk = self.chunk if self.chunk > 0 else len(jobs)
        start = 0
        while start < len(jobs):
            part = jobs[start : start + chunk]
            try:
                self._run(part)
            except _FirstStepOOMError:
                if chunk == 1:
                    raise
                chunk = max(1, chunk // 2)
                self.log(
                    f"cohort: CUDA out of memory with {len(part)} clients stacked; retrying with {chunk}"
                )
                if self.x.is_cuda:
                    torch.cuda.empty_cache()
                continue
            start += len(part)

    def full_gradients(self, jobs: list[GradJob]) -> None:
        """Every job's `LocalTrainer.full_gradient`, `∇F_i(w_i) = (1/D_i) Σ_j ∇f(w_i; x_j)` over
        its indices in chunks: the jobs' `p`-th chunks are stacked (equal sizes in one call, at
        most `FULL_GRADIENT_SAMPLES` samples per call) and each row accumulates
        `Σ |chunk| · ∇f̄(chunk)` as the sequential pass does. Results (or the error) go on the
        jobs. Models without BatchNorm only (`stacks_full_gradients`)."""
        if not jobs:
            return
        try:
            self._full_gradients(jobs)
        except Exception as e:  # noqa: BLE001  (reported on every job, as in sgd_many)
            for job in jobs:
                job.error = e

    def _full_gradients(self, jobs: list[GradJob]) -> None:
        device = self.model.params.device
        w = torch.stack([j.params.to(device) for j in jobs])
        total = torch.zeros_like(w)
        seen = [0] * len(jobs)
        chunks = [_chunks(j) for j in jobs]
        no_bufs = torch.zeros(len(jobs), 0, device=device)
        module = self.model.module
        was_training = module.training
        module.eval()
        try:
            self._accumulate(w, total, seen, chunks, no_bufs)
        finally:
            module.train(was_training)
        for c, job in enumerate(jobs):
            job.result = total[c].div(max(seen[c], 1))

    def _accumulate(self, w, total, seen, chunks, no_bufs) -> None:
        device = w.device
        for pos in range(max(len(c) for c in chunks)):
            by_size: dict[int, list[int]] = {}
            for c, cs in enumerate(chunks):
                if pos < len(cs):
                    by_size.setdefault(len(cs[pos]), []).append(c)
            for size, members in by_size.items():
                per_call = max(1, FULL_GRADIENT_SAMPLES // size)
                for a in range(0, len(members), per_call):
                    part = members[a : a + per_call]
                    ix = torch.tensor(part, device=device)
                    idx = torch.stack([chunks[c][pos] for c in part]).to(self.x.device)
                    g, _, _ = self.gradients(w.index_select(0, ix), no_bufs[: len(part)], idx)
                    total.index_copy_(0, ix, total.index_select(0, ix).add_(g, alpha=size))
                    for c in part:
                        seen[c] += size

    def _run(self, jobs: list[SGDJob]) -> None:
        n = len(jobs)
        model = self.model
        model.module.train()
        device = model.params.device
        w = torch.stack([j.w0.to(device) for j in jobs])
        has_bufs = model.buffers.numel() > 0
        bufs = (
            torch.stack([(j.buffers if j.buffers is not None else model.buffers).to(device) for j in jobs])
            if has_bufs else torch.zeros(n, 0, device=device)
        )
        lrs = [j.cfg.lr for j in jobs]
        moms = [j.cfg.momentum for j in jobs]
        wds = [j.cfg.weight_decay for j in jobs]
        momentum = any(moms)
        vel = torch.zeros_like(w) if momentum else None
        steps = [0] * n
        loss_sums = [0.0] * n
        alive = list(range(n))
        iters = {c: jobs[c].batches for c in alive}
        first = True
        while alive:
            batches: dict[int, torch.Tensor] = {}
            for c in alive:
                try:
                    batches[c] = next(iters[c])
                except StopIteration:
                    pass
                except Exception as e:  # noqa: BLE001  (a client's batch stream failed)
                    jobs[c].error = e
            active = [c for c in alive if c in batches]
            alive = active
            if not active:
                break
            ix_all = len(active) == n
            ix = None if ix_all else torch.tensor(active, device=device)
            wa = w if ix_all else w.index_select(0, ix)
            ba = bufs if ix_all else bufs.index_select(0, ix)
            g = torch.empty_like(wa)
            loss = torch.empty(len(active), device=device)
            new_b = torch.empty_like(ba)
            groups: dict[int, list[int]] = {}
            for pos, c in enumerate(active):
                groups.setdefault(len(batches[c]), []).append(pos)
            try:
                for members in groups.values():
                    idx = torch.stack([batches[active[p]] for p in members]).to(self.x.device)
                    if len(members) == len(active):
                        g_, l_, b_ = self.gradients(wa, ba, idx)
                        g.copy_(g_)
                        loss.copy_(l_)
                        new_b.copy_(b_)
                    else:
                        pix = torch.tensor(members, device=device)
                        g_, l_, b_ = self.gradients(wa.index_select(0, pix), ba.index_select(0, pix), idx)
                        g.index_copy_(0, pix, g_)
                        loss.index_copy_(0, pix, l_)
                        new_b.index_copy_(0, pix, b_)
            except torch.cuda.OutOfMemoryError as e:
                if first:
                    for c in active:  # put the fetched batches back for the retry
                        iters[c] = itertools.chain([batches[c]], iters[c])
                        jobs[c].batches = iters[c]
                    raise _FirstStepOOMError from e
                raise
            first = False
            losses = loss.tolist()
            _add_scaled(g, wa, [wds[c] for c in active])  # weight decay: g += λ w
            failed = []
            for pos, c in enumerate(active):
                job = jobs[c]
                if job.transform is None and job.on_step is None:
                    continue
                try:
                    if job.transform is not None:
                        out = job.transform(g[pos], wa[pos], steps[c])
                        if out is not g[pos] and out.data_ptr() != g[pos].data_ptr():
                            g[pos].copy_(out)
                    if job.on_step is not None:
                        job.on_step(steps[c], wa[pos], g[pos], losses[pos])
                except Exception as e:  # noqa: BLE001  (one client's hook failed: drop it)
                    job.error = e
                    failed.append(c)
            if momentum:
                va = vel if ix_all else vel.index_select(0, ix)
                if len(set(moms)) == 1:
                    va.mul_(moms[0]).add_(g)
                else:
                    va.mul_(torch.tensor([moms[c] for c in active], device=device).unsqueeze(1)).add_(g)
                step_dir = va
            else:
                step_dir = g
            _add_scaled(wa, step_dir, [-lrs[c] for c in active])  # w -= η d
            if ix_all:
                bufs.copy_(new_b)
            else:
                w.index_copy_(0, ix, wa)
                bufs.index_copy_(0, ix, new_b)
                if momentum:
                    vel.index_copy_(0, ix, va)
            for pos, c in enumerate(active):
                steps[c] += 1
                loss_sums[c] += losses[pos]
            if failed:
                alive = [c for c in alive if c not in failed]
        for c, job in enumerate(jobs):
            if job.error is None:
                job.result = (w[c].clone(), steps[c], loss_sums[c] / max(steps[c], 1))
                job.buffers_out = bufs[c].clone() if has_bufs else None


def stacks_full_gradients(model: FlatModel) -> bool:
    """Whether `CohortTrainer.full_gradients` computes this model's full gradients stacked: not
    with BatchNorm, whose eval-mode pass reads each client's own running statistics (those
    clients' full gradients run one at a time on the shared model)."""
    return model.buffers.numel() == 0


def _add_scaled(y: torch.Tensor, x: torch.Tensor, coefs: list[float]) -> None:
    """`y[i] += coefs[i] x[i]` row by row, with the arithmetic of `add_(alpha=...)` for every
    row whatever the other rows' coefficients, so a client (or a run in a batch of runs with
    other learning rates or weight decays) gets the same bits as when stacked alone."""
    values = set(coefs)
    if len(values) == 1:
        if coefs[0]:
            y.add_(x, alpha=coefs[0])
        return
    for value in values:
        if not value:
            continue
        ix = torch.tensor([i for i, c in enumerate(coefs) if c == value], device=y.device)
        y.index_copy_(0, ix, y.index_select(0, ix).add_(x.index_select(0, ix), alpha=value))


def _chunks(job: GradJob) -> list[torch.Tensor]:
    """The index chunks `LocalTrainer.full_gradient` walks for `job`."""
    chunks = [job.indices[a : a + job.chunk] for a in range(0, len(job.indices), job.chunk)]
    return chunks[: job.max_batches] if job.max_batches else chunks


class _FirstStepOOMError(Exception):
    pass


__all__ = ["CohortTrainer", "GradJob", "SGDJob", "stacks_full_gradients", "unsupported_reason"]
