"""The parked calls a stacked cohort runs (`fedhet.training.cohort.CohortTrainer`): one
`LocalTrainer.sgd` call (`SGDJob`), one `LocalTrainer.full_gradient` call (`GradJob`), one
evaluation (`EvalJob`). Each carries its inputs, and gets its result or its error back.

A `Continue` callback lets the caller hand the cohort more work while it runs: given the jobs
that just left the stack (results or errors on them), it returns the jobs their clients made
next (a ring's next hop), which the cohort stacks at once where it can (`joinable`) instead of
in a later call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from fedhet.training.local import BatchSchedule, SGDConfig, StepHook
from fedhet.training.losses import StackableLoss
from fedhet.training.steps import Custom, GradTransform, Transform, adam_row


@dataclass
class SGDJob:
    """One parked `LocalTrainer.sgd` call."""

    w0: torch.Tensor
    batches: Iterator[torch.Tensor]
    cfg: SGDConfig
    transforms: Sequence[Transform | GradTransform] = ()
    """The algorithm's links of the chain (`LocalStep.of(cfg, transforms)`)."""
    on_step: StepHook | None = None
    buffers: torch.Tensor | None = None
    """The client's BatchNorm running statistics before the call (flat; updated per step)."""
    loss: StackableLoss | None = None
    """Replaces the model's objective (`LocalTrainer.sgd(..., loss_fn=)`, e.g. MOON's)."""
    result: tuple[torch.Tensor, int, float] | None = None
    error: BaseException | None = None
    buffers_out: torch.Tensor | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        """Whether the job has its result or its error."""
        return self.result is not None or self.error is not None


def next_batches(jobs: list[SGDJob], rows: list[int]) -> tuple[list[torch.Tensor], list[int]]:
    """Each row's next mini-batch from its job's stream, and the rows that have one (a
    stream that raises fails its job)."""
    batches: list[torch.Tensor] = []
    keep: list[int] = []
    for r, c in enumerate(rows):
        job = jobs[c]
        if job.error is not None:
            continue
        try:
            batches.append(next(job.batches))
            keep.append(r)
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001  (a client's batch stream failed)
            job.error = e
    return batches, keep


Objective = tuple[StackableLoss | None, tuple[torch.Tensor, ...]] | str
"""A stack's shared objective (None: the model's own) with its rows' stacked frozen vectors,
or, in words, why its rows have none."""


def objective_key(job: SGDJob) -> tuple | None:
    """What a job's objective is, for stacking: None for the model's own, else the replacement's
    type and `StackableLoss.key`; rows of one key step in one stacked call."""
    return None if job.loss is None else (type(job.loss), job.loss.key)


def stacked_frozen(cache: dict[tuple, tuple[torch.Tensor, ...]],
                   jobs: list[SGDJob]) -> tuple[torch.Tensor, ...]:
    """The `StackableLoss.frozen` vectors of `jobs` (rows of one loss key) stacked, `(R, d)`
    each, kept in `cache` under the key and the jobs while those rows last."""
    losses = [j.loss for j in jobs if j.loss is not None]
    assert len(losses) == len(jobs)
    cache_key = (losses[0].key, tuple(id(j) for j in jobs))
    if cache_key not in cache:
        cache[cache_key] = tuple(torch.stack([loss.frozen[i] for loss in losses])
                                 for i in range(len(losses[0].frozen)))
    return cache[cache_key]


def shared_objective(jobs: list[SGDJob], cache: dict[tuple, tuple[torch.Tensor, ...]]) -> Objective:
    """The objective every job of a stack's rows shares, with their `stacked_frozen` vectors,
    or why they share none (rows of different objectives)."""
    if len({objective_key(j) for j in jobs}) > 1:
        return "rows of different objectives in one stack"
    loss = jobs[0].loss if jobs else None
    return (None, ()) if loss is None else (loss, stacked_frozen(cache, jobs))


@dataclass
class GradJob:
    """One parked `LocalTrainer.full_gradient` call."""

    params: torch.Tensor
    indices: torch.Tensor
    chunk: int = 1024
    max_batches: int = 0
    result: torch.Tensor | None = None
    error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class EvalJob:
    """One model to score (`fedhet.training.local.evaluate`): `params` with BatchNorm statistics
    `buffers` on `(x, y)`; `result` is `(mean loss, accuracy)`."""

    params: torch.Tensor
    buffers: torch.Tensor | None
    x: torch.Tensor
    y: torch.Tensor
    result: tuple[float, float] | None = None
    error: BaseException | None = None


Continue = Callable[[list[SGDJob]], list[SGDJob]]
"""`(jobs that left the stack) -> jobs to stack next`: called by `CohortTrainer.sgd_many` as
jobs leave; the returned jobs join the running stack where `joinable`, the others stay
unfinished for the caller's next call."""


def joinable(job: SGDJob) -> bool:
    """Whether `job` can join a stack that is already stepping: an unread `BatchSchedule`
    (its whole table goes on the device at once), plain SGD (Adam's bias correction counts the
    stack's steps), no `on_step` hook, no replacement loss and no `Custom` transform (these
    see the stack's step count or their own per-client machinery)."""
    return (
        job.error is None and job.on_step is None and job.loss is None
        and adam_row(job.cfg) is None
        and isinstance(job.batches, BatchSchedule) and job.batches.position == 0
        and all(isinstance(t, Transform) and not isinstance(t, Custom) for t in job.transforms)
    )


__all__ = ["Continue", "EvalJob", "GradJob", "Objective", "SGDJob", "joinable", "next_batches",
           "objective_key", "shared_objective", "stacked_frozen"]
