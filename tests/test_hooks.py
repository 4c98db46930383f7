"""Per-step hooks run stacked: BHerd's gradient store and herding, GraB's balancing and FedVeca's
estimates give in a cohort what they give one client at a time, and the cohort runs each kind
once per step for the whole stack."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhet.algorithms.bherd import (
    HerdStore,
    centred_gram,
    centred_grams,
    herding_order_direct,
    herding_order_gram,
    herding_orders,
)
from fedhet.algorithms.fedveca import LocalEstimates
from fedhet.algorithms.grab import Balancer, grab_current_unit, grab_init
from fedhet.models.mlp import MLPParams
from fedhet.models.registry import build_model
from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.hooks import GradientStore, StackedHook
from fedhet.training.local import LocalTrainer, SGDConfig

PLANS = [(0, 40, 5), (40, 64, 2), (64, 100, 7), (100, 120, 4)]
"""(first sample, end, τ) per client: unequal τ, so clients leave the stack at different steps."""


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = FlatModel(build_model("mlp", (1, 8, 8), 4, MLPParams(hidden=12)))
    x, y = torch.randn(120, 1, 8, 8), torch.randint(0, 4, (120,))
    return model, x, y, model.params.clone()


def batches(trainer: LocalTrainer, a: int, b: int, tau: int, seed: int):
    return trainer.batches(torch.arange(a, b), 8, tau, np.random.default_rng(seed))


def alone_and_stacked(setup, make_hook, count=None):
    """Run each plan alone (`LocalTrainer.sgd`) and all together (`CohortTrainer.sgd_many`) with
    a fresh hook from `make_hook(client)`; return the hooks, the results and the stacked calls."""
    model, x, y, w0 = setup
    seq, cohort = LocalTrainer(model, x, y), CohortTrainer(model, x, y)
    cfg = SGDConfig(0.1)
    alone, results = [], []
    for c, (a, b, tau) in enumerate(PLANS):
        hook = make_hook(c)
        results.append(seq.sgd(w0, batches(seq, a, b, tau, c), cfg, on_step=hook))
        alone.append(hook)
    together = [make_hook(c) for c in range(len(PLANS))]
    if count is not None:
        count(together)
    jobs = [SGDJob(w0, batches(seq, a, b, tau, c), cfg, on_step=together[c])
            for c, (a, b, tau) in enumerate(PLANS)]
    cohort.sgd_many(jobs)
    for job, (w, steps, _) in zip(jobs, results, strict=True):
        assert job.error is None
        assert job.result[1] == steps
        assert torch.allclose(job.result[0], w, rtol=1e-5, atol=1e-6)
    return alone, together


def count_stacked_calls(cls, monkeypatch):
    """Patch `cls.stack` so that the stacked hooks it makes record `(step, rows)` per call."""
    calls = []
    original = cls.stack.__func__

    class Counting(StackedHook):
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, step, w, g):
            calls.append((step, w.shape[0]))
            self.inner(step, w, g)

        def leave(self, members, steps):
            self.inner.leave(members, steps)

    monkeypatch.setattr(cls, "stack", classmethod(lambda klass, hooks: Counting(original(klass, hooks))))
    return calls


def test_gradient_store_stacked_keeps_each_clients_rows(setup, monkeypatch):
    calls = count_stacked_calls(HerdStore, monkeypatch)
    model = setup[0]
    alone, together = alone_and_stacked(setup, lambda c: HerdStore(PLANS[c][2], model.dim))
    for a, t, (_, _, tau) in zip(alone, together, PLANS, strict=True):
        assert a.rows().shape == t.rows().shape == (tau, model.dim)
        assert torch.allclose(a.rows(), t.rows(), rtol=1e-5, atol=1e-6)
        assert a.order is None  # alone, the order is computed by herd_select later
        assert t.order.tolist() == herding_order_gram(centred_gram(t.rows())).tolist()
    # one stacked call per step of the longest client, the stack shrinking as clients finish
    assert [n for _, n in calls] == [4, 4, 3, 3, 2, 1, 1]


def test_centred_grams_and_herding_orders_batch_what_one_client_does():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 9, 30, generator=g)
    x[2, 4] = x[2, 1]  # a tie inside one client: z^1 = z^4
    grams = centred_grams(x)
    for c in range(5):
        z = x[c].double() - x[c].double().mean(0)
        assert torch.allclose(grams[c], z @ z.T, atol=1e-10)
        assert torch.allclose(grams[c], centred_gram(x[c]), atol=1e-12)
    orders = herding_orders(grams)
    for c in range(5):
        assert orders[c].tolist() == herding_order_direct(x[c]).tolist()
    # the hand example of test_bherd: two opposite pairs, ties to the lowest index
    hand = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-2.0, 0.0], [0.0, -1.0]])
    assert herding_orders(centred_grams(hand.unsqueeze(0)))[0].tolist() == [1, 3, 0, 2]


def test_fedveca_estimates_stacked_equal_alone(setup, monkeypatch):
    calls = count_stacked_calls(LocalEstimates, monkeypatch)
    model = setup[0]
    torch.manual_seed(5)
    w0 = setup[3]
    grads = [torch.randn(model.dim) for _ in PLANS]
    prev = [torch.randn(model.dim), None, torch.zeros(model.dim), torch.randn(model.dim)]
    alone, together = alone_and_stacked(setup, lambda c: LocalEstimates(w0, grads[c], prev[c]))
    for c, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert a.steps == t.steps == PLANS[c][2]
        assert torch.allclose(a.direction(), t.direction(), rtol=1e-5, atol=1e-7)
        for name in ("beta", "delta"):
            va, vt = getattr(a, name), getattr(t, name)
            if prev[c] is None:
                assert math.isnan(va) and math.isnan(vt)  # round 0: no estimate
            elif name == "delta" and c == 2:
                assert va == vt == math.inf  # ‖∇F(w_(k−1))‖ = 0
            else:
                assert vt == pytest.approx(va, rel=1e-5) and math.isfinite(va)
    assert len(calls) == max(tau for *_, tau in PLANS)


def test_fedveca_estimates_hand_computed():
    """Three steps of a 2-d client: `β = max_λ ‖∇F_i − g^λ‖ / ‖w_0 − w^λ‖`,
    `δ = max_λ ‖Σ_(s≤λ) g^s‖² / ((λ+1) ‖∇F‖²)` over `λ ≥ 1`."""
    w0, grad, prev = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 2.0])
    est = LocalEstimates(w0, grad, prev)
    est(0, w0, torch.tensor([1.0, 0.0]), 0.0)
    assert math.isnan(est.beta) and math.isnan(est.delta)  # λ = 0 has w = w_0
    est(1, torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0]), 0.0)
    assert est.beta == pytest.approx(1.0 / 0.5)  # ‖(1, 0)‖ / ‖(0, −0.5)‖
    assert est.delta == pytest.approx(2.0 / (2 * 4.0))  # ‖(1, 1)‖² / (2 · 4)
    assert est.direction().tolist() == [0.5, 0.5]
    # λ = 2: β candidate ‖(2, 2)‖ / ‖(0, −2)‖ = √2 < 2 and δ candidate 0: both maxima stay
    est(2, torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -1.0]), 0.0)
    assert (est.beta, est.delta) == (pytest.approx(2.0), pytest.approx(0.25))
    assert est.steps == 3 and est.direction().tolist() == [0.0, 0.0]


def grab_hooks(model, crop: bool):
    """A GraB client per plan whose units are its fixed mini-batches, τ crossing an epoch end."""
    per_epoch = [(b - a) // 8 for a, b, _ in PLANS]
    states = [grab_init(n, model.dim) for n in per_epoch]
    hooks = [Balancer(st, GradientStore(tau + 3, model.dim) if crop and c % 2 == 0 else None)
             for c, (st, (*_, tau)) in enumerate(zip(states, PLANS, strict=True))]
    return hooks


def run_grab(setup, crop: bool, stacked: bool):
    model, x, y, w0 = setup
    seq = LocalTrainer(model, x, y)
    hooks = grab_hooks(model, crop)
    cfg = SGDConfig(0.1)

    def unit_stream(c):
        a, b, tau = PLANS[c]
        units = [torch.arange(a + 8 * u, a + 8 * (u + 1)) for u in range((b - a) // 8)]
        for _ in range(tau + 3):  # τ + 3 steps: every client ends at least one epoch
            yield units[grab_current_unit(hooks[c].state)]

    if stacked:
        jobs = [SGDJob(w0, unit_stream(c), cfg, on_step=h) for c, h in enumerate(hooks)]
        CohortTrainer(model, x, y).sgd_many(jobs)
        assert all(j.error is None for j in jobs)
    else:
        for c, h in enumerate(hooks):
            seq.sgd(w0, unit_stream(c), cfg, on_step=h)
    return hooks


@pytest.mark.parametrize("crop", [False, True])
def test_grab_balancing_stacked_equals_alone(setup, crop, monkeypatch):
    alone = run_grab(setup, crop, stacked=False)
    calls = count_stacked_calls(Balancer, monkeypatch)
    together = run_grab(setup, crop, stacked=True)
    assert calls and len(calls) == max(tau for *_, tau in PLANS) + 3
    for a, t in zip(alone, together, strict=True):
        assert a.plus == t.plus and len(a.plus) > len(a.state.order)
        sa, st = a.state, t.state
        assert sa.order.tolist() == st.order.tolist() and sa.next.tolist() == st.next.tolist()
        assert (sa.pos, sa.left, sa.right) == (st.pos, st.left, st.right)
        for name in ("mean", "s", "epoch_sum"):
            va, vt = getattr(sa, name), getattr(st, name)
            assert vt.dtype == va.dtype and vt.shape == va.shape, name
            assert torch.allclose(va, vt, rtol=1e-5, atol=1e-6), name
        assert (a.store is None) == (t.store is None)
        if a.store is not None:
            assert torch.allclose(a.store.rows(), t.store.rows(), rtol=1e-5, atol=1e-6)


def test_a_failing_stacked_hook_fails_only_its_clients(setup):
    """A hook kind that raises drops the clients that use it; the others finish."""
    model, x, y, w0 = setup

    class Broken(GradientStore):
        @classmethod
        def finished(cls, stores, grads):
            raise RuntimeError("boom")

    seq = LocalTrainer(model, x, y)
    hooks = [Broken(tau, model.dim) if c < 2 else HerdStore(tau, model.dim)
             for c, (*_, tau) in enumerate(PLANS)]
    jobs = [SGDJob(w0, batches(seq, a, b, tau, c), SGDConfig(0.1), on_step=hooks[c])
            for c, (a, b, tau) in enumerate(PLANS)]
    CohortTrainer(model, x, y).sgd_many(jobs)
    assert all(isinstance(j.error, RuntimeError) for j in jobs[:2])
    assert all(j.error is None and j.result is not None for j in jobs[2:])
