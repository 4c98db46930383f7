"""BHerd's three readings of eqs. 6–7 (`algorithm.reading`), by hand on a 1-D quadratic.

One client, four samples `y = (1, 2, 3, 10)`, batch size 1 in that order, `f_j(w) = ½ (w − y_j)²`
so a mini-batch gradient is `w − y_j`; `w_0 = 0`, `η = ½`, `α = ½` (`m = 2` of `τ = 4`).

Along the local trajectory (`mean-tau`, `sum`): `g = (−1, −1.5, −1.75, −7.875)` at
`w = (0, 0.5, 1.25, 2.125)`, FedAvg's model ends at `6.0625`. Mean `−3.03125`, centred
`z = (2.03125, 1.53125, 1.28125, −4.84375)`; herding takes `z_2` (smallest `|z|`), then from
`s = 1.28125` the candidates give `|s + z| = 3.3125, 2.8125, 3.5625`, so `z_1`: kept `{2, 1}`,
`S = −3.25`, `G = −1.625`.

At the fixed global model (`fixed-point`): `g = (−1, −2, −3, −10)`, mean `−4`,
`z = (3, 2, 1, −6)`: `z_2`, then `|1 + z| = 4, 3, 5` → `z_1`; kept `{2, 1}`, `S = −5`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.algorithms import bherd
from fedhet.algorithms.base import ALGORITHMS, ClientContext, Reply, RunInfo
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig

Y = torch.tensor([1.0, 2.0, 3.0, 10.0])
LR = 0.5


class Quadratic(nn.Module):
    """`f(w; y) = ½ (w − y)²` for a scalar `w`; the inputs are ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0])

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * (out - target).pow(2).mean()


def one_round(monkeypatch, name: str, params, w0: float = 0.0):
    """One round of `name` with one client whose batches are samples 0, 1, 2, 3 in order."""
    model = FlatModel(Quadratic())
    trainer = LocalTrainer(model, torch.zeros(4, 1), Y)
    batches = [torch.tensor([j]) for j in range(4)]
    monkeypatch.setattr(bherd, "local_batches", lambda ctx, order, cursor: (batches, 0))
    run = RunInfo(num_clients=1, rounds=1, lr=LR, momentum=0.0, weight_decay=0.0, seed=0,
                  dim=1, layers=model.layers)
    algo = ALGORITHMS.get(name).factory(params, run)
    state = algo.init(torch.tensor([w0]))
    ctx = ClientContext(client_id=0, round=0, indices=torch.arange(4), trainer=trainer, tau=4,
                        batch_size=1, sgd=SGDConfig(LR), seed=0)
    reply, client_state = algo.client_update(algo.configure(state, 0, 0), ctx, algo.client_init(0))
    new, diag = algo.aggregate(state, 0, [Reply(0, reply)])
    return new, reply, client_state, diag


@pytest.mark.parametrize(
    "reading,server_lr,expected",
    [
        ("mean-tau", 1.0, 0.0 - LR * 4 * -1.625),  # w − η τ G = 3.25
        ("sum", 1.0, 0.0 - LR * -3.25),  # w − η S = 1.625
        ("sum", 2.0, 0.0 - 2.0 * LR * -3.25),  # η_g = 1/α: = mean-tau here (m = ατ)
        ("fixed-point", 1.0, 0.0 - LR * -5.0),  # w − η S(w_k) = 2.5
    ],
)
def test_server_step_by_hand(monkeypatch, reading, server_lr, expected):
    params = bherd.BHerdParams(alpha=0.5, reading=reading, server_lr=server_lr)
    new, reply, _, _ = one_round(monkeypatch, "bherd", params)
    assert reply.tensors["kept"].tolist() == [2, 1]
    assert float(new.w) == pytest.approx(expected, abs=1e-6)


def test_alpha_one_by_hand(monkeypatch):
    """`α = 1`: `mean-tau` and `sum` are FedAvg (`6.0625`); `fixed-point` is one step of
    `η τ` on the mean gradient at `w_k`: `0 − ½ · 4 · (−4) = 8`."""
    fedavg = 6.0625
    for reading, expected in (("mean-tau", fedavg), ("sum", fedavg), ("fixed-point", 8.0)):
        params = bherd.BHerdParams(alpha=1.0, reading=reading)
        new, _, _, _ = one_round(monkeypatch, "bherd", params)
        assert float(new.w) == pytest.approx(expected, abs=1e-6), reading


