"""FedNova's objective-inconsistency case as the paper-scale page runs it
(papers/fednova/inconsistency.py), at a tiny size: FedAvg ends at the surrogate
optimum Σ τ_i e_i / Σ τ_j, FedNova at the true one, and the exported distances are right."""

from __future__ import annotations

from pathlib import Path

import torch

from fedhet.papers import paper_results as pr
from fedhet.papers.fednova import inconsistency as inc


def test_optima_by_hand() -> None:
    e = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    f_true, f_sur, gap = inc.optima(e, [1, 2])
    # x* = (1.5, 0), x̃* = (2, 0): F(x*) = ½·1.5² = 1.125, F̃(x̃*) = ⅓·½·4 + ⅔·½·1 = 1
    assert abs(f_true - 1.125) < 1e-9 and abs(f_sur - 1.0) < 1e-9 and abs(gap - 0.5) < 1e-9


def test_fedavg_reaches_the_surrogate_and_fednova_the_true_optimum(tmp_path: Path) -> None:
    csv_path = inc.run_all(tmp_path, [3], rounds=100, lr=0.02, clients=5, dim=3, command="test")
    curves = pr.read_results(csv_path)
    last = {a: {k: v[-1] for k, v in by_seed[3].items()} for (_, a), by_seed in curves.items()}
    gap = last["fedavg"]["optima_gap"]
    assert gap > 0.1
    assert last["fedavg"]["dist_surrogate"] < 0.1 * gap < last["fedavg"]["dist_true"]
    assert last["fednova"]["dist_true"] < 0.1 * gap < last["fednova"]["dist_surrogate"]
    assert last["fedprox[mu=1]"]["dist_true"] > 0.5 * gap
    # round 0 is x = 0: its distances are ‖x*‖ and ‖x̃*‖
    e, tau = inc.problem(3, 5, 3)
    w = torch.tensor(tau, dtype=torch.float64) / sum(tau)
    first = curves[("quadratic", "fedavg")][3]
    assert abs(first["dist_true"][0] - e.double().mean(0).norm().item()) < 1e-3
    assert abs(first["dist_surrogate"][0] - (w @ e.double()).norm().item()) < 1e-3
    assert pr.read_meta(csv_path.with_suffix(".json"))["seeds"] == [3]
