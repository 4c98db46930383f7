"""GraB's online balancing (Lu et al. 2022) and GraB-FedAvg."""

from __future__ import annotations

import pytest
import torch

from fedhet.algorithms.base import ALGORITHMS, ClientContext, Reply, RunInfo
from fedhet.algorithms.grab import GraBParams, GraBState, grab_epoch, grab_init, round_order
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.errors import FedhetError
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig


def unit_vectors(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    return v / v.norm(dim=1, keepdim=True).clamp(min=1)


def max_prefix(v: torch.Tensor, order: torch.Tensor) -> float:
    z = v - v.mean(0)
    return float(torch.linalg.vector_norm(torch.cumsum(z[order], 0), dim=1).max())


def balanced_state(v: torch.Tensor, order: torch.Tensor | None = None) -> GraBState:
    st = grab_init(len(v), v.shape[1])
    st.mean = v.mean(0)  # the exact mean: Σ c = 0, the setting of GraB's reordering lemma
    if order is not None:
        st.order = order.clone()
    return st


def test_next_order_is_a_permutation_with_back_half_reversed():
    v = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]], dtype=torch.float64)
    st = balanced_state(v)
    signed = grab_epoch(v, st)
    # c = ±1; s=0: tie → '+' (front); s=1 with c=1 → '−' (back); s=0, c=−1 → '+'; s=−1, c=−1 → '−'
    assert st.order.tolist() == [0, 2, 3, 1]
    assert signed == [1.0, 0.0, 1.0, 0.0]
    assert st.pos == 0 and torch.allclose(st.mean.double(), v.mean(0))


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
        new = max_prefix(v, st.order)
        assert new <= (old + signed) / 2 + 1e-9
        old = new
    assert sorted(st.order.tolist()) == list(range(n))
    assert old < 2 * signed + 1.0
    assert old < 0.3 * max_prefix(v, order)


def run(settings: dict) -> Simulation:
    base = {"dataset": "digits", "partition": "iid", "clients": 3, "rounds": 3, "lr": 0.1,
            "batch_size": 32}
    cfg = config_of({**base, **settings})
    sim = assemble(cfg, store=None, log=lambda s: None)
    sim.summary_ = sim.run()
    return sim


def test_grab_fedavg_keeps_its_order_across_rounds_and_learns():
    sim = run({"algorithm": "grab-fedavg", "local_epochs": 0.5, "rounds": 4})
    for state in sim.side.clients.states.values():
        n = len(state.order)
        assert sorted(state.order.tolist()) == list(range(n))
        assert state.order.tolist() != list(range(n))  # reordered after the first epoch
        assert float(state.mean.norm()) > 0  # a stale mean from a finished epoch
    assert sim.summary_["final_accuracy"] > 0.6


# -- cropping (the seed's "top ⌊α τ⌋" with GraB's order) ---------------------------------------
class Quadratic(torch.nn.Module):
    """`f(w; y) = ½ (w − y)²` for a scalar `w`; the inputs are ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0])

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * (out - target).pow(2).mean()


class InOrder(ClientContext):
    """A client whose units are its samples one by one, in index order."""

    def batches(self, steps, order=None, purpose=0):
        return iter([torch.tensor([j % self.num_samples]) for j in range(steps)])


def grab_round(alpha: float, reading: str = "mean-tau"):
    """One GraB-FedAvg round, one client, `y = (1, 2, 3, 10)`, `B = 1`, `w_0 = 0`, `η = ½`.

    Steps (stale mean 0 in the first epoch, `s = 0`): `g = −1`: tie → `+`, `s = −1`;
    `g = −1.5`: `|−2.5| > |0.5|` → `−`, `s = 0.5`; `g = −1.75`: `|−1.25| < |2.25|` → `+`,
    `s = −1.25`; `g = −7.875`: `|−9.125| > |6.625|` → `−`. GraB's order: `(0, 2, 3, 1)`."""
    model = FlatModel(Quadratic())
    y = torch.tensor([1.0, 2.0, 3.0, 10.0])
    run_info = RunInfo(num_clients=1, rounds=1, lr=0.5, momentum=0.0, weight_decay=0.0, seed=0,
                       dim=1, layers=model.layers)
    algo = ALGORITHMS.get("grab-fedavg").factory(GraBParams(alpha=alpha, reading=reading), run_info)
    ctx = InOrder(client_id=0, round=0, indices=torch.arange(4),
                  trainer=LocalTrainer(model, torch.zeros(4, 1), y), tau=4, batch_size=1,
                  sgd=SGDConfig(0.5), seed=0)
    state = algo.init(torch.zeros(1))
    reply, client_state = algo.client_update(algo.configure(state, 0, 0), ctx, None)
    new, _ = algo.aggregate(state, 0, [Reply(0, reply)])
    return float(new.w), reply, client_state


def test_cropping_keeps_the_top_of_grabs_order_by_hand():
    w, reply, state = grab_round(0.5)
    assert state.order.tolist() == [0, 2, 3, 1]  # the same permutation GraB keeps
    assert reply.scalars["kept_steps"] == 2
    # kept steps 0 and 2: G = (−1 − 1.75)/2 = −1.375; mean-tau Δ = −η τ G = 2.75
    assert w == pytest.approx(2.75)
    assert grab_round(0.5, "sum")[0] == pytest.approx(1.375)  # Δ = −η m G
    assert grab_round(1.0)[0] == pytest.approx(6.0625)  # no cropping: FedAvg's local model
    assert round_order([True, False, True, False]) == [0, 2, 3, 1]


def test_grab_fedavg_with_cropping_learns_and_differs():
    full = run({"algorithm": "grab-fedavg"})
    crop = run({"algorithm": "grab-fedavg", "algorithm.alpha": 0.5})
    assert crop.summary_["final_accuracy"] > 0.6
    assert not torch.allclose(crop.final_state.w, full.final_state.w, atol=1e-4)
    with pytest.raises(FedhetError, match="alpha"):
        config_of({"algorithm": "grab-fedavg", "algorithm.alpha": 0.0})
