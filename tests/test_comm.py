"""Communication accounting: hand counts per link kind, cumulative columns, Table III cost."""

from __future__ import annotations

import pytest

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.reports.commcost import transfers_to_target
from fedhet.rundir.store import RunStore

BASE = {"dataset": "digits", "partition": "iid", "lr": 0.05, "seed": 1, "clients": 4, "rounds": 2}


def run(tmp_path=None, **settings) -> tuple[Simulation, list[dict]]:
    cfg = config_of({**BASE, **settings}, "test")
    store = RunStore(tmp_path) if tmp_path is not None else None
    sim = assemble(cfg, store=store, log=lambda _: None)
    sim.run()
    rows = []
    if tmp_path is not None:
        from fedhet.rundir import read_metrics

        rows = read_metrics(tmp_path)
    return sim, rows


def model_bytes(sim: Simulation) -> int:
    return sim.side.model.dim * 4


def test_fedsr_hand_count(tmp_path):
    """4 devices, 2 edges of 2, R = 2 passes. Per round and edge: cloud→edge and edge→cloud
    (2 edge-cloud), edge→first device and last device→edge (2 device-edge), and R·Q − 1 = 3
    ring hops (device-device)."""
    sim, rows = run(tmp_path, algorithm="fedsr", **{"algorithm.clusters": 2, "algorithm.ring_passes": 2})
    r1, r2 = rows[1], rows[2]
    assert r1["edge_cloud_transfers"] == 4
    assert r1["device_edge_transfers"] == 4
    assert r1["device_device_transfers"] == 6
    assert r1["model_transfers"] == 14
    assert r2["cum_model_transfers"] == 28
    assert r2["cum_device_device_transfers"] == 12
    # the cloud sends the bare model: bytes = transfers × 4 bytes × dim exactly
    assert sim.parts.comm.total_bytes[("edge-cloud", "down")] == 2 * 2 * model_bytes(sim)
    # every hop carries the model plus a few scalars
    peer = sim.parts.comm.total_bytes[("device-device", "peer")]
    assert 12 * model_bytes(sim) < peer < 12 * (model_bytes(sim) + 100)
    assert r2["cum_bytes"] == sum(sim.parts.comm.total_bytes.values())


def test_hierfavg_ring_and_star_hand_counts():
    sim, _ = run(algorithm="hierfavg", **{"algorithm.clusters": 2, "algorithm.kappa2": 3})
    # per round: 2 edges × (down + up) to the cloud; 3 edge rounds × 4 devices × (down + up)
    assert sim.parts.comm.total_transfers == {"edge-cloud": 2 * 4, "device-edge": 2 * 24}
    sim, _ = run(algorithm="ring", **{"algorithm.shuffle": False})
    # one hop into every device per round (a fixed ring: the device that ends a round never
    # starts the next, whose hop to itself would cost nothing)
    assert sim.parts.comm.total_transfers == {"device-device": 2 * 4}
    sim, _ = run(algorithm="fedavg")
    assert sim.parts.comm.total_transfers == {"device-cloud": 2 * 8}
    assert sim.parts.comm.total_bytes[("device-cloud", "down")] == 2 * 4 * model_bytes(sim)


def test_sampling_counts_only_sampled_devices():
    sim, _ = run(algorithm="fedsr", clients=8, sample_fraction=0.5, rounds=1,
                 **{"algorithm.cluster_size": 2, "algorithm.ring_passes": 1})
    # 4 sampled devices in 2 rings of 2: 2 edge-cloud and 2 device-edge each way, 1 hop per ring
    assert sim.parts.comm.total_transfers == {"edge-cloud": 4, "device-edge": 4, "device-device": 2}


def test_transfers_to_target():
    rows = [
        {"round": 0, "test_accuracy": 0.1},
        {"round": 1, "test_accuracy": 0.5, "cum_model_transfers": 14, "cum_bytes": 1400,
         "cum_device_device_transfers": 6, "cum_device_device_bytes": 600},
        {"round": 2, "test_accuracy": float("nan"), "cum_model_transfers": 28},
        {"round": 3, "test_accuracy": 0.9, "cum_model_transfers": 42, "cum_bytes": 4200,
         "cum_device_device_transfers": 18, "cum_device_device_bytes": 1800},
    ]
    assert transfers_to_target(rows, 0.5) == {"round": 1.0, "transfers": 14.0, "bytes": 1400.0}
    assert transfers_to_target(rows, 0.6)["transfers"] == 42
    assert transfers_to_target(rows, 0.6, links=["device-device"])["transfers"] == 18
    assert transfers_to_target(rows, 0.95) is None
    with pytest.raises(ValueError):
        transfers_to_target(rows, 0.5, links=["cloud-moon"])


def test_transfers_to_target_reads_a_run(tmp_path):
    sim, rows = run(tmp_path, algorithm="ring", **{"algorithm.shuffle": False})
    cost = transfers_to_target(tmp_path, 0.0)
    assert cost == {"round": 0.0, "transfers": 0.0, "bytes": 0.0}
    best = max(r["test_accuracy"] for r in rows)
    cost = transfers_to_target(tmp_path / "metrics.csv", best)
    assert cost["transfers"] == 4 * cost["round"]
