"""GraB's online balancing (Lu et al. 2022) and GraB-FedAvg."""

from __future__ import annotations

import torch

from fedhet.algorithms.grab import grab_epoch, grab_init
from fedhet.engine.simulation import Simulation
from fedhet.experiments.single import resolve_settings


def unit_vectors(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    return v / v.norm(dim=1, keepdim=True).clamp(min=1)


def max_prefix(v: torch.Tensor, order: torch.Tensor) -> float:
    z = v - v.mean(0)
    return float(torch.linalg.vector_norm(torch.cumsum(z[order], 0), dim=1).max())


def balanced_state(v: torch.Tensor, order: torch.Tensor | None = None) -> dict:
    st = grab_init(len(v), v.shape[1])
    st["mean"] = v.mean(0)  # the exact mean: Σ c = 0, the setting of GraB's reordering lemma
    if order is not None:
        st["order"] = order.clone()
    return st


def test_next_order_is_a_permutation_with_back_half_reversed():
    v = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]], dtype=torch.float64)
    st = balanced_state(v)
    signed = grab_epoch(v, st)
    # c = ±1; s=0: tie → '+' (front); s=1 with c=1 → '−' (back); s=0, c=−1 → '+'; s=−1, c=−1 → '−'
    assert st["order"].tolist() == [0, 2, 3, 1]
    assert signed == [1.0, 0.0, 1.0, 0.0]
    assert st["pos"] == 0 and torch.allclose(st["mean"].double(), v.mean(0))


def test_signed_sums_stay_bounded_while_random_prefix_sums_grow():
    """GraB §4: greedy balancing keeps the signed running sums O(1) in n (here ≤ 4), while a
    random order's prefix sums of centred vectors grow like √n."""
    for n in (256, 2048):
        v = unit_vectors(n, 10, n)
        signed = grab_epoch(v, balanced_state(v))
        assert max(signed) < 4.0
    g = torch.Generator().manual_seed(0)
    v = unit_vectors(2048, 10, 1)
    random_prefix = sorted(max_prefix(v, torch.randperm(2048, generator=g)) for _ in range(9))
    assert random_prefix[4] > 15.0


def test_reordering_lemma_and_convergence_to_the_signed_bound():
    """With Σ c = 0 the new order's prefix sums are ≤ (old max prefix + max signed sum) / 2,
    so repeated epochs bring them down to the signed-sum level, far below a random order."""
    n = 1024
    v = unit_vectors(n, 10, 7)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    st = balanced_state(v, order)
    old = max_prefix(v, order)
    for _ in range(4):
        signed = max(grab_epoch(v, st))
        new = max_prefix(v, st["order"])
        assert new <= (old + signed) / 2 + 1e-9
        old = new
    assert sorted(st["order"].tolist()) == list(range(n))
    assert old < 2 * signed + 1.0
    assert old < 0.3 * max_prefix(v, order)


def run(settings: dict) -> Simulation:
    base = {"dataset": "digits", "partition": "iid", "clients": 3, "rounds": 3, "lr": 0.1,
            "batch_size": 32}
    cfg, params = resolve_settings({**base, **settings})
    sim = Simulation(cfg, params, store=None, log=lambda s: None)
    sim.summary_ = sim.run()
    return sim


def test_grab_fedavg_keeps_its_order_across_rounds_and_learns():
    sim = run({"algorithm": "grab-fedavg", "local_epochs": 0.5, "rounds": 4})
    for state in sim.client_states.values():
        n = len(state["order"])
        assert sorted(state["order"].tolist()) == list(range(n))
        assert state["order"].tolist() != list(range(n))  # reordered after the first epoch
        assert float(state["mean"].norm()) > 0  # a stale mean from a finished epoch
    assert sim.summary_["final_accuracy"] > 0.6
