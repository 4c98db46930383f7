"""FedAdagrad, FedYogi, FedAdam (Reddi et al., ICLR 2021, Algorithm 2; fedhet.algorithms.fedopt).

The server update against the paper's equations computed by hand over two rounds, against
Flower's own strategies fed the same client deltas, the messages FedAvg sends, and runs on
digits that learn. Sequential = stacked, two workers = one, checkpoints and Flower's message
path are in tests/test_executors.py, test_workers.py, test_states.py and test_flower.py (their
harnesses cover every registered algorithm).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhet.algorithms.base import ALGORITHMS, Message, Reply, RunInfo
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of

SIZES = (1.0, 3.0)
"""Two clients' sample counts: `p = (1/4, 3/4)`."""

DELTAS = [
    np.array([[0.2, -0.05, 0.1, 0.0], [0.1, 0.05, -0.3, 0.0]]),
    np.array([[-0.1, 0.02, 0.4, 0.01], [0.3, -0.02, 0.0, -0.01]]),
]
"""Round t's client deltas (one row per client). Round 0's Δ_0 = (0.125, 0.025, −0.2, 0): with
τ = 0.1 (`v_(−1) = 0.01`) Yogi's `v_(−1) − Δ²` is positive in coordinates 1, 2, 4 and negative in
coordinate 3, so both signs of its update are exercised."""


def algorithm(name: str, **params):
    entry = ALGORITHMS.get(name)
    run = RunInfo(num_clients=2, rounds=2, lr=0.1, momentum=0.0, weight_decay=0.0, seed=0,
                  dim=4, layers=())
    return entry.factory(entry.params(**params), run)


def replies(deltas: np.ndarray) -> list[Reply]:
    return [Reply(i, Message({"delta": torch.tensor(d, dtype=torch.float32)},
                             {"num_samples": n, "steps": 1.0, "train_loss": 0.0}))
            for i, (d, n) in enumerate(zip(deltas, SIZES, strict=True))]


def by_hand(rule: str, x: np.ndarray, eta: float, beta1: float, beta2: float, tau: float,
            v0: float) -> list[np.ndarray]:
    """Algorithm 2 written out in float64: the model after each round of `DELTAS`."""
    m, v, out = np.zeros_like(x), np.full_like(x, v0), []
    for deltas in DELTAS:
        delta = (SIZES[0] * deltas[0] + SIZES[1] * deltas[1]) / sum(SIZES)
        m = beta1 * m + (1 - beta1) * delta
        if rule == "adagrad":
            v = v + delta**2
        elif rule == "yogi":
            v = v - (1 - beta2) * delta**2 * np.sign(v - delta**2)
        else:
            v = beta2 * v + (1 - beta2) * delta**2
        x = x + eta * m / (np.sqrt(v) + tau)
        out.append(x)
    return out


@pytest.mark.parametrize(("name", "rule", "beta1"), [
    ("fedadagrad", "adagrad", 0.5), ("fedyogi", "yogi", 0.9), ("fedadam", "adam", 0.9),
])
def test_two_rounds_follow_algorithm_2_by_hand(name, rule, beta1):
    params = {"server_lr": 0.3, "beta1": beta1, "tau": 0.1}
    if rule != "adagrad":
        params["beta2"] = 0.99
    algo = algorithm(name, **params)
    x0 = np.array([1.0, -2.0, 0.5, 0.0])
    state = algo.init(torch.tensor(x0, dtype=torch.float32))
    assert torch.equal(state.v, torch.full((4,), 0.1**2))  # v_(−1) = τ²
    expected = by_hand(rule, x0, 0.3, beta1, 0.99, 0.1, v0=0.01)
    for t, deltas in enumerate(DELTAS):
        state, diag = algo.aggregate(state, t, iter(replies(deltas)))
        assert state.t == t + 1
        np.testing.assert_allclose(state.w.numpy(), expected[t], rtol=1e-6, atol=1e-6)
        assert diag["pseudo_grad_norm"] == pytest.approx(
            float(np.linalg.norm((deltas[0] + 3 * deltas[1]) / 4)), rel=1e-6)
    other = by_hand(rule, x0, 0.3, beta1, 0.99, 0.1, v0=0.0)[-1]
    assert np.abs(other - expected[-1]).max() > 1e-3  # the τ² start is visible here


