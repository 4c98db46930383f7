"""MOON: the contrastive loss against a hand computation, μ = 0 is FedAvg, client state, models."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.algorithms.moon import contrastive_loss
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.errors import FedhetError
from fedhet.models.moon import MoonParams
from fedhet.models.registry import build_model, num_parameters

BASE = {"dataset": "digits", "partition": "dirichlet", "partition.alpha": 0.5, "lr": 0.1,
        "seed": 2, "clients": 4, "model": "moon-mlp", "model.hidden": 32, "model.proj_dim": 16}


def simulate(**settings) -> Simulation:
    cfg = config_of({**BASE, **settings}, "test")
    sim = assemble(cfg, store=None, log=lambda _: None)
    sim.run()
    return sim


def test_contrastive_loss_matches_hand_computation():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    t = 0.5
    # sample 1: cos(z, z_glob) = 1/√2, cos(z, z_prev) = 0; sample 2: 1 and 0
    def one(pos, neg):
        return -math.log(math.exp(pos / t) / (math.exp(pos / t) + math.exp(neg / t)))

    expected = (one(1 / math.sqrt(2), 0.0) + one(1.0, 0.0)) / 2
    assert float(contrastive_loss(z, z_glob, z_prev, t)) == pytest.approx(expected, rel=1e-6)
    assert float(contrastive_loss(z, z_glob, None, t)) == 0.0


def test_moon_with_mu_zero_is_fedavg():
    moon = simulate(algorithm="moon", rounds=2, **{"algorithm.mu": 0.0})
    fedavg = simulate(algorithm="fedavg", rounds=2)
    assert torch.equal(moon.final_state.w, fedavg.final_state.w)


def test_contrastive_term_starts_in_the_second_round():
    """No previous local model in round 1, so μ has no effect until round 2."""
    one = [simulate(algorithm="moon", rounds=1, **{"algorithm.mu": mu}).final_state.w for mu in (0.0, 5.0)]
    assert torch.equal(*one)
    two = [simulate(algorithm="moon", rounds=2, **{"algorithm.mu": mu}).final_state.w for mu in (0.0, 5.0)]
    assert not torch.allclose(*two)


def test_client_keeps_its_previous_local_model():
    sim = simulate(algorithm="moon", rounds=1)
    w_global = sim.w0
    for i in range(4):
        prev = sim.side.clients.states[i].w_prev
        assert prev.shape == w_global.shape and not torch.equal(prev, w_global)
    # the server's new model is the sample-weighted average of the clients' models
    sizes = torch.tensor([len(sim.side.client_indices[i]) for i in range(4)], dtype=torch.float64)
    avg = sum((n / sizes.sum()) * sim.side.clients.states[i].w_prev.double() for i, n in enumerate(sizes))
    assert torch.allclose(sim.final_state.w.double(), avg, atol=1e-6)


def test_moon_models_and_bad_model():
    mlp = build_model("moon-mlp", (784,), 10, MoonParams())
    # encoder 784·200+200 + 200·200+200, projection 200·200+200 + 200·256+256, classifier 256·10+10
    assert num_parameters(mlp) == (784 * 200 + 200) + (200 * 200 + 200) * 2 + (200 * 256 + 256) + 2570
    out, z = mlp(torch.zeros(3, 784), with_z=True)
    assert out.shape == (3, 10) and z.shape == (3, 256)
    cnn = build_model("moon-cnn", (3, 32, 32), 100, MoonParams(hidden=64))
    out, z = cnn(torch.zeros(2, 3, 32, 32), with_z=True)
    assert out.shape == (2, 100) and z.shape == (2, 256)
    # FedSR CNN body: conv 3·32·9+32, 32·64·9+64, 64·64·9+64, fc 1024·64+64; head 64→64→256→100
    body = (3 * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (64 * 64 * 9 + 64) + (1024 * 64 + 64)
    assert num_parameters(cnn) == body + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 100 + 100)
    with pytest.raises(FedhetError, match="18×18"):
        build_model("moon-cnn", (64,), 10, MoonParams())
    with pytest.raises(FedhetError, match="projection head"):
        resolve_and_build(algorithm="moon", model="mlp")
    with pytest.raises(FedhetError, match="temperature"):
        resolve_and_build(algorithm="moon", **{"algorithm.temperature": 0})


def resolve_and_build(**settings) -> Simulation:
    base = {k: v for k, v in BASE.items() if not k.startswith("model")}
    cfg = config_of({**base, **settings}, "test")
    return assemble(cfg, store=None, log=lambda _: None)


def test_moon_learns_on_digits():
    sim = simulate(algorithm="moon", rounds=6, lr=0.2, momentum=0.5, local_epochs=2,
                   **{"model.hidden": 64, "algorithm.mu": 1.0})
    assert sim.summary([sim._evaluate(sim.final_state, 6, {})], True)["final_accuracy"] > 0.6


@pytest.mark.parametrize("algorithm", ["moon", "fedsr"])
def test_interrupted_run_resumes_exactly(tmp_path, monkeypatch, algorithm):
    """Client state (MOON's previous models) and the ring draws survive a checkpoint."""
    from fedhet.runs.single import execute

    settings = {**BASE, "algorithm": algorithm, "rounds": 3, "momentum": 0.5,
                "algorithm.mu" if algorithm == "moon" else "algorithm.clusters": 2}
    full = execute(settings, tmp_path / "full", log=lambda _: None)
    original = Simulation._evaluate

    def interrupt(self, state, round, diag):
        if round == 3:
            raise KeyboardInterrupt
        return original(self, state, round, diag)

    monkeypatch.setattr(Simulation, "_evaluate", interrupt)
    with pytest.raises(KeyboardInterrupt):
        execute(settings, tmp_path / "cut", log=lambda _: None)
    monkeypatch.setattr(Simulation, "_evaluate", original)
    resumed = execute(None, tmp_path / "cut", resume=True, log=lambda _: None)
    assert resumed["final_accuracy"] == full["final_accuracy"]
    assert resumed["final_loss"] == full["final_loss"]
    assert resumed["cum_model_transfers"] == full["cum_model_transfers"]


def test_contrastive_loss_stacks_across_clients():
    """The stacked cohort computes MOON's `CE + μ ℓ_con` for several clients at once (each with
    its own global and previous model, two values of μ, and a first-round client whose
    objective is the plain CE in the same stack) and each ends where it ends alone."""
    import numpy as np

    from fedhet.algorithms.moon import ContrastiveLoss
    from fedhet.training.cohort import CohortTrainer, SGDJob
    from fedhet.training.flat import FlatModel
    from fedhet.training.local import LocalTrainer, SGDConfig

    torch.manual_seed(0)
    model = FlatModel(build_model("moon-mlp", (64,), 10, MoonParams(hidden=16, proj_dim=8)))
    x, y = torch.randn(96, 64), torch.randint(0, 10, (96,))
    seq, cohort = LocalTrainer(model, x, y), CohortTrainer(model, x, y)
    w0 = model.params.clone()
    models = [w0 + 0.1 * torch.randn_like(w0) for _ in range(8)]
    losses = [
        ContrastiveLoss(model.layers, models[0], models[1], 1.0, 0.5),
        ContrastiveLoss(model.layers, models[2], models[3], 1.0, 0.5),
        None,
        ContrastiveLoss(model.layers, models[4], models[5], 5.0, 0.5),
        ContrastiveLoss(model.layers, models[6], models[7], 1.0, 0.5),
    ]
    plans = [(0, 24, 3), (24, 40, 2), (40, 56, 3), (56, 80, 4), (80, 96, 3)]
    cfg = SGDConfig(0.1, momentum=0.5)

    def batches(c):
        a, b, tau = plans[c]
        return seq.batches(torch.arange(a, b), 8, tau, np.random.default_rng(c))

    alone = [seq.sgd(w0, batches(c), cfg, loss_fn=losses[c]) for c in range(5)]
    jobs = [SGDJob(w0, batches(c), cfg, loss=losses[c]) for c in range(5)]
    calls = []
    stacked = cohort.gradients

    def spy(w, bufs, batch, loss=None, frozen=()):
        calls.append((None if loss is None else loss.key, w.shape[0]))
        return stacked(w, bufs, batch, loss, frozen)

    cohort.gradients = spy
    cohort.sgd_many(jobs)
    for job, (w, steps, loss) in zip(jobs, alone, strict=True):
        assert job.error is None and job.result[1] == steps
        assert float((job.result[0] - w).norm() / w.norm()) < 1e-5
        assert job.result[2] == pytest.approx(loss, rel=1e-5)
    # step 0: clients 0, 1 and 4 (μ = 1) in one call, client 3 (μ = 5) and client 2 (CE) alone
    assert sorted(calls[:3], key=str) == sorted([((1.0, 0.5), 3), ((5.0, 0.5), 1), (None, 1)], key=str)
    # and the contrastive term matters: without it client 0 ends elsewhere
    plain = seq.sgd(w0, batches(0), cfg)
    assert float((plain[0] - alone[0][0]).norm() / alone[0][0].norm()) > 1e-3


def test_moon_contrastive_rounds_run_stacked():
    """In a stacked run, the second round's clients (with a previous model) reach the cohort
    with their contrastive loss instead of falling back to one at a time."""
    cfg = config_of({**BASE, "algorithm": "moon", "rounds": 2, "executor": "stacked"}, "test")
    sim = assemble(cfg, store=None, log=lambda _: None)
    stacked = sim.side.executor.cohort.sgd_many
    seen = []

    def counting(jobs, *rest):
        seen.append(sum(j.loss is not None for j in jobs))
        return stacked(jobs, *rest)

    sim.side.executor.cohort.sgd_many = counting
    sim.run()
    assert seen[0] == 0 and sum(seen[1:]) == 4
