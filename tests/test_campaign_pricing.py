"""The campaign prices each table from its own work and runs the most claims per GPU-minute first."""

from __future__ import annotations

import pytest

from fedhet.experiments import campaign as cp


def test_flop_counter_matches_a_hand_count():
    """Logistic regression on MNIST: a forward is a 784×10 product (2·7840 FLOPs per sample),
    the backward its weight gradient (the same again; no input gradient): 4·7840."""
    assert cp.train_flops("logreg") == pytest.approx(4 * 784 * 10)
    # FedNNNN's CNN: the figure of about 13.8 MFLOP a sample (products only here)
    assert 12e6 < cp.train_flops("cnn-fednnnn-mnist") < 14e6


def test_fednnnn_table_by_hand():
    """FedNNNN Table 2 MNIST: 60 runs × 100 rounds; a round trains 100 clients × E = 5 over
    60,000 samples (the floor's own work: 0.68 s) and evaluates the 10,000 test samples once
    (a forward, a third of a training pass: 0.68 · 10,000 / (3 · 300,000) s)."""
    settings = {"algorithm": "fedavg", "dataset": "mnist", "model": "cnn-fednnnn-mnist",
                "clients": 100, "local_epochs": 5, "batch_size": 50, "rounds": 100}
    w = cp.run_work(settings)
    assert (w.train_samples, w.eval_samples, w.stacked) == (300_000, 10_000, 100)
    per_round = 0.68 * (1 + 10_000 / (3 * 300_000))
    assert cp.run_round_seconds(settings) == pytest.approx(per_round)
    t = cp.table("fednnnn-mnist")
    assert cp.estimate_run_rounds(t, "paper") == 6000
    assert cp.gpu_minutes(t) == pytest.approx(6000 * per_round / 60)


def test_work_follows_the_algorithm():
    base = {"dataset": "mnist", "model": "mlp", "clients": 20, "local_epochs": 1, "rounds": 500}
    # FedSR: 5 ring passes a round; its 5 edge rings are what a step stacks
    fedsr = cp.run_work({**base, "algorithm": "fedsr", "algorithm.clusters": 5,
                         "algorithm.ring_passes": 5})
    assert fedsr.train_samples == 5 * 60_000 and fedsr.stacked == 5
    assert cp.run_work({**base, "algorithm": "ring"}).stacked == 1
    assert cp.run_work({**base, "algorithm": "hierfavg", "algorithm.kappa2": 5}).train_samples == 300_000
    # the centralized baseline: one client, all the data; MOON: two more forward passes
    assert cp.run_work({**base, "algorithm": "central"}).stacked == 1
    assert cp.run_work({**base, "algorithm": "moon"}).train_samples == pytest.approx(60_000 * 5 / 3)
    # FedVeca: at most τ_max steps a client, plus the full local gradient; train_loss reads D
    fv = cp.run_work({**base, "algorithm": "fedveca", "clients": 5, "batch_size": 32,
                      "train_loss": True})
    assert fv.train_samples == 5 * 50 * 32 + 60_000 and fv.eval_samples == 70_000
    # a stack of 1 × 8 runs fills 8% of the floor's 100 clients: the training takes 12.5× longer
    ring = {**base, "algorithm": "ring", "eval_every": 10**9}
    star = {**base, "algorithm": "fedavg", "eval_every": 10**9}
    assert cp.run_round_seconds(ring) == pytest.approx(cp.run_round_seconds(star) * 100 / 8, rel=1e-3)


def test_order_is_most_claims_per_gpu_minute_first():
    values = [cp.value(t) for t in cp.TABLES]
    assert values == sorted(values, reverse=True)
    assert cp.STEPS[0] == "bench" and cp.STEPS[1:] == tuple(t.key for t in cp.TABLES)


def test_bf16_only_where_the_benchmark_found_no_loss_and_only_on_a_gpu():
    fednnnn, fedsr = cp.table("fednnnn-mnist"), cp.table("fedsr-mnist")
    assert cp.overrides_for(fednnnn, "cuda") == {"device": "cuda", "precision": "bf16"}
    assert cp.overrides_for(fednnnn, "cpu") == {"device": "cpu"}
    assert cp.overrides_for(fedsr, "cuda") == {"device": "cuda"}


def test_a_table_prior_still_wins():
    t = cp.Table("x", "fednnnn", "t", "T", ("mnist",), 2.0)
    assert cp.gpu_minutes(t) == pytest.approx(cp.estimate_run_rounds(t, "paper") * 2.0 / 60)