def test_fedadam_first_step_by_number():
    """One coordinate, Δ_0 = 0.2, η = 1, β1 = 0.9, β2 = 0.99, τ = 0.1: m_0 = 0.02,
    v_0 = 0.99·0.01 + 0.01·0.04 = 0.0103, x_1 = 0.02/(√0.0103 + 0.1) = 0.0992610…"""
    algo = algorithm("fedadam", server_lr=1.0, tau=0.1)
    state = algo.init(torch.zeros(1))
    reply = Reply(0, Message({"delta": torch.tensor([0.2])},
                             {"num_samples": 5.0, "steps": 1.0, "train_loss": 0.0}))
    state, _ = algo.aggregate(state, 0, iter([reply]))
    assert float(state.m) == pytest.approx(0.02, rel=1e-6)
    assert float(state.v) == pytest.approx(0.0103, rel=1e-6)
    assert float(state.w) == pytest.approx(0.02 / (math.sqrt(0.0103) + 0.1), rel=1e-6)
    assert float(state.w) == pytest.approx(0.0992610, abs=1e-7)


@pytest.mark.parametrize("name", ["fedadagrad", "fedyogi", "fedadam"])
def test_equals_flowers_strategy_fed_the_same_deltas(name):
    """Flower's `FedAdagrad`, `FedYogi` and `FedAdam` (flwr 1.41) start from `v = 0` and FedAdam
    bias-corrects `η` with exponent `server_round + 1`: fedhet matches with `v_init="zero"`,
    FedAdam's `bias_correction=true`, and Flower called with `server_round = t`, fedhet's steps
    taken so far (a Flower run calls round 1 first, one step ahead of Kingma & Ba's `t`).
    Flower's FedAdagrad has no momentum (`β1 = 0`), fedhet's default."""
    flwr = pytest.importorskip("flwr")
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import strategy

    rng = np.random.default_rng(3)
    shapes = [(3, 4), (5,)]
    w0 = [rng.normal(size=s).astype(np.float32) for s in shapes]
    knobs = {"eta": 0.05, "tau": 1e-3}
    ours = {"server_lr": 0.05, "tau": 1e-3, "v_init": "zero"}
    if name != "fedadagrad":
        knobs |= {"beta_1": 0.8, "beta_2": 0.95}
        ours |= {"beta1": 0.8, "beta2": 0.95}
    if name == "fedadam":
        ours["bias_correction"] = True
    cls = {"fedadagrad": strategy.FedAdagrad, "fedyogi": strategy.FedYogi,
           "fedadam": strategy.FedAdam}[name]
    theirs = cls(initial_parameters=ndarrays_to_parameters(w0), **knobs)
    entry = ALGORITHMS.get(name)
    run = RunInfo(num_clients=3, rounds=3, lr=0.1, momentum=0.0, weight_decay=0.0, seed=0,
                  dim=17, layers=())
    algo = entry.factory(entry.params(**ours), run)
    state = algo.init(torch.from_numpy(np.concatenate([a.ravel() for a in w0])))
    sizes = [10, 30, 60]
    assert flwr.__version__.startswith(("1.41", "1.42"))
    for t in range(3):
        deltas = [rng.normal(scale=0.05, size=17).astype(np.float32) for _ in sizes]
        current = theirs.current_weights
        results = []
        for d, n in zip(deltas, sizes, strict=True):
            parts = np.split(d, [12])
            params = [c + p.reshape(c.shape) for c, p in zip(current, parts, strict=True)]
            results.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(params), n, {})))
        aggregated, _ = theirs.aggregate_fit(t, results, [])
        flat = np.concatenate([a.ravel() for a in parameters_to_ndarrays(aggregated)])
        state, _ = algo.aggregate(state, t, iter([
            Reply(i, Message({"delta": torch.from_numpy(d)},
                             {"num_samples": float(n), "steps": 1.0, "train_loss": 0.0}))
            for i, (d, n) in enumerate(zip(deltas, sizes, strict=True))
        ]))
        np.testing.assert_allclose(state.w.numpy(), flat, rtol=1e-5, atol=2e-6)
        np.testing.assert_allclose(state.v.numpy(), np.concatenate([a.ravel() for a in theirs.v_t]),
                                   rtol=1e-4, atol=1e-9)


