"""`fedhet.testing`: the kit itself, and FedAvg, FedNova and SCAFFOLD checked with it against
hand computations (docs/spec.md "FedAvg", "FedNova", "SCAFFOLD").

The fake clients train `LeastSquares` (`½ (wᵀx − y)²`) on a few samples with full batches
(`batch_size` ≥ the client's samples), so each local step is `w ← w − η Xᵀ(Xw − y)/D_i` and the
tests replay it in float64.
"""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest
import torch

import fedhet.testing
from fedhet.algorithms.base import Algorithm, Message
from fedhet.algorithms.fedavg import FedAvg
from fedhet.errors import FedhetError
from fedhet.testing import (
    client_step,
    fake_clients,
    fake_context,
    fake_replies,
    fake_reply,
    least_squares_gradient,
    local_loss,
    make,
    one_round,
    run_info,
    server_step,
)


def data_of(ctx):
    return ctx.trainer.x[ctx.indices], ctx.trainer.y[ctx.indices]


def local_gd(ctx, w0, steps, lr, rho=0.0, shift=None):
    """`steps` full-batch heavy-ball steps `v ← ρ v + g − c_i + c`, `w ← w − η v` in float64
    (`shift` is `c − c_i`)."""
    x, y = data_of(ctx)
    w, v = w0.double().clone(), torch.zeros_like(w0, dtype=torch.float64)
    for _ in range(steps):
        g = least_squares_gradient(x, y, w)
        if shift is not None:
            g = g + shift.double()
        v = rho * v + g
        w = w - lr * v
    return w


# -- the kit --------------------------------------------------------------------------------------
def test_the_docstring_examples_hold():
    failures, tried = doctest.testmod(fedhet.testing, optionflags=doctest.ELLIPSIS)
    assert tried > 10 and failures == 0


@pytest.mark.parametrize("classes", [0, 3])
def test_a_fake_clients_update_lowers_its_loss(classes):
    ctx = fake_context(samples=24, features=4, classes=classes, tau=30, batch_size=8, lr=0.3)
    fedavg = make("fedavg", run=run_info(context=ctx))
    w0 = ctx.trainer.model.params.clone()
    reply, _ = client_step(fedavg, fedavg.configure(fedavg.init(w0), 0, 0), ctx)
    assert reply.scalars["steps"] == 30 and reply.scalars["num_samples"] == 24
    assert local_loss(ctx, w0 + reply.tensors["delta"]) < 0.5 * local_loss(ctx, w0)


def test_a_fake_clients_local_steps_are_gradient_descent_on_its_data():
    ctx = fake_context(samples=6, features=3, tau=4, batch_size=6, lr=0.2, seed=3)
    fedavg = make("fedavg")
    w0 = torch.tensor([0.5, -1.0, 0.25])
    reply, _ = client_step(fedavg, Message({"w": w0}), ctx)
    expected = local_gd(ctx, w0, 4, 0.2) - w0.double()
    assert torch.allclose(reply.tensors["delta"].double(), expected, atol=1e-6)


def test_fake_clients_share_one_trainer_over_their_own_slices():
    a, b, c = fake_clients(3, sizes=[2, 3, 5], tau=[1, 2, 3], lr=0.3, momentum=0.5)
    assert a.trainer is b.trainer is c.trainer
    assert [ctx.indices.tolist() for ctx in (a, b, c)] == [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9]]
    assert [ctx.tau for ctx in (a, b, c)] == [1, 2, 3]
    assert (c.sgd.lr, c.sgd.momentum) == (0.3, 0.5)
    info = run_info(context=a, num_clients=3)
    assert (info.dim, info.lr, info.momentum, info.num_clients) == (3, 0.3, 0.5, 3)


def test_fake_replies_are_columns_of_one_length():
    with pytest.raises(ValueError, match="one length"):
        fake_replies(delta=[[1.0], [2.0]], num_samples=[1, 2, 3])
    r = fake_reply(2, G=torch.ones(2), tau=3)
    assert r.message.tensors["G"].tolist() == [1.0, 1.0]
    assert r.message.scalars == {"num_samples": 1.0, "tau": 3.0}


def test_make_validates_parameters_and_takes_a_class():
    with pytest.raises(FedhetError, match=r"server_momentum \(γ\) must be in \[0, 1\)"):
        make("fedavgm", {"server_momentum": 1.5})
    with pytest.raises(FedhetError, match="unknown parameter algorithm.gama"):
        make("fedavgm", {"gama": 0.5})
    assert make(FedAvg, {"weighting": "uniform"}).params.weighting == "uniform"

    class Mine(FedAvg):
        pass

    assert make(Mine, "anything").params == "anything"