def test_fixed_point_gradients_are_taken_at_the_global_model(monkeypatch):
    """The reported loss is the mean loss at `w_k = 0`: `½ mean(y²) = ½ · 114/4`."""
    params = bherd.BHerdParams(alpha=0.5, reading="fixed-point")
    _, reply, client_state, _ = one_round(monkeypatch, "bherd", params)
    assert reply.scalars["train_loss"] == pytest.approx(0.5 * 114 / 4)
    assert float(reply.tensors["G"]) == pytest.approx(-2.5)
    assert client_state.cursor == 0


def test_bherd_scaffold_readings_by_hand(monkeypatch):
    """First round (`c = c_i = 0`): the model moves as `bherd`'s; option II's `c_i⁺` is the mean
    raw gradient, along the trajectory (`−3.03125`) or at `w_k` under `fixed-point` (`−4`)."""
    for reading, w_expected, c_expected in (
        ("mean-tau", 3.25, -3.03125), ("sum", 1.625, -3.03125), ("fixed-point", 2.5, -4.0),
    ):
        params = bherd.BHerdScaffoldParams(alpha=0.5, reading=reading)
        new, _, client_state, diag = one_round(monkeypatch, "bherd-scaffold", params)
        assert float(new.w) == pytest.approx(w_expected, abs=1e-6), reading
        assert float(client_state.c_i) == pytest.approx(c_expected, abs=1e-6), reading
        assert float(new.c) == pytest.approx(c_expected, abs=1e-6)  # one client: c = c_1
        assert diag["c_norm"] == pytest.approx(abs(c_expected), abs=1e-6)


def test_rescale_false_only_with_mean_tau():
    with pytest.raises(FedhetError, match="rescale"):
        bherd.BHerdParams(reading="sum", rescale=False).validate()
    with pytest.raises(FedhetError, match="server_lr"):
        bherd.BHerdParams(server_lr=0.0).validate()
    with pytest.raises(FedhetError, match="reading"):
        config_of({"algorithm": "bherd", "algorithm.reading": "mean"})


# -- through the engine -------------------------------------------------------------------------
BASE = {"dataset": "digits", "partition": "iid", "clients": 3, "rounds": 2, "lr": 0.1,
        "batch_size": 32}


def final_w(settings: dict) -> torch.Tensor:
    cfg = config_of({**BASE, **settings})
    sim = assemble(cfg, store=None, log=lambda s: None)
    sim.run()
    return sim.final_state.w


def test_sum_at_alpha_one_is_fedavg_through_the_engine():
    fedavg = final_w({"algorithm": "fedavg", "batch_order": "fixed"})
    herd = final_w({"algorithm": "bherd", "algorithm.alpha": 1.0, "algorithm.reading": "sum"})
    assert torch.allclose(herd, fedavg, rtol=1e-5, atol=1e-6)


def test_sum_equals_mean_tau_without_rescale_and_fixed_point_differs():
    a = final_w({"algorithm": "bherd", "algorithm.reading": "sum"})
    b = final_w({"algorithm": "bherd", "algorithm.reading": "mean-tau", "algorithm.rescale": False})
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    c = final_w({"algorithm": "bherd", "algorithm.reading": "fixed-point"})
    assert not torch.allclose(a, c, atol=1e-4)


@pytest.mark.parametrize("executor", ["sequential", "stacked"])
def test_fixed_point_runs_on_both_executors(executor):
    settings = {"algorithm": "bherd", "algorithm.reading": "fixed-point", "model": "logreg",
                "executor": executor}
    assert torch.allclose(final_w(settings), final_w({**settings, "executor": "sequential"}),
                          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["bherd", "bherd-scaffold"])
def test_global_lr_is_a_deprecated_alias_of_server_lr(name):
    """SCAFFOLD and the BHerd family name the global step size `server_lr`."""
    from fedhet.algorithms.base import ALGORITHMS

    assert ALGORITHMS.params(name, {"global_lr": 0.5}) == ALGORITHMS.params(name, {"server_lr": 0.5})
