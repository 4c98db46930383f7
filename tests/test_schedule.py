"""A client's mini-batch schedule (`fedhet.training.local.BatchSchedule`): the epoch walk of
docs/spec.md, handed out one batch at a time or as one table, and the stacked executor reads
it as one table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import BatchSchedule
from fedhet.training.steps import SGDConfig


def walk(indices, batch_size, steps, rng, order):
    """The walk written out: epochs of a permutation of the n positions, B at a time, the
    trailing partial batch dropped, a new permutation each epoch under `reshuffle`."""
    n = len(indices)
    b = min(batch_size, n)
    out, perm = [], rng.permutation(n)
    while len(out) < steps:
        for j in range(n // b):
            if len(out) < steps:
                out.append(indices[torch.from_numpy(perm[j * b:(j + 1) * b])])
        if order == "reshuffle":
            perm = rng.permutation(n)
    return out


@pytest.mark.parametrize("order", ["reshuffle", "fixed"])
@pytest.mark.parametrize(("n", "batch", "steps"), [(10, 3, 7), (5, 8, 3), (12, 4, 0), (9, 3, 3)])
def test_the_schedule_is_the_epoch_walk(order, n, batch, steps):
    indices = torch.arange(100, 100 + n)
    expected = walk(indices, batch, steps, np.random.default_rng(3), order)
    one_by_one = list(BatchSchedule(indices, batch, steps, np.random.default_rng(3), order))
    table = BatchSchedule(indices, batch, steps, np.random.default_rng(3), order).table()
    assert len(one_by_one) == len(table) == steps
    for a, b, c in zip(expected, one_by_one, table, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_the_stacked_executor_reads_each_schedule_as_one_table():
    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)))
    x, y = torch.rand(40, 6), torch.randint(0, 3, (40,))
    cohort = CohortTrainer(model, x, y, log=lambda _: None)
    streams = [BatchSchedule(torch.arange(k, 40, 2), 4, steps, np.random.default_rng(k))
               for k, steps in ((0, 3), (1, 6))]
    jobs = [SGDJob(model.params.clone(), s, SGDConfig(lr=0.1)) for s in streams]
    cohort.sgd_many(jobs)
    assert [j.result[1] for j in jobs] == [3, 6]
    assert [s.position for s in streams] == [0, 0]  # never iterated step by step
    for k, (job, steps) in enumerate(zip(jobs, (3, 6), strict=True)):  # the same as one by one
        alone = SGDJob(model.params.clone(), iter(list(BatchSchedule(
            torch.arange(k, 40, 2), 4, steps, np.random.default_rng(k)))), SGDConfig(lr=0.1))
        cohort.sgd_many([alone])
        assert torch.allclose(alone.result[0], job.result[0], atol=1e-6)
        assert alone.result[2] == pytest.approx(job.result[2], rel=1e-6)


def test_a_stack_is_sized_to_the_memory_it_may_take(monkeypatch):
    """On a CPU the stacked state stays under 1 GiB; on a GPU under half of the free memory
    the device reports (no fixed cap: a device with more free memory stacks more rows)."""
    from fedhet.training import cohort

    dim = 431_080  # the FedNNNN MNIST CNN
    assert cohort.rows_that_fit(dim, "cpu") == (1 << 30) // (12 * dim)
    for free in (8 << 30, 70 << 30):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, 80 << 30))
        assert cohort.rows_that_fit(dim, "cuda") == int(free * 0.5) // (12 * dim)


def _hop(k: int, steps: int, start: torch.Tensor, momentum: float = 0.5) -> SGDJob:
    """Client `k`'s `steps` local steps from `start` (batches of 4 of its 20 samples)."""
    return SGDJob(start, BatchSchedule(torch.arange(k % 2, 40, 2), 4, steps, np.random.default_rng(k)),
                  SGDConfig(lr=0.1, momentum=momentum, weight_decay=1e-3))


def test_jobs_handed_in_as_others_leave_train_on_in_the_same_call():
    """`next_jobs`: a ring's next hop joins the running stack when its predecessor leaves,
    starts from the predecessor's model with momentum from zero and its own step count, and
    ends as the hops run one by one would (two rings of unequal hops, one call)."""
    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)))
    x, y = torch.rand(40, 6), torch.randint(0, 3, (40,))
    cohort = CohortTrainer(model, x, y, log=lambda _: None)
    rings = {0: [(0, 3), (2, 5), (4, 2)], 1: [(1, 6), (3, 1)]}  # (client, τ) hop by hop
    first = {r: _hop(*hops[0], model.params.clone()) for r, hops in rings.items()}
    ring_of = {id(job): (r, 0) for r, job in first.items()}
    done: dict[int, list[SGDJob]] = {0: [], 1: []}
    calls = []

    def next_jobs(gone):
        calls.append(len(gone))
        made = []
        for job in gone:
            r, h = ring_of[id(job)]
            done[r].append(job)
            if h + 1 < len(rings[r]):
                new = _hop(*rings[r][h + 1], job.result[0].clone())
                ring_of[id(new)] = (r, h + 1)
                made.append(new)
        return made

    cohort.sgd_many(list(first.values()), next_jobs)
    assert [[j.result[1] for j in done[r]] for r in (0, 1)] == [[3, 5, 2], [6, 1]]
    assert calls == [1] * 5  # hops end at steps 3, 8, 10 (ring 0) and 6, 7 (ring 1)
    for r, hops in rings.items():  # the same hops, one after another, each a call of its own
        w = model.params.clone()
        for (k, steps), joined in zip(hops, done[r], strict=True):
            alone = _hop(k, steps, w)
            cohort.sgd_many([alone])
            assert torch.allclose(alone.result[0], joined.result[0], atol=1e-6)
            assert alone.result[2] == pytest.approx(joined.result[2], rel=1e-6)
            w = alone.result[0]


def test_a_job_that_cannot_join_waits_for_the_next_call():
    """A job with an `on_step` hook (it sees the stack's step count) is handed back unfinished."""
    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(6, 3)))
    x, y = torch.rand(40, 6), torch.randint(0, 3, (40,))
    cohort = CohortTrainer(model, x, y, log=lambda _: None)
    hooked = _hop(1, 2, model.params.clone())
    hooked.on_step = lambda *_: None
    cohort.sgd_many([_hop(0, 3, model.params.clone())], lambda gone: [hooked])
    assert not hooked.finished and hooked.batches.position == 0
    cohort.sgd_many([hooked])
    assert hooked.result is not None and hooked.result[1] == 2