def test_server_step_catches_an_aggregate_that_changes_the_state_in_place():
    class InPlace(FedAvg):
        def aggregate(self, state, round, replies):
            for r in replies:
                state.w.add_(r.message.tensors["delta"])
            return state, {}

    alg = make(InPlace)
    with pytest.raises(AssertionError, match="in place"):
        server_step(alg, alg.init(torch.zeros(2)), fake_replies(delta=[[1.0, 1.0]]))


def test_client_step_catches_an_update_that_changes_the_message_in_place():
    class Drifting(Algorithm):
        def client_update(self, message, ctx, state):
            w = message.tensors["w"]
            w.sub_(0.1)
            return Message({"delta": -0.1 * torch.ones_like(w)}, {"num_samples": 1.0}), state

    alg = make(Drifting)
    with pytest.raises(AssertionError, match="in place"):
        client_step(alg, Message({"w": torch.zeros(3)}), fake_context())


# -- FedAvg: w ← w + Σ p_i Δ_i, p_i = D_i / Σ D_j -------------------------------------------------
def test_fedavg_aggregate_is_the_sample_weighted_mean_of_the_deltas():
    fedavg = make("fedavg", run=run_info(dim=2, num_clients=3))
    state = fedavg.init(torch.tensor([1.0, 1.0]))
    replies = fake_replies(delta=[[2.0, 0.0], [0.0, 4.0], [-1.0, 1.0]], num_samples=[1, 3, 4],
                           steps=[2, 6, 8], client_ids=[0, 4, 7])
    new, diag = server_step(fedavg, state, replies)
    # p = (1/8, 3/8, 4/8): Σ p_i Δ_i = (2/8 − 4/8, 12/8 + 4/8) = (−0.25, 2)
    assert torch.allclose(new.w, torch.tensor([0.75, 3.0]))
    assert diag["local_steps_mean"] == pytest.approx((2 + 18 + 32) / 8)
    uniform = make("fedavg", {"weighting": "uniform"})
    new, _ = server_step(uniform, state, replies)
    assert torch.allclose(new.w, torch.tensor([1 + 1 / 3, 1 + 5 / 3]))


def test_fedavg_round_on_fake_clients_matches_hand_gradient_descent():
    clients = fake_clients(3, sizes=[2, 3, 5], tau=[1, 3, 2], batch_size=8, lr=0.1, seed=1)
    fedavg = make("fedavg", run=run_info(context=clients[0], num_clients=3))
    w0 = torch.tensor([0.2, -0.4, 0.6])
    out = one_round(fedavg, fedavg.init(w0), clients)
    p = torch.tensor([2, 3, 5], dtype=torch.float64) / 10
    ends = [local_gd(ctx, w0, ctx.tau, 0.1) for ctx in clients]
    expected = sum(p_i * w_i for p_i, w_i in zip(p, ends, strict=True))
    assert torch.allclose(out.state.w.double(), expected, atol=1e-6)
    assert [r.client_id for r in out.replies] == [0, 1, 2]


# -- FedNova: w ← w − η τ_eff Σ p_i d_i, d_i = −Δ_i/(η a_i), τ_eff = Σ p_i a_i ---------------------
def momentum_normaliser(tau: int, rho: float) -> float:
    """`a_i = Σ_(t=1..τ) (1 − ρ^t)/(1 − ρ)` (docs/spec.md "FedNova"), or `τ` without momentum."""
    return float(tau) if rho == 0 else sum((1 - rho**t) / (1 - rho) for t in range(1, tau + 1))


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_fednova_round_is_normalised_averaging_by_hand(rho):
    """`w_1 = w_0 + τ_eff Σ p_i Δ_i / a_i`, with each `Δ_i` replayed by hand; heterogeneous
    `τ_i` makes it differ from FedAvg's `Σ p_i Δ_i`."""
    lr, sizes, taus = 0.05, [2, 4, 6], [1, 2, 5]
    clients = fake_clients(3, sizes=sizes, tau=taus, batch_size=8, lr=lr, momentum=rho, seed=2)
    fednova = make("fednova", run=run_info(context=clients[0], num_clients=3))
    w0 = torch.tensor([1.0, 0.0, -1.0])
    out = one_round(fednova, fednova.init(w0), clients)
    p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
    a = [momentum_normaliser(t, rho) for t in taus]
    deltas = [local_gd(ctx, w0, t, lr, rho) - w0.double() for ctx, t in zip(clients, taus, strict=True)]
    tau_eff = sum(p_i * a_i for p_i, a_i in zip(p.tolist(), a, strict=True))
    expected = w0.double() + tau_eff * sum(p_i * d / a_i for p_i, d, a_i in zip(p, deltas, a, strict=True))
    assert out.diagnostics["tau_eff"] == pytest.approx(tau_eff)
    assert torch.allclose(out.state.w.double(), expected, atol=1e-6)
    fedavg = w0.double() + sum(p_i * d for p_i, d in zip(p, deltas, strict=True))
    assert not torch.allclose(out.state.w.double(), fedavg, atol=1e-3)


