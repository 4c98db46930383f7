"""Stacked local SGD for a cohort of clients: `C` flat parameter vectors as one `(C, d)` tensor.

`CohortTrainer.sgd_many(jobs)` runs several `LocalTrainer.sgd` calls side by side and returns
what each would have returned (the jobs: `fedhet.training.jobs`; the stack's rows, its batch
table and hook groups: `fedhet.training.rows`; a job handed in as another leaves takes a row at
once, `next_jobs`; on CUDA the step is replayed from a graph where it can be,
`fedhet.training.graphs`; stacked evaluation: `fedhet.training.scoring`). Per step it takes
every active client's next mini-batch (when every client's stream is a `BatchSchedule`, all of
them were drawn once, as one table on the device), computes all mini-batch gradients in one
call, then runs the local step's chain (`fedhet.training.steps`) once for the whole stack: the
clients' chains, `LocalStep.of(cfg, transforms)` each, are stacked into one with per-row
coefficients and stacked anchors and shifts, so weight decay, FedProx's proximal term,
SCAFFOLD's correction, momentum and the step are one tensor operation each, and each row gets
the bits it gets alone. The `on_step` hooks
that are `StackableHook`s (`fedhet.training.hooks`: BHerd's gradient store, GraB's balancing,
FedVeca's estimates) run once per step for all the clients whose hooks are of one class, on
their rows of the stack; only a `Custom` transform and any other `on_step(step, w, g, loss)`
hook run per client, on row views `g[r]`, `w[r]` (the same live-buffer contract as the
sequential loop). Clients whose batch stream ends earlier leave the stack (their rows of the
parameters, buffers, momentum, chain and hooks are dropped; unequal `τ` is exact, not padded).
Clients whose mini-batches differ in size (`min(B, n_i)`) are grouped by size within a step, so
no loss is padded or reweighted.

The losses are summed on the device and read when a client leaves the stack, so a step makes
no host synchronisation (unless a client's own `on_step` hook wants its loss as a number).

Gradients come from the model's stacked program (`fedhet.training.program`: a sequence of known
layers as a few stacked operations) where it has one, else from `torch.func.vmap(grad(loss))`
over `functional_call` of the shared module (the module's own `objective`, evaluated inside the
functional call so that a loss that reads the module's weights, the squared SVM's `λ‖w‖²`,
sees the client's weights). BatchNorm running
statistics are per client: the stacked buffers go in with the parameters and the new running
mean and (unbiased) variance are computed from each BatchNorm input seen by a forward pre-hook,
with the module's own momentum, because the in-place update inside `vmap(grad(...))` does not
reach the caller. For the two linear models (`LogisticRegression`, `SquaredSVM`) a closed-form
stacked gradient (`bmm`) replaces `vmap`.

A replacement objective that is a `StackableLoss` (`fedhet.training.losses`: MOON's
`CE + μ ℓ_con`) is stacked too: its targets are vmapped over the rows' frozen models and its
gradient over their parameters, rows grouped by the loss's key. Not covered here (the executor
runs these clients sequentially): any other `loss_fn`, and modules with dropout (their
randomness would differ from the sequential stream). A module whose forward `torch.func` cannot
transform at all is found by `check_stackable`, a one-row probe the stacked executor runs first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from fedhet.errors import FedhetError
from fedhet.models.linear import LogisticRegression, SquaredSVM
from fedhet.models.registry import objective
from fedhet.training.flat import FlatModel
from fedhet.training.graphs import StepGraphs, capturable, not_captured
from fedhet.training.jobs import (
    Continue,
    EvalJob,
    GradJob,
    Objective,
    SGDJob,
    joinable,
    next_batches,
    objective_key,
    shared_objective,
    stacked_frozen,
)
from fedhet.training.losses import StackableLoss
from fedhet.training.program import StackedProgram
from fedhet.training.rows import BatchTable, HookGroup, Rows, rows_that_fit, stack_hooks
from fedhet.training.scoring import evaluate_many, stacks_evaluation

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


class _WithLoss(nn.Module):
    """`forward(x, y, targets) = loss.loss(inner, x, y, targets)` for a `StackableLoss`."""

    def __init__(self, inner: nn.Module, loss: StackableLoss) -> None:
        super().__init__()
        self.inner = inner
        self.stackable = loss

    def forward(self, x: torch.Tensor, y: torch.Tensor, targets: tuple) -> torch.Tensor:
        return self.stackable.loss(self.inner, x, y, targets)


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
        self.program = None if self.linear else StackedProgram.of(model, tuple(x.shape[1:]))
        """The model's forward as a few stacked operations (`fedhet.training.program`), or None:
        its gradients then come from `vmap`."""
        self.graphs = StepGraphs(self.program, x, y, log) \
            if self.program is not None and capturable(self.program, model.precision, x) else None
        """Steps replayed from a captured CUDA graph where the step is a pure tensor program
        (`fedhet.training.graphs`), or None."""

    def check_stackable(self) -> None:
        """Raise one `FedhetError` line when the model cannot run under `torch.func` (a forward
        with data-dependent Python control flow, `.item()`, in-place updates of buffers, a layer
        `vmap` does not support), telling the user to run it with the sequential executor.

        The probe is one stacked gradient of one row on the first two training samples (the
        closed-form linear models skip it); a model whose plain forward fails as well is left to
        fail as it would sequentially. Random state and BatchNorm statistics are left as they were.
        """
        if self.linear or len(self.y) == 0:
            return
        model = self.model
        idx = torch.arange(min(2, len(self.y)), device=self.x.device)
        w = model.params.unsqueeze(0)
        bufs = model.buffers.unsqueeze(0) if model.buffers.numel() else torch.zeros(1, 0, device=w.device)
        was_training = model.module.training
        saved = model.buffers.clone()
        model.module.train()
        try:
            with torch.random.fork_rng(devices=[]):
                try:
                    self.gradients(w, bufs, idx.unsqueeze(0))
                except Exception as e:  # noqa: BLE001  (torch.func's error, turned into one line)
                    if self._plain_forward_works(idx):
                        raise FedhetError(
                            f"the model ({type(model.module).__name__}) cannot run stacked: "
                            f"torch.func raised {_first_sentence(e)}; run it with executor="
                            "sequential (--executor sequential, or executor = \"sequential\" in a "
                            "settings file)"
                        ) from None
        finally:
            model.module.train(was_training)
            model.buffers.copy_(saved)

    def _plain_forward_works(self, idx: torch.Tensor) -> bool:
        """Whether the module's own forward and objective run on the samples `idx`."""
        module = self.model.module
        try:
            with torch.no_grad():
                objective(module, module(self.x[idx]), self.y[idx])
        except Exception:  # noqa: BLE001
            return False
        return True

    # -- gradients --------------------------------------------------------------------------
    def _loss(self, ws, bufs, x, y, fixed, targets=(), wrapper=None):
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
            if wrapper is None:
                loss = functional_call(self.wrapper, tensors, (x, y))
            else:
                loss = functional_call(wrapper, tensors, (x, y, targets))
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
                momentum = self.norms[owner].momentum
                assert momentum is not None  # cumulative averages run sequentially (docs/gpu.md)
                old = old * (1 - momentum) + stat * momentum
            parts.append(old.flatten())
        new_bufs = torch.cat(parts) if parts else bufs
        return loss, (loss.detach(), new_bufs)

    def gradients(
        self, w: torch.Tensor, bufs: torch.Tensor, batch: torch.Tensor,
        loss: StackableLoss | None = None, frozen: tuple[torch.Tensor, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mini-batch gradients `(G, d)`, losses `(G,)` and new buffers for stacked `w`, batches
        `(G, b)` of indices (all of one size). `loss` (with the rows' stacked `frozen` vectors,
        `(G, d)` each) replaces the model's objective for every row. The passes run in the model's
        precision (`FlatModel.passes`); gradients, losses and buffers come back float32."""
        if self.program is not None and (loss is None or self.program.runs(loss)):
            g, loss_values = self.program.gradients(w, self.x, self.y, batch, loss, frozen)
            return g, loss_values, bufs
        x, y = self.x[batch], self.y[batch]
        if self.linear and loss is None:
            with self.model.passes():
                g, loss_values = self._linear_gradients(w, x, y)
            return g.float(), loss_values.float(), bufs
        fixed = {
            f"inner.{n}": b.clone() for n, b in self.model.module.named_buffers()
            if not b.is_floating_point()
        }
        n = w.shape[0]
        ws = tuple(w[:, a:b].view(n, *s) for a, b, s in self.param_slices)
        if loss is None:
            with self.model.passes():
                gs, (loss_values, new_bufs) = self._vgrad(ws, bufs, x, y, fixed)
        else:
            module = self.model.module
            with torch.no_grad(), self.model.passes():
                targets = vmap(lambda xr, *fr: loss.targets(module, xr, *fr))(x, *frozen)
            step = partial(self._loss, wrapper=_WithLoss(module, loss))
            vgrad = vmap(grad(step, has_aux=True), in_dims=(0, 0, 0, 0, None, 0))
            with self.model.passes():
                gs, (loss_values, new_bufs) = vgrad(ws, bufs, x, y, fixed, targets)
        g = torch.cat([g.reshape(n, -1) for g in gs], dim=1)
        return g, loss_values.float(), new_bufs.to(bufs.dtype)

    def _linear_gradients(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
        """Closed-form gradients for `fc.weight (k, D)`, `fc.bias (k,)` stacked per client (a
        model without a bias, e.g. `svm` with `model.bias=false`: the weight's only)."""
        module = self.model.module
        fc = module.fc
        assert isinstance(fc, nn.Linear)  # the linear models' one layer (`self.linear`)
        k, dim_in = fc.weight.shape
        n_clients, b = y.shape
        xf = x.reshape(n_clients, b, dim_in)
        weight = w[:, : k * dim_in].view(n_clients, k, dim_in)
        if fc.bias is None:
            scores = torch.bmm(xf, weight.transpose(1, 2))  # (C, b, k)
        else:
            bias = w[:, k * dim_in : k * dim_in + k]
            scores = torch.baddbmm(bias.unsqueeze(1), xf, weight.transpose(1, 2))
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
        if fc.bias is None:
            return g_w.reshape(n_clients, -1), loss
        return torch.cat([g_w.reshape(n_clients, -1), dscore.sum(dim=1)], dim=1), loss

    # -- SGD --------------------------------------------------------------------------------
    def sgd_many(self, jobs: list[SGDJob], next_jobs: Continue | None = None) -> None:
        """Run every job (results and errors are stored on the jobs), `chunk` at a time; on a
        CUDA out-of-memory error in a chunk's first step, retry it with half the chunk.

        `next_jobs` (`fedhet.training.jobs.Continue`) is called with the jobs that leave the
        stack, as they leave; the jobs it returns join the running stack where `joinable` (a
        ring's next hop trains on in the row its predecessor left, with no call in between)
        and are left unfinished otherwise."""
        chunk = self.chunk if self.chunk > 0 else len(jobs)
        start = 0
        while start < len(jobs):
            part = jobs[start : start + chunk]
            try:
                self._run(part, next_jobs)
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

    def evaluate_many(self, jobs: list[EvalJob]) -> None:
        """Every job's `evaluate`, the jobs that score on the same samples stacked
        (`fedhet.training.scoring.evaluate_many`); results or errors on the jobs."""
        evaluate_many(self, jobs)

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

    def _run(self, jobs: list[SGDJob], next_jobs: Continue | None = None) -> None:
        """Step the jobs' clients together (`Rows`: row `r` trains job `rows[r]`, `t` steps into
        the call). A job leaves the stack when its batches run out or it fails; `next_jobs`
        then hands in what its client does next, which joins at step `t` when every stream is
        a `BatchTable`'s (`joinable`, `BatchTable.fits`)."""
        self.model.module.train()
        run = self._start(list(jobs), next_jobs)
        stack, schedule = run.stack, run.schedule
        t = 0
        while stack.rows:
            batches: list[torch.Tensor] | torch.Tensor
            if schedule is not None:
                keep = [r for r, c in enumerate(stack.rows)
                        if run.jobs[c].error is None and t < schedule.ends[c]]
            else:
                batches, keep = next_batches(run.jobs, stack.rows)
            if len(keep) < len(stack.rows):
                self._turnover(run, keep, t)
                if schedule is not None:
                    continue  # the joined rows may have no step to take
                if not stack.rows:
                    break
            if schedule is not None:
                batches = schedule.batches(t)
                if run.graphs is not None and self._replayed(run, batches, t):
                    t += 1
                    continue
            self._eager_step(run, batches, t)
            t += 1

    def _start(self, jobs: list[SGDJob], next_jobs: Continue | None) -> _Pass:
        """The stack of `jobs` and what steps it: hook groups, schedule, captured graphs."""
        stack = Rows(jobs, self.model, self.model.params.device)
        try:
            groups = stack_hooks(jobs)
        except torch.cuda.OutOfMemoryError as e:
            raise _FirstStepOOMError from e
        stacked = {c for group in groups for c in group.jobs}
        hooked = any(j.on_step is not None and c not in stacked for c, j in enumerate(jobs))
        schedule = BatchTable.of(jobs, self.x.device)
        graphs = self.graphs
        if graphs is not None:
            assert self.program is not None  # graphs are made only for a program
            why = not_captured(self.program, jobs, bool(groups) or hooked, stack.has_bufs)
            if why is not None:
                graphs.note(why)
            if why is not None or schedule is None:
                graphs = None
        return _Pass(jobs, stack, groups, stacked, hooked, schedule, graphs, next_jobs)

    def _replayed(self, run: _Pass, batches: torch.Tensor, t: int) -> bool:
        """Step `t` of the stack through its captured graph (`StepGraphs.step`) where its rows
        share one objective; False when it is to be taken eagerly."""
        assert run.graphs is not None and run.schedule is not None
        if run.objective is None:
            run.objective = shared_objective([run.jobs[c] for c in run.stack.rows], run.frozen)
        if isinstance(run.objective, str):
            run.graphs.note(run.objective)
            return False
        loss, frozen = run.objective
        return run.graphs.step(run.stack, batches, partial(run.schedule.steps_left, run.stack.rows, t),
                               loss, frozen)

    @staticmethod
    def _turnover(run: _Pass, keep: list[int], t: int) -> None:
        """The rows not in `keep` leave the stack (and their hook groups); what `next_jobs`
        hands in for their clients joins at step `t` where it fits the schedule."""
        stack, schedule = run.stack, run.schedule
        if run.graphs is not None:
            run.graphs.flush(stack)
        gone = stack.leave(keep, t)
        run.frozen.clear()  # stacked for the rows that were
        run.objective = None
        kept = set(stack.rows)
        for group in run.groups:
            group.leave([c for c in group.jobs if c not in kept], t, run.jobs)
        if schedule is not None:
            schedule.select(keep)
        after = run.next_jobs(gone) if run.next_jobs is not None else []
        if schedule is not None:
            joining = [j for j in after if joinable(j) and schedule.fits(j)]
            if joining:
                stack.join(joining, t)
                schedule.add(joining, t)

    def _eager_step(self, run: _Pass, batches: list[torch.Tensor] | torch.Tensor, t: int) -> None:
        """One stacked step `t` on `batches`, operation by operation: the gradients, the
        chain's corrections, the hooks, the update and the loss sums."""
        stack, jobs = run.stack, run.jobs
        w = stack.w
        try:
            g, loss, stack.bufs = self._gradients(w, stack.bufs, batches,
                                                  [jobs[c] for c in stack.rows], run.frozen)
        except torch.cuda.OutOfMemoryError as e:
            if t == 0 and not (run.next_jobs is not None and stack.left):  # no client moved on
                if run.schedule is None:  # put them back for the retry (a schedule was not read)
                    for c, batch in zip(stack.rows, batches, strict=True):
                        jobs[c].batches = itertools.chain([batch], jobs[c].batches)
                raise _FirstStepOOMError from e
            raise
        g = stack.chain.gradient(g, w, t)
        for r, error in stack.chain.failures():
            jobs[stack.rows[r]].error = error
        for group in run.groups:
            group.step(t, w, g, stack.rows, jobs)
        if run.hooked:
            self._row_hooks(t, w, g, loss, stack.rows, jobs, run.stacked)
        stack.chain.update(w, g, stack.v)
        stack.add_losses(loss)

    @staticmethod
    def _row_hooks(t: int, w: torch.Tensor, g: torch.Tensor, loss: torch.Tensor, rows: list[int],
                   jobs: list[SGDJob], stacked: set[int]) -> None:
        """The `on_step(step, w, g, loss)` hooks that are not stacked, row by row (a hook that
        raises fails its client)."""
        losses = loss.tolist()
        for r, c in enumerate(rows):
            job = jobs[c]
            if job.on_step is None or job.error is not None or c in stacked:
                continue
            try:
                job.on_step(t, w[r], g[r], losses[r])
            except Exception as e:  # noqa: BLE001  (one client's hook failed: drop it)
                job.error = e

    def _gradients(
        self, w: torch.Tensor, bufs: torch.Tensor, batches: list[torch.Tensor] | torch.Tensor,
        jobs: list[SGDJob], frozen: dict[tuple, tuple[torch.Tensor, ...]],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`gradients` for one batch per row (`jobs[r]` is row `r`'s job; `batches` a list, or
        one `(rows, b)` tensor), rows grouped by batch size (no padding) and by objective (the
        model's, or a `StackableLoss` key)."""
        sizes = [batches.shape[1]] * len(jobs) if isinstance(batches, torch.Tensor) \
            else [len(b) for b in batches]
        keys = [(n, objective_key(j)) for n, j in zip(sizes, jobs, strict=True)]
        if len(set(keys)) == 1:
            return self._group_gradients(w, bufs, batches, jobs, frozen)
        g = torch.empty_like(w)
        loss = torch.empty(len(batches), device=w.device)
        new_b = torch.empty_like(bufs)
        for key in dict.fromkeys(keys):
            members = [r for r, k in enumerate(keys) if k == key]
            pix = torch.tensor(members, device=w.device)
            g_, l_, b_ = self._group_gradients(
                w.index_select(0, pix), bufs.index_select(0, pix), [batches[r] for r in members],
                [jobs[r] for r in members], frozen,
            )
            g.index_copy_(0, pix, g_)
            loss.index_copy_(0, pix, l_)
            new_b.index_copy_(0, pix, b_)
        return g, loss, new_b

    def _group_gradients(self, w, bufs, batches, jobs, frozen):
        """`gradients` for rows of one batch size and one objective."""
        idx = batches if isinstance(batches, torch.Tensor) else torch.stack(batches).to(self.x.device)
        loss = jobs[0].loss
        if loss is None:
            return self.gradients(w, bufs, idx)
        return self.gradients(w, bufs, idx, loss, stacked_frozen(frozen, jobs))


def stacks_full_gradients(model: FlatModel) -> bool:
    """Whether `CohortTrainer.full_gradients` computes this model's full gradients stacked: not
    with BatchNorm, whose eval-mode pass reads each client's own running statistics (those
    clients' full gradients run one at a time on the shared model)."""
    return model.buffers.numel() == 0


def _chunks(job: GradJob) -> list[torch.Tensor]:
    """The index chunks `LocalTrainer.full_gradient` walks for `job`."""
    chunks = [job.indices[a : a + job.chunk] for a in range(0, len(job.indices), job.chunk)]
    return chunks[: job.max_batches] if job.max_batches else chunks


def _first_sentence(error: BaseException) -> str:
    """`Type: the first sentence of the message` (torch.func's messages run on for lines)."""
    text = " ".join(str(error).split())
    head = text.split(". ", 1)[0].rstrip(".")
    return f"{type(error).__name__}: {head}" if head else type(error).__name__


@dataclass
class _Pass:
    """One `CohortTrainer._run`: the jobs, their stack and what steps it."""

    jobs: list[SGDJob]
    stack: Rows
    groups: list[HookGroup]
    stacked: set[int]
    """Jobs whose hooks run stacked (in `groups`)."""
    hooked: bool
    """Some job has a hook that runs row by row."""
    schedule: BatchTable | None
    graphs: StepGraphs | None
    next_jobs: Continue | None
    frozen: dict[tuple, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    """Stacked `StackableLoss.frozen` vectors per (key, member jobs), while those rows last."""
    objective: Objective | None = None
    """The rows' shared objective for the graph (`CohortTrainer._objective`), while those rows
    last; None until asked."""


class _FirstStepOOMError(Exception):
    pass


__all__ = [
    "CohortTrainer", "EvalJob", "GradJob", "SGDJob", "rows_that_fit", "stacks_evaluation",
    "stacks_full_gradients", "unsupported_reason",
]
