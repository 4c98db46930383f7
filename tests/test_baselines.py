"""Baseline algorithms: FedProx, SCAFFOLD, FedNova, FedAvgM against FedAvg and hand derivations.

Engine runs use scikit-learn digits (embedded), a small MLP and a few rounds; server rules are
also checked directly on hand-made replies.
"""

from __future__ import annotations

import pytest
import torch
from quadratic import LINEAR_MODEL, run_quadratic

from fedhet.algorithms.base import ALGORITHMS
from fedhet.algorithms.fednova import normaliser
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.errors import FedhetError
from fedhet.testing import fake_replies, make, run_info, server_step
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig
from fedhet.training.steps import Proximal

BASE = {
    "dataset": "digits", "partition": "dirichlet", "clients": 5, "rounds": 3, "lr": 0.1,
    "local_steps": 4, "batch_size": 16, "model": "mlp", "model_params": {"hidden": 16},
}


def simulate(algorithm: str, **settings) -> Simulation:
    cfg = config_of({**BASE, "algorithm": algorithm, **settings})
    sim = assemble(cfg, store=None, log=lambda _: None)
    sim.run()
    return sim


def final(algorithm: str, **settings) -> torch.Tensor:
    return simulate(algorithm, **settings).final_state.w


def server(name: str, num_clients: int = 2, **params):
    return make(name, params, run_info(dim=3, num_clients=num_clients))


# -- FedProx ------------------------------------------------------------------------------
def test_fedprox_mu_zero_equals_fedavg_bit_for_bit():
    settings = {"momentum": 0.5, "weight_decay": 1e-3}
    fedavg = final("fedavg", **settings)
    fedprox = final("fedprox", algorithm_params={"mu": 0.0}, **settings)
    assert torch.equal(fedavg, fedprox)


def test_fedprox_mu_positive_differs_and_stays_closer_to_the_start():
    """The proximal term shrinks each client's drift, so the round-0 update is shorter."""
    w0 = simulate("fedavg", rounds=1).w0
    avg = final("fedavg", rounds=1)
    prox = final("fedprox", rounds=1, algorithm_params={"mu": 1.0})
    assert not torch.equal(avg, prox)
    assert (prox - w0).norm() < (avg - w0).norm()


def test_proximal_transform_adds_mu_times_distance():
    w0 = torch.tensor([1.0, 2.0, 3.0])
    w = torch.tensor([2.0, 0.0, 3.0])
    g = torch.tensor([0.5, 0.5, 0.5])
    out = Proximal(0.1, w0).apply(g.clone(), w, 0)
    assert torch.allclose(out, torch.tensor([0.6, 0.3, 0.5]))
    untouched = g.clone()
    nowhere = torch.full((3,), float("nan"))  # μ = 0 never reads the anchor
    assert Proximal(0.0, nowhere).apply(untouched, w, 0) is untouched
    assert torch.equal(untouched, g)


def test_fedprox_rejects_negative_mu():
    with pytest.raises(FedhetError, match="mu"):
        config_of({**BASE, "algorithm": "fedprox", "algorithm_params": {"mu": -1}})


# -- SCAFFOLD -----------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["I", "II"])
def test_scaffold_first_round_equals_fedavg(option):
    """Round 0 has c = c_i = 0, so the corrected step g − c_i + c is plain SGD."""
    settings = {"rounds": 1, "momentum": 0.5}
    fedavg = final("fedavg", **settings)
    scaffold = final("scaffold", algorithm_params={"option": option}, **settings)
    assert torch.equal(fedavg, scaffold)


def test_scaffold_correction_changes_later_rounds():
    assert not torch.allclose(final("fedavg"), final("scaffold"), atol=1e-6)


def test_scaffold_option_two_control_variates_after_round_zero():
    """c_i⁺ = (x − y_i)/(τ_i η) from c = c_i = 0, and c = Σ_i p_i c_i (full participation)."""
    sim = simulate("scaffold", rounds=1, client_steps=[2, 3, 4, 5, 6])
    fedavg = simulate("fedavg", rounds=1, client_steps=[2, 3, 4, 5, 6])
    x0 = sim.w0
    sizes = torch.tensor([len(ix) for ix in sim.side.client_indices], dtype=torch.float64)
    p = sizes / sizes.sum()
    c = torch.zeros_like(x0, dtype=torch.float64)
    for i, tau in enumerate([2, 3, 4, 5, 6]):
        y_i = _client_model(fedavg, i)
        expected = (x0 - y_i) / (tau * 0.1)
        assert torch.allclose(sim.side.clients.states[i].c_i, expected, atol=1e-5)
        c += p[i] * sim.side.clients.states[i].c_i.double()
    assert torch.allclose(sim.final_state.c.double(), c, atol=1e-6)


