"""The in-process engine: step counts, sampling, schedules, determinism, learning, accounting."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.clients import LocalWork, learning_rate, local_steps
from fedhet.engine.config import RunConfig, config_of
from fedhet.engine.simulation import LoopSettings, sample_clients
from fedhet.rundir.store import TIME_COLUMNS
from fedhet.runs.single import execute

BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 10, "lr": 0.1}


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_tau_from_epochs_is_floor_e_d_over_b():
    cfg = LocalWork.from_config(RunConfig(batch_size=32, local_epochs=2.5))
    assert local_steps(cfg, 100, 0, 0) == math.floor(2.5 * 100 / 32)
    assert local_steps(cfg, 10, 0, 0) == math.floor(2.5 * 10 / 10)  # batch shrinks to D_i
    assert local_steps(LocalWork.from_config(RunConfig(local_steps=7)), 100, 0, 0) == 7


def test_random_epochs_stay_in_range_and_vary():
    cfg = LocalWork.from_config(RunConfig(batch_size=10, epochs_min=2, epochs_max=5))
    taus = {local_steps(cfg, 100, i, k) for i in range(5) for k in range(5)}
    assert taus <= {20, 30, 40, 50} and len(taus) > 1


def test_sampling_fraction_and_determinism():
    cfg = LoopSettings.from_config(RunConfig(sample_fraction=0.3, seed=4))
    a = sample_clients(cfg, 20, 3)
    assert len(a) == 6 and a == sample_clients(cfg, 20, 3) and a == sorted(set(a))
    assert sample_clients(LoopSettings.from_config(RunConfig()), 20, 3) == list(range(20))


def test_a_simulation_holds_what_the_loop_changes_and_reads_the_rest_from_its_parts():
    """The loop's own state is all a `Simulation` keeps; parts handed in after
    assembly (`sim.parts.runner`, `sim.side.executor`) are the ones the loop then uses."""
    sim = assemble(config_of({"dataset": "digits", "clients": 3, "rounds": 2}), log=lambda _: None)
    runner, rounds = sim.parts.runner, []
    sim.parts.runner = lambda rc, state, k, clients: (rounds.append((k, rc.executor)),
                                                      runner(rc, state, k, clients))[1]
    summary = sim.run()
    assert set(vars(sim)) == {"parts", "store", "log", "callbacks", "notes", "round_failures",
                              "w0", "split", "buffers", "start_round", "state", "final_state"}
    assert rounds == [(0, sim.side.executor), (1, sim.side.executor)]
    assert sim.side is sim.parts.side and summary["rounds_done"] == 2
    w = sim.side.algorithm.eval_params(sim.final_state)
    assert torch.equal(w, sim.side.algorithm.eval_params(sim.state)) and not torch.equal(w, sim.w0)


def test_cosine_schedule_endpoints():
    """Rounds k = 0 … K−1 train: the first with η, the last with η_min, the middle halfway."""
    cfg = LocalWork.from_config(RunConfig(lr=0.01, lr_min=1e-5, lr_schedule="cosine", rounds=11))
    assert learning_rate(cfg, 0) == pytest.approx(0.01)
    assert learning_rate(cfg, 10) == pytest.approx(1e-5)
    assert learning_rate(cfg, 5) == pytest.approx((0.01 + 1e-5) / 2)
    one = LocalWork.from_config(RunConfig(lr=0.01, lr_min=1e-5, lr_schedule="cosine", rounds=1))
    assert learning_rate(one, 0) == 0.01


def test_last_round_trains_at_the_floor(tmp_path):
    from fedhet.runs.single import execute

    execute({"rounds": 4, "clients": 3, "lr": 0.1, "lr_min": 0.001, "lr_schedule": "cosine"},
            tmp_path / "run", log=lambda _: None)
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert float(rows[1]["lr"]) == pytest.approx(0.1) and float(rows[-1]["lr"]) == pytest.approx(0.001)


def test_same_seed_same_metrics_apart_from_time(tmp_path: Path):
    settings = {**BASE, "rounds": 4, "sample_fraction": 0.5}
    execute(settings, tmp_path / "a")
    execute(settings, tmp_path / "b")
    a, b = read_rows(tmp_path / "a" / "metrics.csv"), read_rows(tmp_path / "b" / "metrics.csv")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in rows]  # noqa: E731
    assert strip(a) == strip(b)
    execute({**settings, "seed": 1}, tmp_path / "c")
    assert strip(read_rows(tmp_path / "c" / "metrics.csv")) != strip(a)


def test_bytes_count_every_model_sent():
    cfg = config_of({**BASE, "rounds": 2, "sample_fraction": 0.5})
    sim = assemble(cfg)
    sim.run()
    model_bytes = sim.side.model.dim * 4
    # FedAvg: each sampled client gets w and returns Δ plus 3 scalars (8 bytes each).
    assert sim.parts.comm.total_transfers["device-cloud"] == 2 * 5 * 2
    down = sim.parts.comm.total_bytes[("device-cloud", "down")]
    up = sim.parts.comm.total_bytes[("device-cloud", "up")]
    assert down == 2 * 5 * model_bytes
    assert up == 2 * 5 * (model_bytes + 3 * 8)


def test_central_uses_all_data_as_one_client():
    cfg = config_of({**BASE, "algorithm": "central", "rounds": 1, "local_steps": 5})
    sim = assemble(cfg)
    assert len(sim.side.client_indices) == 1
    assert len(sim.side.client_indices[0]) == len(sim.side.data.y_train)
    w0 = sim.w0.clone()
    sim.run()
    assert not torch.equal(sim.final_state.w, w0)
