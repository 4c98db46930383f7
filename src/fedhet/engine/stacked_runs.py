"""Stacked runs: several runs that differ only in seed (or in a scalar such as α, μ, β or the
learning rate) step their clients' local SGD together, `runs × clients` trajectories in one
stacked cohort (`fedhet.training.cohort`), each run keeping its own partition, sampling, RNG
streams, algorithm state and run directory.

How: every run executes its own loop (`Simulation.run`) in a thread of its own, with the stacked
executor; where that executor would run its parked clients' SGD stacked, it hands them to a
`SharedCohort` instead and waits. Once every run still going has parked (or finished), the
jobs of all runs are run stacked in one call and every run goes on. Only one run executes
Python at a time (the `turn` lock, passed on at the barrier), so the runs never interleave
their use of the process-wide RNG and each run computes what it computes alone, to float32
rounding: only the composition of the stack differs, a stacked step treats every row on its
own, and a stacked matrix product may round differently with another number of matrices.
On a device that `stacks_evaluation` (CUDA), a run's evaluation parks at the same barrier:
the parked models that score on the same data are evaluated in one stacked forward per slice
of samples (`CohortTrainer.evaluate_many`).

A run whose executor is not the stacked one (a model that cannot be stacked, `--workers`) does
not join the cohort: `run_together` runs it on its own after the stack.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedhet.engine.executors import StackedExecutor
from fedhet.errors import FedhetError
from fedhet.training.cohort import CohortTrainer, rows_that_fit, stacks_evaluation
from fedhet.training.jobs import Continue, EvalJob, SGDJob

if TYPE_CHECKING:
    from fedhet.engine.simulation import Simulation


class SharedCohort:
    """The barrier and the stacked step shared by the runs of a stack."""

    def __init__(self, cohort: CohortTrainer) -> None:
        self.cohort = cohort
        self.turn = threading.Lock()
        """Held by the one run executing Python; released while a run waits at the barrier."""
        self._cond = threading.Condition()
        self._members = 0
        self._parked: list[tuple[list[SGDJob] | list[EvalJob], Continue | None]] = []
        self._generation = 0
        self.steps = 0
        """Stacked calls made (each one holds the parked jobs of every run still going)."""

    def join(self) -> None:
        with self._cond:
            self._members += 1

    def leave(self) -> None:
        """A run is done (finished, stopped or failed): the others no longer wait for it."""
        with self._cond:
            self._members -= 1
            if self._members and len(self._parked) == self._members:
                self._step()

    def sgd_many(self, jobs: list[SGDJob], next_jobs: Continue | None = None) -> None:
        """Park `jobs` until every run still going has parked, then run them all stacked.
        Results and errors end up on the jobs, as with `CohortTrainer.sgd_many`; a job that
        leaves the stack goes to its own run's `next_jobs`, whose jobs join the stack."""
        self._park(jobs, next_jobs)

    def evaluate_many(self, jobs: list[EvalJob]) -> None:
        """Park a run's evaluations like `sgd_many`; at the barrier every parked evaluation
        runs stacked (`CohortTrainer.evaluate_many`), results and errors on the jobs."""
        self._park(jobs)

    def _park(self, jobs: list[SGDJob] | list[EvalJob], next_jobs: Continue | None = None) -> None:
        with self._cond:
            self._parked.append((jobs, next_jobs))
            if len(self._parked) == self._members:
                self._step()
                return
            generation = self._generation
            self.turn.release()
            while self._generation == generation:
                self._cond.wait()
        self.turn.acquire()

    def _step(self) -> None:
        jobs = [job for parked, _ in self._parked for job in parked]
        sgd = [job for job in jobs if isinstance(job, SGDJob)]
        evals = [job for job in jobs if isinstance(job, EvalJob)]
        if sgd:
            try:
                self.cohort.sgd_many(sgd, _route([(p, n) for p, n in self._parked if n is not None]))
            except Exception as e:  # noqa: BLE001  (the stacked step failed: every job gets the error)
                for job in sgd:
                    job.error = e
        if evals:
            self.cohort.evaluate_many(evals)
        self.steps += 1
        self._parked = []
        self._generation += 1
        self._cond.notify_all()