def _client_model(sim: Simulation, client_id: int) -> torch.Tensor:
    """Re-run client `client_id`'s round-0 local SGD from `w0` (same random stream)."""
    message = sim.configure(sim.side.algorithm.init(sim.w0), client_id, 0)
    return sim.w0 + sim.client_update(client_id, message, 0).tensors["delta"]


def test_scaffold_option_one_control_variates_are_full_gradients():
    """Option I: c_i = ∇F_i(x); with full participation c = Σ p_i ∇F_i(x) = ∇F(x)."""
    sim = simulate("scaffold", rounds=1, algorithm_params={"option": "I"})
    trainer = sim.side.trainer
    for i, indices in enumerate(sim.side.client_indices):
        c_i = sim.side.clients.states[i].c_i
        assert torch.allclose(c_i, trainer.full_gradient(sim.w0, indices), atol=1e-6)
    everyone = torch.cat(list(sim.side.client_indices))
    assert torch.allclose(sim.final_state.c, trainer.full_gradient(sim.w0, everyone), atol=1e-5)


def test_scaffold_single_client_follows_fedavg_and_c_is_last_mean_gradient():
    """One client, option II: c = c_1 holds after every round, so the correction c − c_1
    vanishes and SCAFFOLD takes FedAvg's steps; c after round K is (x_(K−1) − x_K)/(τη)."""
    settings = {"clients": 1, "partition": "iid", "rounds": 3}
    sim = simulate("scaffold", **settings)
    x_last = final("fedavg", **settings)
    x_before = final("fedavg", **{**settings, "rounds": 2})
    assert torch.allclose(sim.final_state.w, x_last, atol=1e-6)
    assert torch.allclose(sim.final_state.c, sim.side.clients.states[0].c_i, atol=1e-6)
    expected_c = (x_before - x_last) / (BASE["local_steps"] * BASE["lr"])
    assert torch.allclose(sim.final_state.c, expected_c, atol=1e-4)


def test_scaffold_partial_participation_scales_the_c_update():
    alg = server("scaffold", num_clients=4)
    state = alg.init(torch.zeros(3))
    replies = fake_replies(delta=torch.zeros(2, 3), delta_c=[[1.0, 0, 0], [0, 2.0, 0]],
                           num_samples=[1, 3], client_ids=[0, 2])
    state, diag = server_step(alg, state, replies)
    # c ← c + (|S|/N) Σ_S p_i Δc_i with p = (1/4, 3/4), |S|/N = 1/2
    assert torch.allclose(state.c, torch.tensor([0.125, 0.75, 0.0]))
    assert diag["c_norm"] == pytest.approx(float(state.c.norm()))


# -- FedNova ------------------------------------------------------------------------------
def test_fednova_normalisers_match_hand_values():
    assert normaliser(4) == 4.0
    # momentum ρ = 0.5, τ = 3: Σ_(t=1..3) (1 − ρ^t)/(1 − ρ) = 1 + 1.5 + 1.75
    assert normaliser(3, lr=0.1, rho=0.5) == pytest.approx(4.25)
    # proximal η μ = 0.1, τ = 3: Σ_(t=0..2) 0.9^t = 1 + 0.9 + 0.81
    assert normaliser(3, lr=0.1, mu=1.0) == pytest.approx(2.71)
    # both (ρ = 0.5, ημ = 0.1), by hand from v ← ρv + 1 + μx, x ← x − ηv:
    # v = 1, x = −0.1; v = 0.5 + 1 − 0.1 = 1.4, x = −0.24; v = 0.7 + 1 − 0.24 = 1.46,
    # x = −0.386  ⇒  a = 3.86
    assert normaliser(3, lr=0.1, rho=0.5, mu=1.0) == pytest.approx(3.86)


