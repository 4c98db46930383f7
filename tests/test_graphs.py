"""Steps replayed from a captured graph (`fedhet.training.graphs.StepGraphs`).

CUDA graphs need a GPU; here the capture is replaced by one that records the step function and
replays it by calling it (`eager_capture`), so everything around the capture is tested on the
CPU: which steps go through the graph, the captured tensors taking over the stack's state, the
loss sums flushed before rows change, a graph reused by a ring's next hop of the same
coefficients and captured again otherwise, and a capture that fails or disagrees turning the
graphs off with one line while the results stay the eager ones; the same for stacks of MOON
rows, whose frozen global and previous models are captured tensors too, and the one note a
cohort gives for stacks it steps eagerly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms.moon import ContrastiveLoss
from fedhet.models.moon import MoonParams
from fedhet.models.registry import build_model
from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.graphs import StepGraphs, capturable
from fedhet.training.local import BatchSchedule
from fedhet.training.steps import Proximal, SGDConfig


class Captures:
    """A capture that counts its calls and replays, and replays the recorded step eagerly."""

    def __init__(self, fail: bool = False, wrong: bool = False, wrong_from: int = 1) -> None:
        self.count = 0
        self.replays = 0
        self.fail, self.wrong, self.wrong_from = fail, wrong, wrong_from

    def __call__(self, step):
        self.count += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing\nmore text")
        wrong = self.wrong and self.count >= self.wrong_from

        def replay():
            self.replays += 1
            if not wrong:
                step()

        return replay


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
    cohort, model, lines = setup(capture)
    hooked = job(model, 0, 3)
    hooked.on_step = lambda *_: None
    adam = job(model, 1, 3, momentum=0.0)
    adam.cfg = SGDConfig(lr=0.01, optimizer="adam")
    cohort.sgd_many([hooked])
    cohort.sgd_many([adam])
    assert capture.count == 0 and hooked.result is not None and adam.result is not None
    assert lines == ["cohort: steps run eagerly, not from a CUDA graph (per-step hooks: <lambda>)",
                     "cohort: steps run eagerly, not from a CUDA graph (Adam or a custom transform "
                     "in the local step)"]


def test_graphs_only_for_the_program_on_cuda_in_fp32():
    cohort, _, _ = setup()
    assert not capturable(cohort.program, "fp32", torch.zeros(1))  # a CPU tensor
    assert not capturable(None, "fp32", torch.zeros(1))


# -- MOON: a replacement objective on the program, its rows' frozen models captured ------------

def moon_setup(capture=None):
    torch.manual_seed(0)
    model = FlatModel(build_model("moon-mlp", (64,), 10, MoonParams(hidden=16, proj_dim=8)))
    x, y = torch.randn(96, 64), torch.randint(0, 10, (96,))
    lines: list[str] = []
    cohort = CohortTrainer(model, x, y, log=lines.append)
    assert cohort.program is not None and cohort.graphs is None
    if capture is not None:
        cohort.graphs = StepGraphs(cohort.program, x, y, lines.append, capture)
    return cohort, model, lines


def moon_loss(model, seed: int, mu: float = 5.0, temperature: float = 0.5, loss_class=ContrastiveLoss):
    """MOON's objective with this row's own frozen global and previous models (`seed`)."""
    g = torch.Generator().manual_seed(seed)
    w = model.params
    glob = w + 0.3 * torch.randn(w.shape, generator=g)
    prev = w + 0.3 * torch.randn(w.shape, generator=g)
    return loss_class(model.layers, glob, prev, mu, temperature)


def moon_job(model, k: int, steps: int, loss, w=None) -> SGDJob:
    w0 = model.params.clone() if w is None else w
    return SGDJob(w0, BatchSchedule(torch.arange(k % 3, 96, 3), 8, steps, np.random.default_rng(k)),
                  SGDConfig(lr=0.1, momentum=0.5, weight_decay=1e-3), loss=loss)


def moon_pair(spec, w=None):
    """The same MOON jobs (`(k, steps, seed, μ, T)` each) for a replaying and an eager cohort."""
    def jobs(model):
        return [moon_job(model, k, s, moon_loss(model, seed, mu, temp), w) for k, s, seed, mu, temp in spec]
    return jobs


def test_a_stack_of_moon_rows_is_replayed_as_it_steps_eagerly():
    """MOON rows (`CE + μ ℓ_con`, each with its own frozen global and previous models) of
    unequal τ go through the graph: captured once for each shape of the stack, and the weights
    and loss sums are the eager ones."""
    capture = Captures()
    cohort, model, lines = moon_setup(capture)
    eager, _, _ = moon_setup()
    spec = [(0, 20, 10, 5.0, 0.5), (1, 60, 11, 5.0, 0.5), (2, 40, 12, 5.0, 0.5)]
    replayed, plain = moon_pair(spec)(model), moon_pair(spec)(model)
    assert cohort.program.runs(replayed[0].loss)
    cohort.sgd_many(replayed)
    eager.sgd_many(plain)
    for a, b in zip(replayed, plain, strict=True):
        same(a, b)
    assert capture.count == 3 and not lines  # 3 rows, then 2, then 1
    assert capture.replays == 60 + 1  # every step, and once more to check the first capture
    # the contrastive term is in what was replayed: the model's plain CE ends elsewhere
    ce = [moon_job(model, k, s, None) for k, s, *_ in spec]
    eager.sgd_many(ce)
    assert float((ce[0].result[0] - plain[0].result[0]).norm()) > 1e-3


def test_new_moon_rows_of_the_same_signature_reuse_the_graph_with_their_frozen_models():
    """The next call's rows (same shapes, μ and temperature; other frozen models and weights)
    take the captured step, their frozen models copied into the captured ones: still the eager
    results, no second capture."""
    capture = Captures()
    cohort, model, _ = moon_setup(capture)
    eager, _, _ = moon_setup()
    first = [(0, 24, 10, 5.0, 0.5), (1, 24, 11, 5.0, 0.5)]
    second = [(1, 24, 20, 5.0, 0.5), (2, 24, 21, 5.0, 0.5)]
    w = model.params + 0.1 * torch.randn(model.params.shape, generator=torch.Generator().manual_seed(3))
    for spec, w0 in ((first, None), (second, w)):
        replayed, plain = moon_pair(spec, w0)(model), moon_pair(spec, w0)(model)
        cohort.sgd_many(replayed)
        eager.sgd_many(plain)
        for a, b in zip(replayed, plain, strict=True):
            same(a, b)
    assert capture.count == 1 and capture.replays == 2 * 24 + 1  # + the first capture's check


@pytest.mark.parametrize("change", [{"mu": 1.0}, {"temperature": 0.1}])
def test_a_new_mu_or_temperature_captures_again(change):
    """μ and the temperature are baked into the captured step (Python numbers of the rows
    form): rows with another value capture a new graph, and their results stay the eager ones."""
    capture = Captures()
    cohort, model, _ = moon_setup(capture)
    eager, _, _ = moon_setup()
    before = {"mu": 5.0, "temperature": 0.5}
    after = {**before, **change}
    for params in (before, after):
        spec = [(k, 20, 10 + k, params["mu"], params["temperature"]) for k in range(2)]
        replayed, plain = moon_pair(spec)(model), moon_pair(spec)(model)
        cohort.sgd_many(replayed)
        eager.sgd_many(plain)
        for a, b in zip(replayed, plain, strict=True):
            same(a, b)
    assert capture.count == 2


def test_the_first_moon_capture_is_checked_after_a_checked_plain_one():
    """MOON's first-round clients (the model's CE) are captured and checked first; the first
    capture with the contrastive objective and its frozen models is checked again, and one that
    disagrees turns the graphs off with one line, the results staying the eager ones."""
    capture = Captures(wrong=True, wrong_from=2)
    cohort, model, lines = moon_setup(capture)
    eager, _, _ = moon_setup()
    for spec in ([(0, 20, None), (1, 20, None)], [(0, 20, 10), (1, 20, 11)]):
        replayed, plain = ([moon_job(model, k, s, None if seed is None else moon_loss(model, seed))
                            for k, s, seed in spec] for _ in range(2))
        cohort.sgd_many(replayed)
        eager.sgd_many(plain)
        for a, b in zip(replayed, plain, strict=True):
            same(a, b)
    assert lines == ["cohort: CUDA graphs off (the replayed step differs from the eager one); "
                     "stepping eagerly"]
    assert capture.count == 2 and cohort.graphs.off


class OffProgram(ContrastiveLoss):
    """MOON's objective without its rows form: it runs under `vmap`, not on the program."""

    @property
    def on_program(self) -> bool:
        return False


def test_stacks_not_captured_for_their_objective_say_so_once():
    """Rows of two objectives in one stack (a MOON client in its first round beside one in a
    later round) and an objective the program does not run step eagerly, with one note each for
    the cohort however many calls; once the stack's rows share an objective again it is
    captured. On a CPU (no graphs) nothing is said."""
    capture = Captures()
    cohort, model, lines = moon_setup(capture)
    eager, _, quiet = moon_setup()
    for _ in range(2):
        for trainer in (cohort, eager):
            mixed = [moon_job(model, 0, 10, moon_loss(model, 1)), moon_job(model, 1, 30, None)]
            off = [moon_job(model, 2, 20, moon_loss(model, 2, loss_class=OffProgram))]
            trainer.sgd_many(mixed)
            trainer.sgd_many(off)
            assert all(j.result is not None for j in mixed + off)
    assert lines == [
        "cohort: steps run eagerly, not from a CUDA graph (rows of different objectives in one stack)",
        "cohort: steps run eagerly, not from a CUDA graph (the objective OffProgram does not run "
        "on the model's stacked program)",
    ]
    assert capture.count == 1  # the CE row alone after the MOON row left (20 steps left): reused
    assert capture.replays == 2 * 20 + 1 and not quiet
