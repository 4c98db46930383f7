"""MOON with a BatchNorm encoder: the frozen global and previous models are
evaluated in eval mode with their own running statistics, and their passes leave the client's
statistics alone, on the sequential path and in the cohort (stacked executor)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.algorithms.moon import ContrastiveLoss
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.models.registry import MODELS
from fedhet.registry import NoParams
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig
from fedhet.training.losses import StackableLoss

MODEL = "moon-bn-test"


class BNMoon(nn.Module):
    """encoder (Linear → BatchNorm → ReLU) → projection → classifier, MOON's interface."""

    def __init__(self, d_in: int, classes: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 12), nn.BatchNorm1d(12), nn.ReLU())
        self.projection = nn.Sequential(nn.Linear(12, 6))
        self.classifier = nn.Linear(6, classes)

    def forward(self, x: torch.Tensor, with_z: bool = False):
        z = self.projection(self.encoder(x))
        out = self.classifier(z)
        return (out, z) if with_z else out


@pytest.fixture(autouse=True)
def bn_moon():
    with MODELS.added(MODEL, lambda shape, classes, params: BNMoon(shape[-1], classes), NoParams,
                      "test only: MOON model with BatchNorm"):
        yield


def _model(seed: int) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(BNMoon(5, 3))


def _frozen(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Parameters and (non-trivial) running statistics of another model."""
    m = _model(seed)
    m.module.train()
    with torch.no_grad():
        m.module(torch.randn(40, 5) * 3 + 1)  # moves its running mean/var away from 0/1
    return m.params.clone(), m.buffers.clone()


def _eval_z(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    m = _model(0)
    m.load(w, b)
    m.module.eval()
    with torch.no_grad():
        return m.module(x, with_z=True)[1]


def test_targets_are_eval_mode_projections_and_leave_the_module_alone() -> None:
    client = _model(0)
    w_glob, b_glob = _frozen(1)
    w_prev, b_prev = _frozen(2)
    loss = ContrastiveLoss(client.layers, w_glob, w_prev, 1.0, 0.5, b_glob, b_prev)
    x = torch.randn(8, 5)
    client.module.train()
    before = client.buffers.clone()
    with torch.no_grad():
        z_glob, z_prev = loss.targets(client.module, x, *loss.frozen)
    assert torch.allclose(z_glob, _eval_z(w_glob, b_glob, x), atol=1e-6)
    assert torch.allclose(z_prev, _eval_z(w_prev, b_prev, x), atol=1e-6)
    # a train-mode pass (batch statistics) gives something else: the test can tell them apart
    train_z = torch.func.functional_call(client.module, {k.name: w_glob[k.start:k.stop].view(k.shape)
                                                         for k in client.layers}, (x,), {"with_z": True})[1]
    assert not torch.allclose(z_glob, train_z, atol=1e-3)
    client.buffers.copy_(before)
    client.module.train()
    tracked = int(client.module.encoder[1].num_batches_tracked)
    loss.targets(client.module, x, *loss.frozen)
    assert torch.equal(client.buffers, before) and client.module.training
    assert int(client.module.encoder[1].num_batches_tracked) == tracked


class Precomputed(StackableLoss):
    """The same objective with targets computed beforehand (on a separate model), per batch."""

    def __init__(self, inner: ContrastiveLoss, table: list[tuple[torch.Tensor, tuple]]) -> None:
        self.inner, self.table = inner, table
        self.frozen = ()

    @property
    def key(self) -> str:
        return "precomputed"

    def targets(self, module: nn.Module, x: torch.Tensor, *frozen: torch.Tensor) -> tuple:
        return next(t for xb, t in self.table if torch.equal(xb, x))

    def loss(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor, targets: tuple) -> torch.Tensor:
        return self.inner.loss(module, x, y, targets)


def test_a_step_updates_the_statistics_as_if_the_targets_were_computed_elsewhere() -> None:
    x, y = torch.randn(24, 5), torch.randint(0, 3, (24,))
    w_glob, b_glob = _frozen(1)
    w_prev, b_prev = _frozen(2)
    batches = [torch.arange(0, 8), torch.arange(8, 16), torch.arange(16, 24)]

    a = _model(0)
    loss = ContrastiveLoss(a.layers, w_glob, w_prev, 1.0, 0.5, b_glob, b_prev)
    w_a, _, _ = LocalTrainer(a, x, y).sgd(a.params.clone(), batches, SGDConfig(0.1), loss_fn=loss)

    other = _model(0).module  # a separate copy: its statistics are not the client's
    with torch.no_grad():
        table = [(x[i], loss.targets(other, x[i], *loss.frozen)) for i in batches]
    b = _model(0)
    w_b, _, _ = LocalTrainer(b, x, y).sgd(b.params.clone(), batches, SGDConfig(0.1),
                                          loss_fn=Precomputed(loss, table))
    assert torch.allclose(w_a, w_b, atol=1e-6)
    assert torch.allclose(a.buffers, b.buffers, atol=1e-6)
    # and the statistics moved: the client's three training passes
    assert not torch.allclose(a.buffers, _model(0).buffers)


BASE = {"dataset": "digits", "partition": "dirichlet", "partition.alpha": 0.5, "model": MODEL,
        "algorithm": "moon", "algorithm.mu": 1.0, "lr": 0.05, "batch_size": 16, "local_steps": 3,
        "rounds": 3, "seed": 1, "clients": 3}


def _sim(executor: str) -> Simulation:
    sim = assemble(config_of({**BASE, "executor": executor}), store=None, log=lambda _: None)
    sim.run()
    return sim


def test_sequential_and_stacked_agree_with_batchnorm() -> None:
    seq, bat = _sim("sequential"), _sim("stacked")
    assert bat.side.executor.name == "stacked"
    assert torch.allclose(seq.final_state.w, bat.final_state.w, atol=1e-4)
    assert torch.allclose(seq.buffers, bat.buffers, atol=1e-4)
    for i in range(3):  # each client keeps its previous model's statistics with the model
        s, b = seq.side.clients.states[i], bat.side.clients.states[i]
        assert s.b_prev is not None and torch.allclose(s.b_prev, b.b_prev, atol=1e-4)
