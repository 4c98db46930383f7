"""`--workers N`: the sequential executor over forked processes is bit-identical to one worker,
keeps per-client state, isolates a client that raises and reports divergence as one process
does (engine/workers.py)."""

from __future__ import annotations

import pytest
import torch
from faulty import make_client_fail

from fedhet.algorithms.state import Record
from fedhet.cli import main
from fedhet.engine.config import config_of
from fedhet.engine.failures import Diverged
from fedhet.engine.simulation import Simulation
from fedhet.engine.workers import ProcessExecutor

BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 6, "rounds": 2, "lr": 0.05,
        "batch_size": 32, "seed": 4, "model": "mlp", "model.hidden": 16, "executor": "sequential"}

CASES = [
    ("fedavg", {}),
    ("fedprox", {"momentum": 0.5}),
    ("scaffold", {"momentum": 0.5}),
    ("fednova", {"epochs_min": 1, "epochs_max": 3}),
    ("fedveca", {}),
    ("fednnnn", {}),
    ("bherd-scaffold", {}),
    ("grab-fedavg", {}),
    ("hierfavg", {"algorithm.clusters": 2, "algorithm.kappa2": 2}),
    ("moon", {"model": "moon-mlp", "model.hidden": 16}),
    ("fedavg", {"client_dropout": 0.3}),
]


def simulate(workers: int, log=None, patch=None, **settings) -> tuple[Simulation, dict]:
    cfg = config_of({**BASE, **settings, "workers": workers}, "test")
    sim = Simulation(cfg, store=None, log=log or (lambda _: None))
    if patch is not None:
        patch(sim)
    return sim, sim.run()


def same(a, b) -> bool:
    if isinstance(a, Record):  # a typed state: the same class and the same fields
        return type(a) is type(b) and same(a.to_record(), b.to_record())
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # NaN equals NaN here


@pytest.mark.parametrize(("algorithm", "extra"), CASES)
def test_two_workers_are_bit_identical_to_one(algorithm, extra):
    one, s1 = simulate(1, algorithm=algorithm, **extra)
    two, s2 = simulate(2, algorithm=algorithm, **extra)
    assert isinstance(two.executor, ProcessExecutor) and not isinstance(one.executor, ProcessExecutor)
    assert same(one.final_state, two.final_state)
    assert same(one.client_states, two.client_states)
    assert torch.equal(one.buffers, two.buffers)
    assert s1["final_accuracy"] == s2["final_accuracy"] and s1["final_loss"] == s2["final_loss"]


def test_a_client_that_raises_in_a_worker_is_dropped_and_logged_once():
    def patch(sim):
        make_client_fail(sim, 3, "sensor offline")

    lines: dict[int, list[str]] = {1: [], 2: []}
    sims = {w: simulate(w, log=lines[w].append, patch=patch, algorithm="scaffold") for w in (1, 2)}
    assert same(sims[1][0].final_state, sims[2][0].final_state)
    assert lines[1] == lines[2]
    assert sum("client 3" in line and "sensor offline" in line for line in lines[2]) == 2  # 2 rounds
    assert 3 not in sims[2][0].client_states


def test_divergence_in_a_worker_stops_the_run_at_the_same_round_and_client():
    summaries = {w: simulate(w, algorithm="fedavg", lr=1e6)[1] for w in (1, 2)}
    assert summaries[1]["status"] == summaries[2]["status"] == "diverged"
    assert summaries[1].get("diverged") == summaries[2].get("diverged")


def test_diverged_survives_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(Diverged(3, "train_loss", 7)))
    assert (e.round, e.what, e.client_id) == (3, "train_loss", 7) and "round 4" in str(e)


@pytest.mark.parametrize(("flags", "message"), [
    (["--workers", "0"], "--workers must be ≥ 1, got 0"),
    (["--workers", "2", "--executor", "batched"], "use --executor sequential (or auto) with it"),
])
def test_bad_worker_settings_are_one_line(tmp_path, capsys, flags, message):
    argv = ["run", "-d", "digits", "-n", "3", "-r", "1", "--out", str(tmp_path / "r"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_resume_may_change_the_number_of_workers(tmp_path, capsys):
    out = str(tmp_path / "r")
    base = ["run", "-a", "fedavg", "-d", "digits", "-n", "4", "--out", out, "--quiet"]
    assert main([*base, "-r", "2", "--workers", "2"]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", out, "-r", "3", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "workers 2 → 1" in captured.err + captured.out


def test_shared_downlink_sends_a_common_tensor_once_as_a_slot():
    """The global model that every downlink of a round carries goes through shared memory: the
    pickled task holds a slot number, not the model; a tensor only one client gets is pickled."""
    import pickle

    from fedhet.algorithms.base import Message
    from fedhet.engine import workers

    dim = 10_000
    shared = workers.SharedDownlink(dim, slots=1)
    w, own = torch.randn(dim), torch.randn(dim)
    requests = [(0, Message({"w": w, "c_0": own})), (1, Message({"w": w})), (2, Message({"w": w}))]
    packed = shared.pack(requests)
    assert all(isinstance(m.tensors["w"], workers._Slot) for _, m in packed)
    assert packed[0][1].tensors["c_0"] is own
    assert len(pickle.dumps(packed[1][1])) < 1000 < dim
    workers._SLOTS[:] = shared.slots  # what a forked worker inherits
    try:
        back = workers._unpack(packed[0][1])
    finally:
        workers._SLOTS[:] = []
    assert torch.equal(back.tensors["w"], w) and back.tensors["w"] is not w


def test_reply_slots_carry_model_sized_tensors_and_the_rest_is_pickled():
    from fedhet.algorithms.base import Message
    from fedhet.engine import workers

    dim = 50
    slots = [torch.zeros(dim) for _ in range(2)]
    a, b, c, small = torch.randn(dim), torch.randn(dim), torch.randn(dim), torch.randn(3)
    workers._REPLY_SLOTS[:] = slots
    try:
        sent = workers._to_slots(Message({"a": a, "b": b, "c": c, "s": small}, {"x": 1.0}), (1, 0))
    finally:
        workers._REPLY_SLOTS[:] = []
    assert [type(t).__name__ for t in sent.tensors.values()] == ["_Slot", "_Slot", "Tensor", "Tensor"]
    got = workers._from_slots(sent, slots)
    for name, t in {"a": a, "b": b, "c": c, "s": small}.items():
        assert torch.equal(got.tensors[name], t)
    assert got.scalars == {"x": 1.0}
