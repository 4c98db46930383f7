"""The local step's chain (`fedhet.training.steps`): each transform by hand, a stack of rows
bit for bit equal to the rows alone, and `LocalTrainer.sgd` against a hand-written SGD loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.algorithms.scaffold import corrected
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig
from fedhet.training.steps import (
    Correction,
    Custom,
    LocalStep,
    Momentum,
    Proximal,
    WeightDecay,
)

NAN = float("nan")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 bit patterns (so `-0.0` and `0.0` differ, and NaNs compare)."""
    return t.contiguous().view(torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


# -- each transform by hand ---------------------------------------------------------------------
def test_weight_decay_adds_lambda_w():
    g, w = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, -4.0, 1.0])
    out = WeightDecay(0.5).apply(g, w, 0)
    assert out is g  # in place
    assert torch.equal(g, torch.tensor([2.0, 0.0, 3.5]))  # g + 0.5 w


def test_proximal_adds_mu_times_distance_to_the_anchor():
    anchor = torch.tensor([1.0, 2.0, 3.0])
    w, g = torch.tensor([2.0, 0.0, 3.0]), torch.tensor([0.5, 0.5, 0.5])
    Proximal(0.5, anchor).apply(g, w, 0)
    assert torch.equal(g, torch.tensor([1.0, -0.5, 0.5]))  # g + 0.5 (w − w_k) = g + (0.5, −1, 0)


def test_correction_adds_c_minus_c_i():
    c, c_i = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.5, 2.0, 0.0])
    g = torch.tensor([1.0, 2.0, 3.0])
    Correction(c - c_i).apply(g, torch.zeros(3), 0)
    assert torch.equal(g, torch.tensor([1.5, 1.0, 4.0]))  # g − c_i + c
    first_round = torch.tensor([1.0, 2.0, 3.0])
    corrected(c, None).apply(first_round, torch.zeros(3), 0)  # c_i = 0 before round one
    assert torch.equal(first_round, torch.tensor([2.0, 3.0, 4.0]))


def test_momentum_is_the_heavy_ball_buffer():
    m = Momentum(0.5)
    v = m.init(torch.zeros(3))
    assert torch.equal(v, torch.zeros(3))
    d1 = m.direction(torch.tensor([1.0, 2.0, 3.0]), v)
    assert d1 is v and torch.equal(v, torch.tensor([1.0, 2.0, 3.0]))  # 0.5·0 + g1
    m.direction(torch.tensor([2.0, 0.0, -2.0]), v)
    assert torch.equal(v, torch.tensor([2.5, 1.0, -0.5]))  # 0.5·(1, 2, 3) + g2
    plain = Momentum(0.0)
    g = torch.tensor([1.0, 2.0, 3.0])
    assert plain.init(g) is None and plain.direction(g, None) is g
    mixed = Momentum.stack([Momentum(0.5), Momentum(0.0)])  # per-row ρ
    v = mixed.init(torch.zeros(2, 2))
    mixed.direction(torch.ones(2, 2), v)
    d = mixed.direction(torch.tensor([[1.0, -0.0], [2.0, -0.0]]), v)
    assert same_bits(d, torch.tensor([[1.5, 0.5], [2.0, -0.0]]))  # ρ = 0: d is g itself


def test_the_step_and_custom_transforms():
    """`w ← w − η d`; a bare callable in `transforms` becomes a `Custom` link, run after the
    typed ones in the order given."""
    chain = LocalStep.of(SGDConfig(lr=0.5, weight_decay=0.5), (lambda g, w, step: g * (step + 2),))
    assert isinstance(chain.transforms[-1], Custom)
    w, g = torch.tensor([2.0, -4.0, 1.0]), torch.tensor([1.0, 2.0, 3.0])
    g = chain.gradient(g, w, 1)
    assert torch.equal(g, torch.tensor([6.0, 0.0, 10.5]))  # 3 (g + 0.5 w)
    chain.update(w, g, chain.init(w))
    assert torch.equal(w, torch.tensor([-1.0, -4.0, -4.25]))  # w − 0.5 g


