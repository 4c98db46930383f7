"""Steps replayed from a captured graph (`fedhet.training.graphs.StepGraphs`).

CUDA graphs need a GPU; here the capture is replaced by one that records the step function and
replays it by calling it (`eager_capture`), so everything around the capture is tested on the
CPU: which steps go through the graph, the captured tensors taking over the stack's state, the
loss sums flushed before rows change, a graph reused by a ring's next hop of the same
coefficients and captured again otherwise, and a capture that fails or disagrees turning the
graphs off with one line while the results stay the eager ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.graphs import StepGraphs, capturable
from fedhet.training.local import BatchSchedule
from fedhet.training.steps import Proximal, SGDConfig


class Captures:
    """A capture that counts its calls and replays the recorded step eagerly."""

    def __init__(self, fail: bool = False, wrong: bool = False) -> None:
        self.count = 0
        self.fail, self.wrong = fail, wrong

    def __call__(self, step):
        self.count += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing\nmore text")
        return (lambda: None) if self.wrong else step


def setup(capture=None):
    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)))
    x, y = torch.rand(40, 6), torch.randint(0, 3, (40,))
    lines: list[str] = []
    cohort = CohortTrainer(model, x, y, log=lines.append)
    assert cohort.program is not None and cohort.graphs is None  # no graphs on a CPU by default
    if capture is not None:
        cohort.graphs = StepGraphs(cohort.program, x, y, lines.append, capture)
    return cohort, model, lines


def job(model, k: int, steps: int, w=None, mu: float = 0.0, momentum: float = 0.5) -> SGDJob:
    w0 = model.params.clone() if w is None else w
    transforms = [Proximal(mu, model.params.clone())] if mu else []
    return SGDJob(w0, BatchSchedule(torch.arange(k % 2, 40, 2), 4, steps, np.random.default_rng(k)),
                  SGDConfig(lr=0.1, momentum=momentum, weight_decay=1e-3), transforms)


def same(a: SGDJob, b: SGDJob) -> None:
    assert a.result is not None and b.result is not None
    assert torch.allclose(a.result[0], b.result[0], rtol=1e-6, atol=1e-7)
    assert a.result[1] == b.result[1]
    assert a.result[2] == pytest.approx(b.result[2], rel=1e-9)


def test_replayed_steps_give_the_eager_results():
    """Rows of unequal τ, FedProx's anchor, momentum and weight decay: the same results, the
    step captured again each time a row leaves (the stack's shape changes)."""
    capture = Captures()
    cohort, model, lines = setup(capture)
    eager, _, _ = setup()
    spec = [(0, 20, 0.0), (1, 70, 0.1), (2, 45, 0.0)]
    replayed = [job(model, k, s, mu=mu) for k, s, mu in spec]
    plain = [job(model, k, s, mu=mu) for k, s, mu in spec]
    cohort.sgd_many(replayed)
    eager.sgd_many(plain)
    for a, b in zip(replayed, plain, strict=True):
        same(a, b)
    assert capture.count == 3 and not lines  # 3 rows, then 2, then 1 (each ≥ MIN_STEPS steps)


def test_a_stack_about_to_change_is_not_captured():
    """Rows that leave within `MIN_STEPS` steps: no capture until the stack settles."""
    capture = Captures()
    cohort, model, _ = setup(capture)
    jobs = [job(model, k, s) for k, s in ((0, 5), (1, 10), (2, 40))]
    cohort.sgd_many(jobs)
    assert capture.count == 1  # the last row alone, 30 steps left


def test_a_rings_next_hop_reuses_the_captured_step():
    """A one-row ring whose hops share η, ρ and λ: one capture for the whole walk, each hop's
    model copied into the captured tensors, momentum from zero at each hand-off."""
    capture = Captures()
    cohort, model, _ = setup(capture)
    eager, _, _ = setup()
    hops = [(0, 20), (1, 24), (2, 5)]

    def walk(trainer):
        done = []

        def next_jobs(gone):
            done.extend(gone)
            if len(done) == len(hops):
                return []
            k, s = hops[len(done)]
            return [job(model, k, s, w=gone[0].result[0].clone())]

        trainer.sgd_many([job(model, *hops[0])], next_jobs)
        return done

    for a, b in zip(walk(cohort), walk(eager), strict=True):
        same(a, b)
    assert capture.count == 1


@pytest.mark.parametrize(("capture", "why"), [
    (Captures(fail=True), "capture raised RuntimeError: operation not permitted when stream is capturing"),
    (Captures(wrong=True), "the replayed step differs from the eager one"),
])
def test_a_capture_that_fails_or_disagrees_steps_eagerly_with_one_line(capture, why):
    cohort, model, lines = setup(capture)
    eager, _, _ = setup()
    replayed, plain = [job(model, 0, 20), job(model, 1, 30)], [job(model, 0, 20), job(model, 1, 30)]
    cohort.sgd_many(replayed)
    eager.sgd_many(plain)
    for a, b in zip(replayed, plain, strict=True):
        same(a, b)
    assert lines == [f"cohort: CUDA graphs off ({why}); stepping eagerly"]
    assert cohort.graphs.off and capture.count == 1  # not tried again


def test_steps_with_a_hook_or_adam_are_not_captured():
    capture = Captures()
    cohort, model, _ = setup(capture)
    hooked = job(model, 0, 3)
    hooked.on_step = lambda *_: None
    adam = job(model, 1, 3, momentum=0.0)
    adam.cfg = SGDConfig(lr=0.01, optimizer="adam")
    cohort.sgd_many([hooked])
    cohort.sgd_many([adam])
    assert capture.count == 0 and hooked.result is not None and adam.result is not None


def test_graphs_only_for_the_program_on_cuda_in_fp32():
    cohort, _, _ = setup()
    assert not capturable(cohort.program, "fp32", torch.zeros(1))  # a CPU tensor
    assert not capturable(None, "fp32", torch.zeros(1))
