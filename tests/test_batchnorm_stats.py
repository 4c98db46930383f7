"""BatchNorm running statistics are aggregated as the model is.

A small MLP with one BatchNorm layer on digits; each test records what every device received
and returned, and checks the engine's statistics against the hand-computed average.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.algorithms.base import BUFFERS
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.models.registry import MODELS
from fedhet.registry import NoParams

MODEL = "bn-mlp-test"


@pytest.fixture(autouse=True)
def bn_model():
    """A 64 → 16 → BatchNorm → 10 MLP, registered for each test only."""
    def build(input_shape, num_classes, params):
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], 16), nn.BatchNorm1d(16),
                             nn.ReLU(), nn.Linear(16, num_classes))

    with MODELS.added(MODEL, build, NoParams, "test only: MLP with BatchNorm"):
        yield

BASE = {"dataset": "digits", "partition": "dirichlet", "partition.alpha": 0.5, "model": MODEL,
        "lr": 0.05, "batch_size": 32, "local_steps": 3, "rounds": 1, "seed": 2,
        "executor": "sequential"}


class Recorder:
    """Wraps a simulation's per-device entry points: what each device got, what it returned."""

    def __init__(self, sim: Simulation) -> None:
        self.received: list[tuple[int, float, torch.Tensor]] = []
        self.returned: list[tuple[int, torch.Tensor]] = []
        self.visits: list[float] = []
        work = sim.side.clients
        update, finish = work.update, work.finish

        def client_update(client_id, message, round):
            visit = message.scalars.get("edge_iter", 0.0)
            self.received.append((client_id, visit, message.tensors[BUFFERS].clone()))
            self.visits.append(visit)
            return update(client_id, message, round)

        def finish_client(client_id, reply, buffers):  # called inside update
            self.returned.append((client_id, buffers.clone()))
            return finish(client_id, reply, buffers)

        work.update, work.finish = client_update, finish_client


def run(**settings) -> tuple[Simulation, Recorder]:
    cfg = config_of({**BASE, **settings}, "test")
    sim = assemble(cfg, store=None, log=lambda _: None)
    rec = Recorder(sim)
    sim.run()
    return sim, rec


def mean(items: list[tuple[float, torch.Tensor]]) -> torch.Tensor:
    total = sum(w for w, _ in items)
    return sum(b.double() * (w / total) for w, b in items).float()


def sizes(sim: Simulation) -> dict[int, float]:
    return {i: float(len(ix)) for i, ix in enumerate(sim.side.client_indices)}


def test_star_statistics_use_the_runs_weights():
    """`weighting="uniform"` (FedNNNN's unbalanced setting) averages the statistics 1/m like
    the model; the default weights them by D_i. The clients' sizes differ, so the two differ."""
    for weighting in ("samples", "uniform"):
        sim, rec = run(algorithm="fedavg", clients=4, **{"algorithm.weighting": weighting})
        n = sizes(sim)
        assert len(set(n.values())) > 1
        weight = (lambda i: 1.0) if weighting == "uniform" else n.__getitem__
        expected = mean([(weight(i), b) for i, b in rec.returned])
        assert sim.buffers.numel() and torch.allclose(sim.buffers, expected, atol=1e-6)


def test_hierfavg_edges_average_statistics_and_send_them_down():
    """κ2 = 2: in its second iteration an edge's devices start from the D-weighted mean of the
    statistics its devices returned in the first (not the cloud's); the cloud ends with the
    edges' means weighted by |D_m|, i.e. Σ_i (D_i/D) of the last iteration's statistics."""
    sim, rec = run(algorithm="hierfavg", clients=4, **{"algorithm.clusters": 2,
                                                       "algorithm.kappa2": 2})
    n = sizes(sim)
    edges = sim.side.algorithm.edges
    first = [r for r, v in zip(rec.returned, rec.visits, strict=True) if v == 0]
    last = dict(r for r, v in zip(rec.returned, rec.visits, strict=True) if v == 1)
    assert len(first) == len(last) == 4
    for members in edges:
        edge_mean = mean([(n[i], b) for i, b in first if i in members])
        for client_id, visit, got in rec.received:
            if client_id in members and visit == 1:
                assert torch.allclose(got, edge_mean, atol=1e-6)
    expected = mean([(n[i], last[i]) for i in range(4)])
    assert torch.allclose(sim.buffers, expected, atol=1e-6)


def test_rings_carry_statistics_with_the_model():
    """FedSR with two rings of two and R = 2: each device starts from its predecessor's
    statistics; the cloud averages each ring's last statistics with eq. 15's weights |D_m|."""
    sim, rec = run(algorithm="fedsr", clients=4, **{"algorithm.clusters": 2,
                                                    "algorithm.ring_passes": 2})
    n = sizes(sim)
    rings = sim.side.algorithm.edges
    assert len(rings) == 2
    ends = []
    for ring in rings:  # the rings run side by side: follow each ring's hops in their order
        received = [r for r in rec.received if r[0] in ring]
        returned = [r for r in rec.returned if r[0] in ring]
        assert len(received) == len(returned) == 4
        for k in range(1, 4):  # every hop after the ring's first
            assert torch.equal(received[k][2], returned[k - 1][1])
        ends.append(returned[-1])
    expected = mean([(sum(n[i] for i in ring), b) for ring, (_, b) in zip(rings, ends, strict=True)])
    assert torch.allclose(sim.buffers, expected, atol=1e-6)
