"""The stacked step replayed from a captured CUDA graph: one launch a step instead of a few
hundred (`CohortTrainer.sgd_many` on a GPU).

A stacked step of the program (`fedhet.training.program`) and a plain chain issues ~200 small
kernels; on a GPU each launch costs the host a few microseconds, more than the kernel itself
for the papers' models, so a one-row ring walk (FedSR's ring-optimization: ~9,400 steps a
round) is launch-bound. `StepGraphs` captures one step (gradient, chain, update, the loss
added to a per-row sum) over fixed tensors, the rows' weights `w`, the chain's state `v`, the
batch `(R, b)` and the loss sums, then each step copies its batch in and replays the graph.

The graph is captured again whenever the stack's signature changes (the rows, the batch size,
the chain's coefficients and anchors: `signature`); a stack whose rows were replaced by rows of
the same signature (a ring's next hop: same η, ρ, λ) reuses it, its new state copied into the
captured tensors. The first capture of a cohort is checked against the eager step from the same
state; a capture that raises or disagrees turns the graphs off for the cohort, with one line,
and the step runs eagerly as before. Used only where the step is a pure tensor program: the
stacked program on CUDA in fp32/tf32 (autocast's cache does not survive capture), no `on_step`
hooks, no replacement loss, no `Custom` transform, plain SGD (Adam's bias corrections are
Python numbers of the step count), no BatchNorm buffers, batches from a `BatchTable`.
`FEDHET_CUDA_GRAPHS=0` turns them off.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedhet.training.steps import Custom, LocalStep

if TYPE_CHECKING:
    from fedhet.training.program import StackedProgram
    from fedhet.training.rows import Rows

Replay = Callable[[], None]
Capture = Callable[[Callable[[], None]], Replay]
"""`capture(step) -> replay`: records `step` once (it may run it to warm up) and returns what
runs it again."""

WARMUP = 3
MIN_STEPS = 16
"""**[choice]** A new capture (three warm-up steps and the recording, a few steps' time) is made
only for a stack that keeps its rows at least this many steps; a stack about to change (a star
round's clients leaving one by one) steps eagerly until it settles."""
"""Eager runs of the step on a side stream before capture (cuBLAS and autograd set up their
workspaces there, as PyTorch's whole-network capture recipe asks)."""


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


def signature(stack: Rows, batch: torch.Tensor) -> tuple | None:
    """What a captured step depends on besides the values of `w`, `v` and the batch: the shapes,
    each link's coefficients and the anchors' and shifts' storage; None when the chain cannot
    be captured (`Custom`, Adam)."""
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
    return (tuple(stack.w.shape), v, tuple(batch.shape), batch.dtype, tuple(links),
            chain.momentum.rho, chain.lr)


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
        self.checked = False
        self.key: tuple | None = None
        self.replay: Replay | None = None
        self.w: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.batch: torch.Tensor | None = None
        self.losses: torch.Tensor | None = None
        """The captured per-row loss sums since the last `flush`."""
        self.chain: LocalStep | None = None
        """The chain the graph was captured with (its tensors must outlive the graph)."""

    def step(self, stack: Rows, batch: torch.Tensor, horizon: Callable[[], int]) -> bool:
        """One step of `stack` on `batch` through the graph (capturing it first when the
        signature is new and the stack keeps its rows for `horizon() ≥ MIN_STEPS` more steps,
        asked only then); False
        when the graphs are off or this step is not captured (the caller then steps eagerly).
        `stack.w` and `stack.v` become the captured tensors."""
        if self.off:
            return False
        key = signature(stack, batch)
        if key is None:
            return False
        if key != self.key:
            if horizon() < MIN_STEPS:
                return False
            self.flush(stack)
            if not self._capture(stack, batch, key):
                return False
        elif stack.w is not self.w:
            self.flush(stack)
            self._adopt(stack)
        assert self.batch is not None and self.replay is not None
        self.batch.copy_(batch)
        self.replay()
        return True

    def flush(self, stack: Rows) -> None:
        """Add the captured per-row loss sums to the stack's (before its rows change)."""
        if self.losses is not None and stack.w is self.w:
            stack.loss_sums.index_add_(0, stack.at, self.losses)
            self.losses.zero_()

    def _adopt(self, stack: Rows) -> None:
        """Copy the stack's state into the captured tensors, which become the stack's."""
        assert self.w is not None and self.losses is not None
        self.w.copy_(stack.w)
        if self.v is not None and stack.v is not None:
            self.v.copy_(stack.v)
        stack.w, stack.v = self.w, self.v
        self.losses.zero_()

    def _step_fn(self, w: torch.Tensor, v: torch.Tensor | None, batch: torch.Tensor,
                 losses: torch.Tensor, chain: LocalStep) -> Callable[[], None]:
        def step() -> None:
            g, loss = self.program.gradients(w, self.x, self.y, batch)
            g = chain.gradient(g, w, 0)
            chain.update(w, g, v)
            losses.add_(loss.to(losses.dtype))

        return step

    def _capture(self, stack: Rows, batch: torch.Tensor, key: tuple) -> bool:
        w, v = stack.w.clone(), None if stack.v is None else stack.v.clone()
        staged = batch.clone()
        losses = torch.zeros(len(w), dtype=torch.float64, device=w.device)
        chain = stack.chain
        step = self._step_fn(w, v, staged, losses, chain)
        try:
            replay = self.capture(step)
        except Exception as e:  # noqa: BLE001  (any capture failure: step eagerly, one line)
            return self._give_up(f"capture raised {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        self.key, self.replay, self.chain = key, replay, chain
        self.w, self.v, self.batch, self.losses = w, v, staged, losses
        if not self.checked:
            return self._check(stack, batch)
        self._adopt(stack)
        return True

    def _check(self, stack: Rows, batch: torch.Tensor) -> bool:
        """The first capture: one replay from the stack's state against the eager step."""
        assert self.w is not None and self.losses is not None and self.replay is not None
        w, v = stack.w.clone(), None if stack.v is None else stack.v.clone()
        losses = torch.zeros_like(self.losses)
        self._step_fn(w, v, batch, losses, stack.chain)()
        saved_w, saved_v = stack.w.clone(), None if stack.v is None else stack.v.clone()
        self._adopt(stack)
        assert self.batch is not None
        self.batch.copy_(batch)
        self.replay()
        agrees = torch.allclose(self.w, w, rtol=1e-5, atol=1e-7) and torch.allclose(
            self.losses, losses, rtol=1e-5) and (
                v is None or self.v is not None and torch.allclose(self.v, v, rtol=1e-5, atol=1e-7))
        stack.w, stack.v = saved_w, saved_v  # the checked step is taken again by the caller
        self.losses.zero_()
        self.checked = True
        if not agrees:
            return self._give_up("the replayed step differs from the eager one")
        self._adopt(stack)
        return True

    def _give_up(self, why: str) -> bool:
        self.off = True
        self.key = self.replay = self.w = self.v = self.batch = self.losses = self.chain = None
        self.log(f"cohort: CUDA graphs off ({why}); stepping eagerly")
        return False


def capturable(program: StackedProgram | None, precision: str, x: torch.Tensor) -> bool:
    """Whether a cohort on `x`'s device may replay its steps (module doc): the stacked program
    on CUDA in fp32 or tf32, graphs `enabled`."""
    return program is not None and x.is_cuda and precision in ("fp32", "tf32") and enabled()


__all__ = ["MIN_STEPS", "Capture", "StepGraphs", "capturable", "cuda_capture", "enabled", "signature"]