@pytest.mark.parametrize(("rho", "mu"), [(0.0, 0.0), (0.9, 0.0), (0.0, 0.5), (0.9, 0.5)])
def test_fednova_normaliser_is_the_weight_sum_of_real_local_sgd(rho, mu):
    """On a linear loss every gradient is the same `g`, so local SGD moves by exactly
    `Δ = −η a g`: the normaliser must match what the trainer actually does."""
    from quadratic import Linear

    model = FlatModel(Linear(3))
    e = torch.tensor([[1.0, -2.0, 0.5]])
    trainer = LocalTrainer(model, e.repeat(4, 1), torch.zeros(4, dtype=torch.long))
    w0 = torch.tensor([0.3, 0.1, -0.2])
    lr, tau = 0.05, 7
    w, _, _ = trainer.sgd(w0, [torch.arange(4)] * tau, SGDConfig(lr, rho), (Proximal(mu, w0),))
    expected = -lr * normaliser(tau, lr, rho, mu) * e[0]
    assert torch.allclose(w - w0, expected, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_fednova_one_round_on_linear_losses_matches_hand_derivation(momentum):
    """Client i's gradient is the constant e_i, so d_i = e_i and
    w_1 = w_0 − η τ_eff Σ p_i e_i with τ_eff = Σ p_i a_i(τ_i, ρ)."""
    e = torch.tensor([[1.0, 0.0], [0.0, -2.0], [3.0, 1.0]])
    sizes, steps, lr = [10, 30, 60], [2, 5, 3], 0.05
    sim = run_quadratic("fednova", e, sizes, steps, lr, 1, model=LINEAR_MODEL, momentum=momentum)
    p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
    a = torch.tensor([normaliser(t, lr, momentum) for t in steps], dtype=torch.float64)
    tau_eff = float(p @ a)
    expected = -lr * tau_eff * (p @ e.double())
    assert torch.allclose(sim.final_state.w.double(), expected, atol=1e-6)


def test_fednova_with_equal_steps_equals_fedavg():
    """Equal τ, no momentum or μ: τ_eff = τ and −η τ Σ p_i d_i = Σ p_i Δ_i."""
    fedavg = final("fedavg", rounds=4)
    fednova = final("fednova", rounds=4)
    assert torch.allclose(fedavg, fednova, atol=1e-6)


@pytest.mark.parametrize(("baseline", "settings"), [
    ("fedprox", {"algorithm_params": {"mu": 0.5}}),
    ("fedavg", {"momentum": 0.5}),
    ("fedprox", {"algorithm_params": {"mu": 0.5}, "momentum": 0.5}),
])
def test_fednova_default_tau_eff_takes_the_baselines_step_with_equal_steps(baseline, settings):
    """With equal τ_i, `τ_eff = Σ p_i a_i` makes FedNova's step FedProx's (μ > 0) or local
    momentum FedAvg's exactly; eq. 8's literal `Σ p_i τ_i` (`tau_eff="steps"`) does not."""
    base = final(baseline, rounds=3, **settings)
    nova = final("fednova", rounds=3, **settings)
    assert torch.allclose(base, nova, atol=1e-5)
    params = {**settings.get("algorithm_params", {}), "tau_eff": "steps"}
    literal = final("fednova", rounds=3, **{**settings, "algorithm_params": params})
    assert not torch.allclose(base, literal, atol=1e-3)


def test_fednova_with_heterogeneous_steps_differs_from_fedavg():
    settings = {"rounds": 2, "client_steps": [1, 2, 4, 8, 16]}
    assert not torch.allclose(final("fedavg", **settings), final("fednova", **settings), atol=1e-4)


def test_fednova_server_rule_and_momentum_on_hand_replies():
    alg = server("fednova", server_momentum=0.5)
    state = alg.init(torch.zeros(3))

    replies = fake_replies(d=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], a=[2.0, 6.0], lr=[0.1, 0.1],
                           num_samples=[1, 3])
    state, diag = server_step(alg, state, replies)
    # p = (1/4, 3/4); τ_eff = 0.5 + 4.5 = 5; step = τ_eff Σ p_i d_i = (1.25, 3.75, 0)
    assert diag["tau_eff"] == pytest.approx(5.0)
    assert diag["a"] == {0: 2.0, 1: 6.0}
    assert torch.allclose(state.w, torch.tensor([-0.125, -0.375, 0.0]))
    state, _ = server_step(alg, state, replies, round=1)
    # u = 0.5 u + step = (1.875, 5.625, 0); w = w − 0.1 u
    assert torch.allclose(state.w, torch.tensor([-0.3125, -0.9375, 0.0]))


# -- FedAvgM ------------------------------------------------------------------------------
def test_fedavgm_accumulates_momentum():
    """d_(k+1) = γ d_k + Δ̄, w_(k+1) = w_k + d_(k+1), d_0 = 0."""
    alg = server("fedavgm", gamma=0.5)
    state = alg.init(torch.zeros(2))
    deltas = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]), torch.tensor([4.0, 0.0])]
    expected_d = [(1.0, 0.0), (0.5, 2.0), (4.25, 1.0)]
    expected_w = [(1.0, 0.0), (1.5, 2.0), (5.75, 3.0)]
    for k, delta in enumerate(deltas):
        replies = fake_replies(delta=[delta * 2, torch.zeros(2)])
        state, _ = server_step(alg, state, replies, round=k)
        assert torch.allclose(state.d, torch.tensor(expected_d[k]))
        assert torch.allclose(state.w, torch.tensor(expected_w[k]))