def test_zero_coefficients_touch_nothing():
    """`λ = 0`, `μ = 0`, `η = 0`: not even `+ 0·x` (a NaN in `x` would show), so `μ = 0` is
    FedAvg bit for bit; `-0.0` in `g` stays `-0.0`."""
    g = torch.tensor([1.0, -0.0, 3.0])
    nan = torch.full((3,), NAN)
    for t in (WeightDecay(0.0), Proximal(0.0, nan)):
        assert t.apply(g, nan, 0) is g
    assert same_bits(g, torch.tensor([1.0, -0.0, 3.0]))
    stacked = Correction.stack([Correction(torch.ones(3)), None])  # a row without a correction
    rows = torch.tensor([[1.0, -0.0, 3.0], [1.0, -0.0, 3.0]])
    stacked.apply(rows, torch.zeros(2, 3), 0)
    assert same_bits(rows, torch.tensor([[2.0, 1.0, 4.0], [1.0, -0.0, 3.0]]))
    w = torch.tensor([1.0, -0.0, 2.0])
    LocalStep.of(SGDConfig(lr=0.0)).update(w, torch.full((3,), float("inf")), None)
    assert same_bits(w, torch.tensor([1.0, -0.0, 2.0]))


# -- a stack equals its rows alone, bit for bit -----------------------------------------------
D = 37  # not a multiple of any vector width: every row has a tail


def _row_chains(anchors: list[torch.Tensor], shifts: list[torch.Tensor]) -> list[LocalStep]:
    """Three clients: different λ, μ, ρ, η and shifts (one coefficient 0 in each column)."""
    cfgs = [SGDConfig(0.1, 0.9, 1e-3), SGDConfig(0.05, 0.0, 0.0), SGDConfig(0.1, 0.5, 3e-3)]
    mus = [0.1, 0.0, 0.3]
    return [
        LocalStep.of(cfg, (Proximal(mu, anchor), Correction(shift)))
        for cfg, mu, anchor, shift in zip(cfgs, mus, anchors, shifts, strict=True)
    ]


def _run_alone(chain: LocalStep, w: torch.Tensor, grads: list[torch.Tensor]):
    w = w.clone()
    v = chain.init(w)
    seen = []
    for t, g in enumerate(grads):
        g = chain.gradient(g.clone(), w, t)
        seen.append(g.clone())
        chain.update(w, g, v)
    return w, seen


@pytest.mark.parametrize("shared", [False, True], ids=["own-anchors", "shared-anchor-and-shift"])
def test_a_stack_of_three_chains_equals_each_row_alone(shared):
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(3, D, generator=gen)
    grads = [torch.randn(3, D, generator=gen) for _ in range(5)]
    anchors, shifts = list(torch.randn(3, D, generator=gen)), list(torch.randn(3, D, generator=gen))
    if shared:  # one round of one run: every client holds the same w_k (and c, round one)
        anchors, shifts = [anchors[0]] * 3, [shifts[0]] * 3
    alone = [_run_alone(chain, w0[r], [g[r] for g in grads])
             for r, chain in enumerate(_row_chains(anchors, shifts))]
    stacked = LocalStep.stack(_row_chains(anchors, shifts))
    if shared:  # one anchor and one shift broadcast to every row, not copied per row
        prox, corr = stacked.transforms[1:3]
        assert prox.anchor.dim() == 1 and corr.shift.dim() == 1
    w, seen = _run_alone(stacked, w0, grads)
    for r, (w_r, seen_r) in enumerate(alone):
        assert same_bits(w[r], w_r), r
        for g, g_r in zip(seen, seen_r, strict=True):
            assert same_bits(g[r], g_r), r


def test_rows_that_leave_the_stack_do_not_change_the_others():
    """`select` drops rows (clients whose batches ran out) mid-run, momentum buffers with them."""
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(3, D, generator=gen)
    anchors, shifts = list(torch.randn(3, D, generator=gen)), list(torch.randn(3, D, generator=gen))
    grads = [torch.randn(3, D, generator=gen) for _ in range(6)]
    alone = [_run_alone(chain, w0[r], [g[r] for g in grads])[0]
             for r, chain in enumerate(_row_chains(anchors, shifts))]
    chain = LocalStep.stack(_row_chains(anchors, shifts))
    w, v, rows = w0.clone(), chain.init(w0), [0, 1, 2]
    for t, g in enumerate(grads):
        if t == 3:  # client 1 leaves; client 2 becomes row 1
            rows = [0, 2]
            w, v, chain = w[rows], v[rows], chain.select(rows)
        g = chain.gradient(g[rows].clone(), w, t)
        chain.update(w, g, v)
    assert same_bits(w[0], alone[0]) and same_bits(w[1], alone[2])