def _route(owners: list[tuple[list, Continue]]) -> Continue:
    """One `next_jobs` for the stacked call of several runs: each job that leaves goes to the
    `next_jobs` of the run that parked it (or whose client made it), in the order they left."""
    owner = {id(job): next_jobs for jobs, next_jobs in owners for job in jobs}
    keep = [job for jobs, _ in owners for job in jobs]  # alive, so that no id() is reused

    def next_jobs(gone: list[SGDJob]) -> list[SGDJob]:
        made: list[SGDJob] = []
        for job in gone:
            run_next = owner.get(id(job))
            if run_next is None:
                continue
            for new in run_next([job]):
                owner[id(new)] = run_next
                keep.append(new)
                made.append(new)
        return made

    return next_jobs


@dataclass
class _Member:
    sim: Simulation
    kwargs: dict[str, Any]
    result: Any = None
    error: BaseException | None = None


def _stacked(m: _Member) -> StackedExecutor:
    """`m`'s executor, a stacked one (`can_share` stacks only those)."""
    executor = m.sim.side.executor
    assert isinstance(executor, StackedExecutor)
    return executor


def can_share(sims: Sequence[Simulation]) -> list[int]:
    """Positions of the runs that can step in one cohort with the first stacked one: the stacked
    executor, the same model architecture on the same device, computing alike (memory format and
    `precision`), and the same training data (a client's batches are indices into it)."""
    sides = [sim.side for sim in sims]
    first = next((s for s in sides if s.executor.name == "stacked"), None)
    if first is None:
        return []
    out = []
    for i, side in enumerate(sides):
        model, trainer = side.model, side.trainer
        if (
            side.executor.name == "stacked"
            and side.plan.device == first.plan.device
            and model.layers == first.model.layers
            and model.precision == first.model.precision
            and model.channels_last == first.model.channels_last
            and type(model.module) is type(first.model.module)
            and trainer.x.shape == first.trainer.x.shape
            and bool((trainer.x is first.trainer.x) or trainer.x.equal(first.trainer.x))
            and bool((trainer.y is first.trainer.y) or trainer.y.equal(first.trainer.y))
        ):
            out.append(i)
    return out


def run_together(
    sims: Sequence[Simulation], kwargs: Sequence[dict[str, Any]] | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[Any]:
    """Run `sims` (each with `Simulation.run(**kwargs[i])`), those that `can_share` as one
    stack; returns each run's summary, or the exception that ended it, in order.

    A `KeyboardInterrupt` in the calling thread is re-raised once the runs' threads have been
    told nothing (they are daemons, and every run resumes from its last checkpoint)."""
    kwargs = list(kwargs or [{} for _ in sims])
    if len(kwargs) != len(sims):
        raise FedhetError("run_together needs one kwargs mapping per simulation")
    members = [_Member(sim, kw) for sim, kw in zip(sims, kwargs, strict=True)]
    shared_ix = can_share(sims)
    if len(shared_ix) > 1:
        first = sims[shared_ix[0]].side
        cohort = CohortTrainer(first.model, first.trainer.x, first.trainer.y,
                               log=sims[shared_ix[0]].log)
        cohort.chunk = rows_that_fit(first.model.dim, first.model.params.device)
        shared = SharedCohort(cohort)
        stack = [members[i] for i in shared_ix]
        for m in stack:
            _stacked(m).shared = shared
            if stacks_evaluation(first.plan.device):
                m.sim.parts.evaluator.stacked = shared.evaluate_many
            shared.join()
        threads = [threading.Thread(target=_member_main, args=(m, shared), daemon=True,
                                    name=f"fedhet-run-{m.sim.parts.loop.seed}") for m in stack]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.2)
                if on_step is not None:
                    on_step()
        for m in stack:
            _stacked(m).shared = None
            m.sim.parts.evaluator.stacked = None
    alone = [m for i, m in enumerate(members) if i not in shared_ix or len(shared_ix) == 1]
    for m in alone:
        try:
            m.result = m.sim.run(**m.kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001  (reported per run, like a stack member)
            m.error = e
    return [m.error if m.error is not None else m.result for m in members]


def _member_main(member: _Member, shared: SharedCohort) -> None:
    shared.turn.acquire()
    try:
        member.result = member.sim.run(**member.kwargs)
    except BaseException as e:  # noqa: BLE001  (handed back to the caller, per run)
        member.error = e
    finally:
        shared.leave()
        shared.turn.release()


__all__ = ["SharedCohort", "can_share", "run_together"]