DIGITS = {"dataset": "digits", "clients": 10, "rounds": 10, "seed": 0, "partition.alpha": 0.5,
          "executor": "sequential", "workers": 1}


def _final(settings: dict) -> tuple[float, dict]:
    rows: list[dict] = []
    sim = assemble(config_of({**DIGITS, **settings}), log=lambda _: None, callbacks=[rows.append])
    summary = sim.run()
    return summary["final_accuracy"], rows[-1]


def test_the_messages_are_fedavgs():
    """The adaptive step is the server's alone: FedAdam's runs send the bytes FedAvg's do,
    each way, and its downlink is the model alone."""
    small = {"rounds": 2, "clients": 4}
    sims = {}
    for name in ("fedavg", "fedadam"):
        sim = assemble(config_of({**DIGITS, **small, "algorithm": name}), log=lambda _: None)
        sim.run()
        sims[name] = sim
    assert sims["fedadam"].parts.comm.state() == sims["fedavg"].parts.comm.state()
    algo = sims["fedadam"].side.algorithm
    state = sims["fedadam"].final_state
    assert set(algo.configure(state, 0, 2).tensors) == {"w"}


@pytest.mark.parametrize(("name", "params"), [
    ("fedadam", {"algorithm.server_lr": 0.01}),
    ("fedyogi", {"algorithm.server_lr": 0.03}),
    ("fedadagrad", {"algorithm.server_lr": 0.03}),
])
def test_adaptive_servers_learn_digits(name, params):
    """10 clients, Dirichlet α = 0.5, 10 rounds: FedAvg at η = 0.05 reaches ~0.3 (measured);
    each adaptive server, from the same clients, well above it."""
    base, _ = _final({"algorithm": "fedavg"})
    acc, row = _final({"algorithm": name, **params})
    assert acc > 0.75 and acc > base + 0.3, (acc, base)
    assert row["pseudo_grad_norm"] > 0


def test_the_server_step_composes_with_another_fedavg_family_aggregate():
    """`AdaptiveServer` before MOON: MOON's clients and average, FedAdam's step on top. Round 0
    of both runs trains the same clients from the same model, so MOON's own round gives the
    pseudo-gradient `Δ_0` and the composed run must land on the Adam step from it."""
    from dataclasses import dataclass

    from fedhet.algorithms.fedopt import AdaptiveServer, server_step
    from fedhet.algorithms.moon import Moon, MoonParams

    @dataclass(frozen=True)
    class MoonAdamParams(MoonParams):
        server_lr: float = 0.01
        beta1: float = 0.9
        beta2: float = 0.99
        tau: float = 1e-3
        v_init: str = "tau2"
        bias_correction: bool = False

    class MoonAdam(AdaptiveServer, Moon):
        name = "moon-adam-test"
        rule = "adam"
        Params = MoonAdamParams

    cfg = config_of({**DIGITS, "rounds": 1, "clients": 4, "algorithm": "moon", "model": "moon-mlp"})
    moon = assemble(cfg, log=lambda _: None)
    w0 = moon.side.algorithm.init(moon.side.model.params.clone()).w
    moon.run()
    composed = assemble(cfg, algorithm=MoonAdam, log=lambda _: None)
    composed.run()
    state = composed.final_state
    delta = moon.final_state.w - w0
    expected, m, _ = server_step("adam", w0, delta, torch.zeros_like(w0), torch.full_like(w0, 1e-6),
                                 0, 0.01, 0.9, 0.99, 1e-3)
    assert type(state).__name__ == "FedOptState" and state.t == 1
    assert torch.allclose(state.m, m, atol=1e-7)
    assert torch.allclose(state.w, expected, atol=1e-5)
    assert (state.w - moon.final_state.w).abs().max() > 1e-3  # not MOON's own step
