"""The stacked step replayed from a captured CUDA graph: one launch a step instead of a few
hundred (`CohortTrainer.sgd_many` on a GPU).

A stacked step of the program (`fedhet.training.program`) and a plain chain issues ~200 small
kernels; on a GPU each launch costs the host a few microseconds, more than the kernel itself
for the papers' models, so a one-row ring walk (FedSR's ring-optimization: ~9,400 steps a
round) is launch-bound. `StepGraphs` captures one step (gradient, chain, update, the loss
added to a per-row sum) over fixed tensors, the rows' weights `w`, the chain's state `v`, the
batch `(R, b)` and the loss sums, then each step copies its batch in and replays the graph.

A stack whose rows share one replacement objective that the program runs (a `StackableLoss`
with a rows form, `StackedProgram.runs`: MOON's `CE + μ ℓ_con`, all rows of one
`(type(loss), loss.key)`) is captured the same way, its rows' stacked frozen vectors (MOON's
global and previous models, `(R, d)` each) held as captured tensors beside `w`; the loss's
Python numbers (μ, the temperature) are baked into the graph, which is why its key is part of
the signature.

The graph is captured again whenever the stack's signature changes (the rows, the batch size,
the chain's coefficients and anchors, the objective's type and key and the frozen stacks'
shapes: `signature`); a stack whose rows were replaced by rows of the same signature (a ring's
next hop: same η, ρ, λ; the next call's MOON clients: same μ and temperature) reuses it, its
new state (weights, momentum, frozen stacks) copied into the captured tensors. The first
capture of a cohort for each objective (the model's own, each replacement's class: a MOON
run's first round is the model's CE alone) **[choice]** is checked against the eager step from
the same state; a capture that raises or disagrees turns the graphs off for the cohort, with
one line, and the step runs eagerly as before.

Used only where the step is a pure tensor program: the stacked program on CUDA in fp32/tf32
(autocast's cache does not survive capture), plain SGD (Adam's bias corrections are Python
numbers of the step count), no `Custom` transform, no `on_step` hooks (they run on the host or
read the step count), no BatchNorm buffers (their statistics come from forward hooks), one
objective for the whole stack that the program runs (a replacement objective without a rows
form runs under `vmap` over a per-row closure; rows of several objectives are grouped on the
host), batches from a `BatchTable`. Where a stack is not captured for what its model, chain,
hooks or objective are, the cohort says so once for each reason **[choice]**
(`StepGraphs.note`: `cohort: steps run eagerly, not from a CUDA graph (…)`); on a CPU there
are no graphs and nothing is said. `FEDHET_CUDA_GRAPHS=0` turns them off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from fedhet.training.steps import Custom, LocalStep

if TYPE_CHECKING:
    from fedhet.training.jobs import SGDJob
    from fedhet.training.losses import StackableLoss
    from fedhet.training.program import StackedProgram
    from fedhet.training.rows import Rows

Replay = Callable[[], None]
Capture = Callable[[Callable[[], None]], Replay]
"""`capture(step) -> replay`: records `step` once (it may run it to warm up) and returns what
runs it again."""

WARMUP = 3
"""Eager runs of the step on a side stream before capture (cuBLAS and autograd set up their
workspaces there, as PyTorch's whole-network capture recipe asks)."""
MIN_STEPS = 16
"""**[choice]** A new capture (three warm-up steps and the recording, a few steps' time) is made
only for a stack that keeps its rows at least this many steps; a stack about to change (a star
round's clients leaving one by one) steps eagerly until it settles."""


def cuda_capture(step: Callable[[], None]) -> Replay:
    """Capture `step` as a CUDA graph (`torch.cuda.graph`) after `WARMUP` runs on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def enabled() -> bool:
    """Whether CUDA graphs may be used (`FEDHET_CUDA_GRAPHS` unset or not `0`)."""
    return os.environ.get("FEDHET_CUDA_GRAPHS", "1") != "0"


def signature(stack: Rows, batch: torch.Tensor, loss: StackableLoss | None = None,
              frozen: tuple[torch.Tensor, ...] = ()) -> tuple | None:
    """What a captured step depends on besides the values of `w`, `v`, the batch and the
    frozen stacks: the shapes, each link's coefficients and the anchors' and shifts' storage,
    the objective (`loss`'s type and key, which hold every Python number its rows form reads)
    and the frozen stacks' shapes and dtypes; None when the chain cannot be captured
    (`Custom`, Adam)."""
    chain = stack.chain
    if any(isinstance(t, Custom) for t in chain.transforms) or any(a is not None for a in chain.adam_rows):
        return None
    links = []
    for t in chain.transforms:
        coef = tuple(getattr(t, name).values for name in ("lam", "mu", "on") if hasattr(t, name))
        tensors = tuple(x.data_ptr() for x in (getattr(t, "anchor", None), getattr(t, "shift", None))
                        if x is not None)
        links.append((type(t).__name__, coef, tensors))
    v = None if stack.v is None else tuple(stack.v.shape)
    target = None if loss is None else (
        type(loss), loss.key, tuple((tuple(f.shape), f.dtype) for f in frozen))
    return (tuple(stack.w.shape), v, tuple(batch.shape), batch.dtype, tuple(links),
            chain.momentum.rho, chain.lr, target)


class StepGraphs:
    """One captured step at a time for a cohort (module doc)."""

    def __init__(self, program: StackedProgram, x: torch.Tensor, y: torch.Tensor,
                 log: Callable[[str], None], capture: Capture = cuda_capture) -> None:
        self.program = program
        self.x, self.y = x, y
        self.log = log
        self.capture = capture
        self.off = False
        """Set when a capture failed or disagreed: the cohort steps eagerly from then on."""
        self.checked: set[type | None] = set()
        """The objectives (None: the model's own; a replacement's class) whose first capture
        was checked against the eager step."""
        self.noted: set[str] = set()
        """The reasons for eager steps already said (`note`)."""
        self.key: tuple | None = None
        self.replay: Replay | None = None
        self.w: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.batch: torch.Tensor | None = None
        self.frozen: tuple[torch.Tensor, ...] = ()
        """The captured frozen stacks of a replacement objective (empty without one)."""
        self.losses: torch.Tensor | None = None
        """The captured per-row loss sums since the last `flush`."""
        self.chain: LocalStep | None = None
        """The chain the graph was captured with (its tensors must outlive the graph)."""
        self.loss: StackableLoss | None = None
        """The replacement objective the graph was captured with (None: the model's), kept
        with the chain for as long as the graph is."""

    def step(self, stack: Rows, batch: torch.Tensor, horizon: Callable[[], int],
             loss: StackableLoss | None = None, frozen: tuple[torch.Tensor, ...] = ()) -> bool:
        """One step of `stack` on `batch` through the graph (capturing it first when the
        signature is new and the stack keeps its rows for `horizon() ≥ MIN_STEPS` more steps,
        asked only then); False when the graphs are off or this step is not captured (the
        caller then steps eagerly). `loss` is the rows' shared replacement objective (one the
        program runs) and `frozen` its rows' stacked frozen vectors, which belong to the rows:
        they change only when the rows do (`stack.w` is then another tensor). `stack.w` and
        `stack.v` become the captured tensors."""
        if self.off:
            return False
        key = signature(stack, batch, loss, frozen)
        if key is None:
            self.note("Adam or a custom transform in the local step")
            return False
        if key != self.key:
            if horizon() < MIN_STEPS:
                return False
            self.flush(stack)
            if not self._capture(stack, batch, key, loss, frozen):
                return False
        elif stack.w is not self.w:
            self.flush(stack)
            self._adopt(stack, frozen)
        assert self.batch is not None and self.replay is not None
        self.batch.copy_(batch)
        self.replay()
        return True

    def note(self, why: str) -> None:
        """Say once per cohort for each reason that steps run eagerly, not from a graph."""
        if why not in self.noted and not self.off:
            self.noted.add(why)
            self.log(f"cohort: steps run eagerly, not from a CUDA graph ({why})")

    def flush(self, stack: Rows) -> None:
        """Add the captured per-row loss sums to the stack's (before its rows change)."""
        if self.losses is not None and stack.w is self.w:
            stack.loss_sums.index_add_(0, stack.at, self.losses)
            self.losses.zero_()

    def _adopt(self, stack: Rows, frozen: tuple[torch.Tensor, ...]) -> None:
        """Copy the stack's state and its rows' frozen stacks into the captured tensors, which
        become the stack's."""
        assert self.w is not None and self.losses is not None
        self.w.copy_(stack.w)
        if self.v is not None and stack.v is not None:
            self.v.copy_(stack.v)
        for held, new in zip(self.frozen, frozen, strict=True):
            held.copy_(new)
        stack.w, stack.v = self.w, self.v
        self.losses.zero_()

    def _step_fn(self, w: torch.Tensor, v: torch.Tensor | None, batch: torch.Tensor,
                 losses: torch.Tensor, chain: LocalStep, loss: StackableLoss | None,
                 frozen: tuple[torch.Tensor, ...]) -> Callable[[], None]:
        def step() -> None:
            g, values = self.program.gradients(w, self.x, self.y, batch, loss, frozen)
            g = chain.gradient(g, w, 0)
            chain.update(w, g, v)
            losses.add_(values.to(losses.dtype))

        return step

    def _capture(self, stack: Rows, batch: torch.Tensor, key: tuple, loss: StackableLoss | None,
                 frozen: tuple[torch.Tensor, ...]) -> bool:
        w, v = stack.w.clone(), None if stack.v is None else stack.v.clone()
        staged = batch.clone()
        held = tuple(f.clone() for f in frozen)
        losses = torch.zeros(len(w), dtype=torch.float64, device=w.device)
        chain = stack.chain
        step = self._step_fn(w, v, staged, losses, chain, loss, held)
        try:
            replay = self.capture(step)
        except Exception as e:  # noqa: BLE001  (any capture failure: step eagerly, one line)
            return self._give_up(f"capture raised {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        self.key, self.replay, self.chain, self.loss = key, replay, chain, loss
        self.w, self.v, self.batch, self.losses, self.frozen = w, v, staged, losses, held
        if (None if loss is None else type(loss)) not in self.checked:
            return self._check(stack, batch, loss, frozen)
        self._adopt(stack, frozen)
        return True

    def _check(self, stack: Rows, batch: torch.Tensor, loss: StackableLoss | None,
               frozen: tuple[torch.Tensor, ...]) -> bool:
        """The first capture of an objective: one replay from the stack's state (its rows'
        frozen stacks copied in) against the eager step on the rows' own frozen stacks."""
        assert self.w is not None and self.losses is not None and self.replay is not None
        w, v = stack.w.clone(), None if stack.v is None else stack.v.clone()
        losses = torch.zeros_like(self.losses)
        self._step_fn(w, v, batch, losses, stack.chain, loss, frozen)()
        saved_w, saved_v = stack.w.clone(), None if stack.v is None else stack.v.clone()
        self._adopt(stack, frozen)
        assert self.batch is not None
        self.batch.copy_(batch)
        self.replay()
        agrees = torch.allclose(self.w, w, rtol=1e-5, atol=1e-7) and torch.allclose(
            self.losses, losses, rtol=1e-5) and (
                v is None or self.v is not None and torch.allclose(self.v, v, rtol=1e-5, atol=1e-7))
        stack.w, stack.v = saved_w, saved_v  # the checked step is taken again by the caller
        self.losses.zero_()
        self.checked.add(None if loss is None else type(loss))
        if not agrees:
            return self._give_up("the replayed step differs from the eager one")
        self._adopt(stack, frozen)
        return True

    def _give_up(self, why: str) -> bool:
        self.off = True
        self.key = self.replay = self.w = self.v = self.batch = self.losses = self.chain = None
        self.loss, self.frozen = None, ()
        self.log(f"cohort: CUDA graphs off ({why}); stepping eagerly")
        return False


def not_captured(program: StackedProgram, jobs: Sequence[SGDJob], hooked: bool,
                 has_bufs: bool) -> str | None:
    """Why the steps of `jobs` cannot be replayed from a graph whatever their rows (module
    doc), in words for the cohort's note (`StepGraphs.note`); None when they may be.
    `hooked`: per-step hooks, stacked or not; `has_bufs`: BatchNorm running statistics."""
    if hooked:
        names = sorted({getattr(j.on_step, "__qualname__", type(j.on_step).__name__)
                        .split(".<locals>.")[-1] for j in jobs if j.on_step is not None})
        return f"per-step hooks: {', '.join(names)}"
    if has_bufs:
        return "BatchNorm running statistics"
    for j in jobs:
        if j.loss is not None and not program.runs(j.loss):
            return f"the objective {type(j.loss).__name__} does not run on the model's stacked program"
    return None


def capturable(program: StackedProgram | None, precision: str, x: torch.Tensor) -> bool:
    """Whether a cohort on `x`'s device may replay its steps (module doc): the stacked program
    on CUDA in fp32 or tf32, graphs `enabled`."""
    return program is not None and x.is_cuda and precision in ("fp32", "tf32") and enabled()


__all__ = ["MIN_STEPS", "Capture", "StepGraphs", "capturable", "cuda_capture", "enabled", "not_captured",
           "signature"]
