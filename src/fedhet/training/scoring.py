"""Stacked evaluation: several models scored on the same samples in one forward per slice
(`CohortTrainer.evaluate_many`, the stack of runs' evaluations on a GPU).

The models that score on the same `(x, y)` are stacked: the stacked program's `scores` where
the model has one and no BatchNorm, else one `vmap` of the module's forward over their
parameters and statistics; each slice holds `EVAL_BATCH // models` samples, so the stack's
activations stay those of one evaluation.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedhet.models.registry import objective, predictions
from fedhet.training.flat import FlatModel
from fedhet.training.jobs import EvalJob
from fedhet.training.local import eval_batch
from fedhet.training.program import StackedProgram


class Scorer(Protocol):
    """What stacked scoring reads of a cohort (`CohortTrainer`): the shared model, its stacked
    program if any, and where each parameter and buffer lies in the flat vectors."""

    model: FlatModel
    program: StackedProgram | None
    param_names: list[str]
    param_slices: list[tuple[int, int, tuple[int, ...]]]
    buffer_specs: list[tuple[str, int, int, tuple[int, ...]]]


class _Scores(nn.Module):
    """`forward(x, y) = (Σ loss, number correct)` of `inner` on one batch, for stacked evaluation."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.inner(x)
        return objective(self.inner, out, y) * len(y), (predictions(self.inner, out) == y).sum()


def evaluate_many(cohort: Scorer, jobs: list[EvalJob]) -> None:
    """Every job's `evaluate` (mean loss and accuracy, BatchNorm in eval mode, float32
    under `torch.inference_mode`), the jobs that score on the same `(x, y)` stacked: one
    `vmap` of the module's forward over their parameters per slice of samples, each slice
    `EVAL_BATCH // jobs` samples so the stack's activations stay those of one evaluation.
    Results (or the error) go on the jobs; equal to `evaluate` job by job to float32
    rounding."""
    groups: list[list[EvalJob]] = []
    for job in jobs:
        group = next((g for g in groups if _same_data(g[0], job)), None)
        if group is None:
            groups.append([job])
        else:
            group.append(job)
    module = cohort.model.module
    was_training = module.training
    module.eval()
    try:
        for group in groups:
            try:
                _evaluate_group(cohort, group)
            except Exception as e:  # noqa: BLE001  (reported on every job, as in sgd_many)
                for job in group:
                    job.error = e
    finally:
        module.train(was_training)

def _evaluate_group(cohort: Scorer, jobs: list[EvalJob]) -> None:
    device = cohort.model.params.device
    x, y = jobs[0].x, jobs[0].y
    w = torch.stack([j.params.to(device) for j in jobs])
    n_bufs = cohort.model.buffers.numel()
    bufs = torch.stack([
        (j.buffers if j.buffers is not None and j.buffers.numel() else cohort.model.buffers).to(device)
        for j in jobs
    ]) if n_bufs else torch.zeros(len(jobs), 0, device=device)
    scores = _Scores(cohort.model.module)

    def score(ws, bs, xb, yb):
        slices = zip(cohort.param_names, cohort.param_slices, strict=True)
        tensors = {n: ws[a:b].view(shape) for n, (a, b, shape) in slices}
        tensors.update({n: bs[a:b].view(shape) for n, a, b, shape in cohort.buffer_specs})
        return functional_call(scores, tensors, (xb, yb))

    stacked = vmap(score, in_dims=(0, 0, None, None))
    if cohort.program is not None and not n_bufs:
        stacked = partial(_program_scores, cohort.program)
    per_call = max(1, eval_batch(x.device) // len(jobs))
    loss_sum = torch.zeros(len(jobs), dtype=torch.float64, device=y.device)
    correct = torch.zeros(len(jobs), dtype=torch.int64, device=y.device)
    with torch.inference_mode():
        for start in range(0, len(y), per_call):
            loss, right = stacked(w, bufs, x[start : start + per_call], y[start : start + per_call])
            loss_sum += loss.double()
            correct += right
    n = max(len(y), 1)
    for j, job in enumerate(jobs):
        job.result = (float(loss_sum[j]) / n, int(correct[j]) / n)


def _program_scores(program: StackedProgram, w: torch.Tensor, _bufs: torch.Tensor,
                    x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`StackedProgram.scores` in the evaluation's calling convention (no buffers)."""
    return program.scores(w, x, y)


def _same_data(a: EvalJob, b: EvalJob) -> bool:
    """Whether two evaluations score on the same samples (the same tensors, or equal ones: runs
    of a stack may each hold their own copy of a dataset)."""
    return all(
        u is v or (u.shape == v.shape and u.dtype == v.dtype and u.device == v.device and bool(u.equal(v)))
        for u, v in ((a.x, b.x), (a.y, b.y))
    )


def stacks_evaluation(device: torch.device | str) -> bool:
    """Whether the runs of a stack on `device` evaluate stacked (`CohortTrainer.evaluate_many`)
    rather than one by one. **[choice]** CUDA only: on a CPU, `vmap` turns a convolution over
    stacked weights into a grouped convolution, and stacking 4 runs took 2.0–2.6× the time of
    their channels-last evaluations one after another for the paper CNNs and 1.6× for the MLP
    (`benchmarks/bench_eval_stack.py`, one core, benchmarks/RESULTS.md); on a GPU one stacked
    forward replaces `runs` small launch-bound ones, as the stacked training step does."""
    return torch.device(device).type == "cuda"


__all__ = ["Scorer", "evaluate_many", "stacks_evaluation"]