def test_fednova_aggregate_with_uniform_weights_and_eq8_tau_eff():
    """`weighting=uniform`, `tau_eff=steps` (eq. 8 as written): `τ_eff = mean τ_i`."""
    fednova = make("fednova", {"weighting": "uniform", "tau_eff": "steps"}, run_info(dim=2))
    replies = fake_replies(d=[[1.0, 0.0], [0.0, 1.0]], a=[2.0, 3.0], steps=[2, 4],
                           lr=[0.1, 0.1], num_samples=[1, 9])
    new, diag = server_step(fednova, fednova.init(torch.zeros(2)), replies)
    # τ_eff = (2 + 4)/2 = 3; w = −0.1 · 3 · (0.5, 0.5)
    assert diag["tau_eff"] == pytest.approx(3.0)
    assert torch.allclose(new.w, torch.tensor([-0.15, -0.15]))


# -- SCAFFOLD (option II): c_i⁺ = c_i − c + (x − y_i)/(K η) ----------------------------------------
@pytest.mark.parametrize("first_round", [True, False])
def test_scaffold_client_update_option_two_by_hand(first_round):
    lr, k = 0.1, 4
    ctx = fake_context(samples=5, features=3, tau=k, batch_size=5, lr=lr, seed=4)
    scaffold = make("scaffold", run=run_info(context=ctx))
    x = torch.tensor([0.3, -0.2, 0.1])
    c = torch.tensor([0.5, 0.0, -0.5])
    c_i = None if first_round else torch.tensor([0.1, 0.2, 0.3])
    state = replace(scaffold.client_init(0), c_i=c_i)
    reply, new_state = client_step(scaffold, scaffold.configure(replace(scaffold.init(x), c=c), 0, 0),
                                   ctx, state)
    c_old = torch.zeros(3) if c_i is None else c_i
    y = local_gd(ctx, x, k, lr, shift=c - c_old)
    c_new = c_old.double() - c.double() + (x.double() - y) / (k * lr)
    assert torch.allclose(reply.tensors["delta"].double(), y - x.double(), atol=1e-6)
    assert torch.allclose(new_state.c_i.double(), c_new, atol=1e-5)
    assert torch.allclose(reply.tensors["delta_c"].double(), c_new - c_old.double(), atol=1e-5)


def test_scaffold_aggregate_with_partial_participation_and_a_server_step_size():
    """`x ← x + η_g Σ_S p_i Δy_i`, `c ← c + (|S|/N) Σ_S p_i Δc_i` with the same `p_i`."""
    scaffold = make("scaffold", {"server_lr": 0.5}, run_info(dim=2, num_clients=6))
    replies = fake_replies(delta=[[4.0, 0.0], [0.0, 4.0]], delta_c=[[2.0, 0.0], [0.0, 2.0]],
                           num_samples=[1, 3], client_ids=[1, 4])
    new, diag = server_step(scaffold, scaffold.init(torch.ones(2)), replies)
    # p = (1/4, 3/4): Σ p Δy = (1, 3), Σ p Δc = (0.5, 1.5); |S|/N = 1/3
    assert torch.allclose(new.w, torch.tensor([1.5, 2.5]))
    assert torch.allclose(new.c, torch.tensor([1 / 6, 0.5]))
    assert diag["c_norm"] == pytest.approx(float(new.c.norm()))


def test_scaffold_with_one_client_keeps_c_equal_to_its_c_i_round_after_round():
    """With one client `c = c_1` after every round (docs/spec.md "SCAFFOLD"): `one_round` hands
    each client's state to its next round."""
    (ctx,) = fake_clients(1, samples=6, tau=3, batch_size=6, lr=0.1)
    scaffold = make("scaffold", run=run_info(context=ctx, num_clients=1))
    state, states = scaffold.init(torch.zeros(3)), None
    for k in range(3):
        out = one_round(scaffold, state, [ctx], round=k, client_states=states)
        state, states = out.state, out.client_states
        assert torch.allclose(state.c, states[0].c_i, atol=1e-6)
    assert local_loss(ctx, state.w) < local_loss(ctx, torch.zeros(3))