def test_chains_of_different_shapes_stack_kind_by_kind():
    """FedAvg, FedProx and SCAFFOLD rows (a stack of runs of different algorithms) in one
    stack: each transform is zero on the rows that do not have it."""
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(3, D, generator=gen)
    anchor, shift = torch.randn(D, generator=gen), torch.randn(D, generator=gen)
    grads = [torch.randn(3, D, generator=gen) for _ in range(4)]
    cfg = SGDConfig(0.1, 0.5, 1e-3)

    def chains():
        return [LocalStep.of(cfg), LocalStep.of(cfg, (Proximal(0.2, anchor),)),
                LocalStep.of(cfg, (Correction(shift),))]

    stacked = LocalStep.stack(chains())
    assert [type(t).__name__ for t in stacked.transforms] == [
        "WeightDecay", "WeightDecay", "Proximal", "WeightDecay", "Correction"
    ]
    w, _ = _run_alone(stacked, w0, grads)
    for r, chain in enumerate(chains()):
        w_r, _ = _run_alone(chain, w0[r], [g[r] for g in grads])
        assert same_bits(w[r], w_r), r


def test_custom_runs_row_by_row_and_a_failing_row_is_reported():
    def double(g, w, step):
        return g * 2  # a new tensor: copied into the row

    def broken(g, w, step):
        raise ValueError("no")

    chain = LocalStep.stack([LocalStep.of(SGDConfig(0.1), (double,)), LocalStep.of(SGDConfig(0.1)),
                             LocalStep.of(SGDConfig(0.1), (broken,))])
    g = torch.ones(3, 2)
    assert chain.gradient(g, torch.zeros(3, 2), 0) is g
    assert torch.equal(g[:2], torch.tensor([[2.0, 2.0], [1.0, 1.0]]))
    [(row, error)] = chain.failures()
    assert row == 2 and isinstance(error, ValueError)
    assert chain.failures() == []


# -- the cohort runs the chain ------------------------------------------------------------------
def test_cohort_rows_equal_the_clients_alone_bit_for_bit():
    """Jobs with different μ, λ, ρ, η, shifts, unequal τ and an `on_step` hook, stacked in the
    cohort, end exactly where each ends stacked alone. The gradient is replaced by an
    elementwise function so only the chain's arithmetic is compared."""
    torch.manual_seed(3)
    flat = FlatModel(nn.Linear(4, 1))
    x = torch.randn(40, flat.dim)
    cohort = CohortTrainer(flat, x, torch.zeros(40))

    def gradients(w, bufs, batch):
        return w * 0.5 - x[batch[:, 0]], torch.zeros(len(w)), bufs

    cohort.gradients = gradients
    w0, anchor = torch.randn(flat.dim), torch.randn(flat.dim)
    plans = [  # (cfg, transforms, τ)
        (SGDConfig(0.1, 0.9, 1e-3), (Proximal(0.1, anchor),), 5),
        (SGDConfig(0.05, 0.0, 0.0), (Proximal(0.0, anchor),), 3),
        (SGDConfig(0.1, 0.5, 3e-3), (Proximal(0.3, anchor), Correction(torch.randn(flat.dim))), 4),
    ]

    def jobs(which, seen):
        def hook(c):
            return lambda step, w, g, loss: seen[c].append(g.clone())

        return [SGDJob(w0, iter([torch.arange(4 * c + t, 4 * c + t + 1) for t in range(tau)]), cfg,
                       transforms, hook(c))
                for c, (cfg, transforms, tau) in enumerate(plans) if c in which]

    seen_all = {c: [] for c in range(3)}
    together = jobs({0, 1, 2}, seen_all)
    cohort.sgd_many(together)
    for c, job in enumerate(together):
        seen = {c: []}
        [alone] = jobs({c}, seen)
        cohort.sgd_many([alone])
        assert job.error is None and job.result[1] == plans[c][2]
        assert same_bits(job.result[0], alone.result[0]), c
        assert all(same_bits(a, b) for a, b in zip(seen_all[c], seen[c], strict=True))


