"""Stacked runs (`fedhet.engine.stacked_runs`): runs that differ in seed or in a scalar step their
clients in one stacked cohort and end as they end alone, to float32 rounding (a stacked matrix
product may round differently with another number of matrices in the stack)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.stacked_runs import SharedCohort, run_together
from fedhet.models.cnn import cnn_fednnnn_cifar
from fedhet.registry import NoParams
from fedhet.rundir.store import RunStore, read_metrics
from fedhet.runs.comparison import compare
from fedhet.runs.jobs import Job, stack_units
from fedhet.training.cohort import CohortTrainer, EvalJob, stacks_evaluation
from fedhet.training.flat import FlatModel
from fedhet.training.local import evaluate

BASE = {
    "dataset": "digits", "partition": "dirichlet", "clients": 6, "rounds": 3, "model": "mlp",
    "model.hidden": 16, "executor": "stacked", "local_epochs": 1, "batch_size": 32, "lr": 0.1,
}


def _curves(out: Path) -> list[tuple[float, float]]:
    return [(r["test_accuracy"], r["test_loss"]) for r in read_metrics(out / "metrics.csv")]


def same(a: list, b: list) -> bool:
    """Two lists of curves equal to float32 rounding: the same accuracies, losses to 1e-6."""
    return len(a) == len(b) and all(
        len(x) == len(y) and all(
            acc == pytest.approx(acc2, abs=1e-9) and loss == pytest.approx(loss2, rel=1e-6)
            for (acc, loss), (acc2, loss2) in zip(x, y, strict=True)
        )
        for x, y in zip(a, b, strict=True)
    )


def _alone_and_together(tmp_path: Path, variants: list[dict], base: dict = BASE) -> tuple[list, list, list]:
    alone = []
    for i, v in enumerate(variants):
        assemble(config_of({**base, **v}), store=RunStore(tmp_path / f"alone{i}"), log=lambda _: None).run()
        alone.append(_curves(tmp_path / f"alone{i}"))
    sims = [assemble(config_of({**base, **v}), store=RunStore(tmp_path / f"stacked{i}"), log=lambda _: None)
            for i, v in enumerate(variants)]
    outcomes = run_together(sims)
    together = [_curves(tmp_path / f"stacked{i}") for i in range(len(variants))]
    return alone, together, outcomes


def test_three_seeds_in_one_cohort_give_the_runs_one_by_one(tmp_path, monkeypatch):
    sizes: list[int] = []
    step = SharedCohort._step

    def spy(self):
        sizes.append(sum(len(jobs) for jobs, _ in self._parked))
        step(self)

    monkeypatch.setattr(SharedCohort, "_step", spy)
    alone, together, outcomes = _alone_and_together(
        tmp_path, [{"algorithm": "fedavg", "seed": s} for s in (0, 1, 2)])
    assert same(together, alone)
    assert all(isinstance(o, dict) and o["finished"] for o in outcomes)
    assert len({tuple(c) for c in alone}) == 3  # the seeds really differ
    assert sizes and max(sizes) == 3 * BASE["clients"]  # the three runs' clients in one stack


@pytest.mark.parametrize("model", ["mlp", "logreg"])  # autodiff'd and closed-form gradients
def test_a_scalar_sweep_steps_together(tmp_path, model):
    """FedProx μ and the learning rate differ per run; each run keeps its own."""
    variants = [{"algorithm": "fedprox", "algorithm.mu": mu, "lr": lr, "seed": 4}
                for mu, lr in ((0.0, 0.1), (0.5, 0.1), (0.5, 0.05))]
    base = {**BASE, "model": model}
    if model == "logreg":
        del base["model.hidden"]
    alone, together, _ = _alone_and_together(tmp_path, variants, base)
    assert same(together, alone)
    assert len({tuple(c) for c in alone}) == 3


def test_a_diverging_run_stops_alone(tmp_path):
    variants = [{"algorithm": "fedavg", "seed": 1}, {"algorithm": "fedavg", "seed": 1, "lr": 1e12},
                {"algorithm": "fedavg", "seed": 2}]
    alone, together, outcomes = _alone_and_together(tmp_path, variants)
    assert outcomes[1]["status"] == "diverged"
    assert same([together[0], together[2]], [alone[0], alone[2]])


def test_a_run_that_cannot_be_stacked_runs_on_its_own(tmp_path):
    variants = [{"algorithm": "fedavg", "seed": 0}, {"algorithm": "fedavg", "seed": 1,
                                                     "executor": "sequential"}]
    alone, together, outcomes = _alone_and_together(tmp_path, variants)
    assert same(together, alone) and all(o["finished"] for o in outcomes)


def test_stack_units_group_runs_that_share_data_model_and_executor(tmp_path):
    def job(name, **settings):
        return Job(name, {**BASE, "algorithm": "fedavg", **settings}, str(tmp_path / name), False)

    jobs = [job("s0", seed=0), job("s1", seed=1), job("seq", executor="sequential"),
            job("mu", algorithm="fedprox", **{"algorithm.mu": 0.1}), job("wide", **{"model.hidden": 32}),
            job("s2", seed=2)]
    units = stack_units(jobs, limit=3)
    assert [[j.name for j in u] for u in units] == [["s0", "s1", "mu"], ["seq"], ["wide"], ["s2"]]
    assert [[j.name for j in u] for u in stack_units(jobs, limit=1)] == [[j.name] for j in jobs]


def test_compare_with_stacks_writes_what_compare_without_them_writes(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[base]\ndataset = "digits"\npartition = "dirichlet"\nclients = 5\nrounds = 2\n'
        'model = "logreg"\nlocal_epochs = 1\nlr = 0.1\n'
        '[axes]\nalgorithm = ["fedavg", "fedprox"]\nseed = [0, 1, 2]\n'
    )
    one = compare(grid, tmp_path / "one", jobs=1, stack_runs=1)
    many = compare(grid, tmp_path / "many", jobs=1, stack_runs=8)
    assert len(one) == len(many) == 6
    for run in (tmp_path / "one" / "runs").iterdir():
        assert same([_curves(run)], [_curves(tmp_path / "many" / "runs" / run.name)])
        a = (run / "config.json").read_text()
        assert a == (tmp_path / "many" / "runs" / run.name / "config.json").read_text()


@pytest.mark.parametrize("n", [1, 2])
def test_run_together_of_one_or_two_plain_runs(tmp_path, n):
    sims = [assemble(config_of({**BASE, "seed": s}), store=None, log=lambda _: None) for s in range(n)]
    assert all(o["finished"] for o in run_together(sims))


def _bn_cnn_jobs() -> tuple[CohortTrainer, list[EvalJob]]:
    """Four models of the BatchNorm CIFAR CNN (channels-last) on two datasets, one of them
    handed in twice as equal copies: random weights and running statistics per model."""
    torch.manual_seed(0)
    model = FlatModel(cnn_fednnnn_cifar((3, 32, 32), 10, NoParams()), channels_last=True)
    data = [(torch.randn(30, 3, 32, 32), torch.randint(0, 10, (30,))) for _ in range(2)]
    cohort = CohortTrainer(model, data[0][0], data[0][1])
    jobs = []
    for i in range(4):
        bufs = model.buffers.clone()
        for name, a, b, _shape in cohort.buffer_specs:
            if name.endswith("running_mean"):
                bufs[a:b] = 0.2 * torch.randn(b - a)
            else:
                bufs[a:b] = torch.rand(b - a) + 0.5
        x, y = data[i % 2]
        if i == 2:
            x, y = x.clone(), y.clone()  # equal data in another tensor: stacked with job 0
        jobs.append(EvalJob(model.params + 0.05 * torch.randn(model.dim), bufs, x, y))
    return cohort, jobs


def test_stacked_evaluation_scores_every_model_as_alone():
    cohort, jobs = _bn_cnn_jobs()
    alone = [evaluate(cohort.model, j.params, j.buffers, j.x, j.y) for j in jobs]
    assert len({round(loss, 6) for loss, _ in alone}) == 4  # the models really differ
    stats_only = evaluate(cohort.model, jobs[1].params, jobs[0].buffers, jobs[1].x, jobs[1].y)
    assert stats_only[0] != pytest.approx(alone[1][0], rel=1e-4)  # and so do their statistics
    cohort.model.module.train()
    cohort.evaluate_many(jobs)
    for job, (loss, acc) in zip(jobs, alone, strict=True):
        assert job.error is None
        assert job.result[0] == pytest.approx(loss, rel=1e-5) and job.result[1] == acc
    assert cohort.model.module.training  # left in training mode, as it was


def test_a_stack_evaluates_its_runs_stacked_where_evaluation_stacks(tmp_path, monkeypatch):
    """Forced on (the CPU evaluates one by one, `stacks_evaluation`): every round's test and
    training-set evaluations of the three runs go in one stacked call and the curves stay."""
    import fedhet.engine.stacked_runs as stacked_runs

    monkeypatch.setattr(stacked_runs, "stacks_evaluation", lambda device: True)
    sizes: list[int] = []
    many = CohortTrainer.evaluate_many

    def spy(self, jobs):
        sizes.append(len(jobs))
        many(self, jobs)

    monkeypatch.setattr(CohortTrainer, "evaluate_many", spy)
    alone, together, outcomes = _alone_and_together(
        tmp_path, [{"algorithm": "fedavg", "seed": s, "train_loss": True} for s in (0, 1, 2)])
    assert same(together, alone) and all(o["finished"] for o in outcomes)
    assert sizes and max(sizes) == 3 * 2  # three runs × (test split, training set)
    assert len(sizes) == BASE["rounds"] + 1  # round 0 and every round, one call each
    for i in range(3):
        rows = read_metrics(tmp_path / f"stacked{i}" / "metrics.csv")
        rows_alone = read_metrics(tmp_path / f"alone{i}" / "metrics.csv")
        assert [r["train_loss"] for r in rows] == pytest.approx(
            [r["train_loss"] for r in rows_alone], rel=1e-5)


@pytest.mark.parametrize("settings", [
    {"algorithm": "fedsr", "algorithm.clusters": 2, "algorithm.ring_passes": 2},
    {"algorithm": "ring"},
    {"algorithm": "hierfavg", "algorithm.clusters": 2, "algorithm.kappa2": 2},
], ids=["fedsr", "ring", "hierfavg"])
def test_chains_of_three_seeds_in_one_cohort_give_the_runs_one_by_one(tmp_path, monkeypatch, settings):
    """Ring walks and HierFAVG edges of several runs as chains in one stacked call a round
    (each run's chains resumed by its own `next_jobs`): each run as it is alone."""
    calls: list[int] = []
    step = SharedCohort._step

    def spy(self):
        calls.append(1)
        step(self)

    monkeypatch.setattr(SharedCohort, "_step", spy)
    alone, together, outcomes = _alone_and_together(
        tmp_path, [{**settings, "seed": s} for s in (0, 1, 2)])
    assert same(together, alone)
    assert all(isinstance(o, dict) and o["finished"] for o in outcomes)
    assert len({tuple(c) for c in alone}) == 3
    evaluations = BASE["rounds"] + 1 if stacks_evaluation("cpu") else 0
    assert len(calls) == BASE["rounds"] + evaluations  # one stacked call a round