def test_fedavgm_gamma_zero_equals_fedavg_bit_for_bit():
    assert torch.equal(final("fedavg"), final("fedavgm", algorithm_params={"gamma": 0.0}))


# -- all baselines learn --------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold", "fednova"])
def test_baselines_learn_on_digits(algorithm):
    """Five Dirichlet(0.5) clients, one local epoch, 10 rounds: FedAvg reaches about 0.89."""
    settings = {"rounds": 10, "local_steps": 0, "local_epochs": 1, "model_params": {"hidden": 64}}
    cfg = config_of({**BASE, "algorithm": algorithm, **settings})
    summary = assemble(cfg, store=None, log=lambda _: None).run()
    assert summary["final_accuracy"] > 0.8


def test_scaffold_option_two_with_momentum_is_the_weighted_mean_gradient():
    """On a linear loss every raw gradient is `e_i`, so with c = c_i = 0 (round 0) and
    momentum ρ the model moves by `−η a_i e_i`; option II must give back `c_i⁺ = e_i` exactly
    (`(x − y)/(τ_i η)` would give `(a_i/τ_i) e_i`, 2.6 e_i here)."""
    e = torch.tensor([[1.0, -2.0, 0.5], [0.5, 0.0, -1.0]])
    sim = run_quadratic("scaffold", e, [4, 4], [5, 5], 0.05, 1, model=LINEAR_MODEL, momentum=0.9)
    for i in range(2):
        assert torch.allclose(sim.side.clients.states[i].c_i, e[i], atol=1e-5)


def test_scaffold_with_momentum_learns_as_well_as_fedavg():
    """Digits MLP, 10 Dirichlet clients, momentum 0.9, 2 local epochs: a setting in which option
    II divided by `τ_i η` instead of `a_i η` sends ‖c‖ to NaN by round 8 (scaffold.py's module
    doc); SCAFFOLD must learn as well as FedAvg."""
    settings = {
        "clients": 10, "rounds": 12, "lr": 0.01, "momentum": 0.9, "batch_size": 16,
        "local_epochs": 2, "local_steps": 0, "model_params": {}, "eval_every": 12,
    }
    accuracy = {}
    for name in ("scaffold", "fedavg"):
        cfg = config_of({**BASE, "algorithm": name, **settings})
        summary = assemble(cfg, store=None, log=lambda _: None).run()
        accuracy[name] = summary["final_accuracy"]
    assert accuracy["scaffold"] > 0.8
    assert accuracy["scaffold"] > accuracy["fedavg"] - 0.03


@pytest.mark.parametrize("name", ["fedavgm", "fednnnn", "norm-norm"])
def test_gamma_is_a_deprecated_alias_of_server_momentum(name, capsys):
    """One name per quantity: the deprecated `gamma` gives the same parameters with a note on stderr;
    giving both is an error."""
    from fedhet.registry import _WARNED

    _WARNED.clear()
    old = ALGORITHMS.params(name, {"gamma": 0.55})
    assert old == ALGORITHMS.params(name, {"server_momentum": 0.55})
    assert "algorithm.gamma is deprecated; use algorithm.server_momentum" in capsys.readouterr().err
    with pytest.raises(FedhetError, match="same parameter"):
        ALGORITHMS.params(name, {"gamma": 0.5, "server_momentum": 0.5})


def test_a_run_saved_with_the_old_name_resumes(tmp_path):
    """config.json written before the rename says `gamma`: the checkpoint still matches."""
    import json

    from fedhet.runs.single import execute

    out = tmp_path / "r"
    settings = {**BASE, "algorithm": "fedavgm", "rounds": 2, "algorithm.server_momentum": 0.5}
    execute(settings, out, log=lambda _: None)
    cfg = json.loads((out / "config.json").read_text())
    cfg["algorithm_params"]["gamma"] = cfg["algorithm_params"].pop("server_momentum")
    (out / "config.json").write_text(json.dumps(cfg))
    summary = execute({"rounds": 3}, out, resume=True, log=lambda _: None)
    assert summary["rounds_done"] == 3
    from fedhet.engine.config import RECORD_KEYS
    from fedhet.engine.simulation import check_resumable

    saved = json.loads((out / "config.json").read_text())  # the settings, and their record
    current = {k: v for k, v in saved.items() if k not in RECORD_KEYS}
    check_resumable(cfg, current)  # old names, same run