# -- LocalTrainer.sgd against a hand-written loop ----------------------------------------------
class TinyRegression(nn.Module):
    """`½ mean (xᵀW + b − y)²` on a 3-feature linear model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).squeeze(1)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * (out - target).pow(2).mean()


def test_local_sgd_matches_a_hand_written_loop_with_momentum_weight_decay_and_prox():
    torch.manual_seed(4)
    flat = FlatModel(TinyRegression())
    x, y = torch.randn(12, 3), torch.randn(12)
    trainer = LocalTrainer(flat, x, y)
    w0 = flat.params.clone()
    anchor = w0 + 0.5
    lr, rho, wd, mu = 0.1, 0.9, 0.01, 0.2
    batches = [torch.arange(0, 4), torch.arange(4, 8), torch.arange(8, 12), torch.arange(2, 6)]
    w, steps, _ = trainer.sgd(w0, batches, SGDConfig(lr, rho, wd), (Proximal(mu, anchor),))

    ref, v = w0.double(), torch.zeros(4, dtype=torch.float64)  # (W_1, W_2, W_3, b)
    for batch in batches:
        xb, yb = x[batch].double(), y[batch].double()
        r = xb @ ref[:3] + ref[3] - yb  # residuals
        g = torch.cat([xb.T @ r / len(batch), r.mean().reshape(1)])
        g = g + wd * ref + mu * (ref - anchor.double())
        v = rho * v + g
        ref = ref - lr * v
    assert steps == 4
    assert torch.allclose(w.double(), ref, atol=1e-6, rtol=0)


def test_stacked_fedprox_with_mu_zero_is_fedavg_bit_for_bit():
    """The zero-coefficient rule holds in the stacked step too."""
    base = {"dataset": "digits", "clients": 3, "rounds": 2, "batch_size": 16, "lr": 0.05,
            "client_steps": [3, 5, 2], "momentum": 0.5, "weight_decay": 1e-3, "model": "logreg",
            "partition": "iid", "executor": "stacked"}
    runs = {}
    for name, extra in (("fedavg", {}), ("fedprox", {"algorithm_params": {"mu": 0.0}})):
        sim = assemble(config_of({**base, "algorithm": name, **extra}), log=lambda _: None)
        sim.run()
        assert sim.side.executor.name == "stacked"
        runs[name] = sim.final_state.w
    assert same_bits(runs["fedavg"], runs["fedprox"])


def test_sequential_and_stacked_local_sgd_agree_on_a_real_model():
    """`LocalTrainer.sgd` and `CohortTrainer.sgd_many` run the same chain (float32 rounding
    of the gradients aside)."""
    torch.manual_seed(5)
    flat = FlatModel(nn.Linear(6, 3))
    x, y = torch.randn(60, 6), torch.randint(0, 3, (60,))
    seq, cohort = LocalTrainer(flat, x, y), CohortTrainer(flat, x, y)
    w0 = flat.params.clone()
    shift = 0.1 * torch.randn(flat.dim)
    cases = [(SGDConfig(0.1, 0.9, 1e-2), (Proximal(0.5, w0),), 4),
             (SGDConfig(0.2, 0.0, 0.0), (Correction(shift),), 6)]

    def batches(c, tau):
        return seq.batches(torch.arange(30 * c, 30 * c + 30), 8, tau, np.random.default_rng(c))

    jobs = [SGDJob(w0, batches(c, tau), cfg, tf) for c, (cfg, tf, tau) in enumerate(cases)]
    cohort.sgd_many(jobs)
    for c, (cfg, tf, tau) in enumerate(cases):
        w, steps, loss = seq.sgd(w0, batches(c, tau), cfg, tf)
        assert jobs[c].result[1] == steps == tau
        assert torch.allclose(jobs[c].result[0], w, atol=1e-6)
        assert jobs[c].result[2] == pytest.approx(loss, rel=1e-5)
