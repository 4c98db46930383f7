"""Typed algorithm states (fedhet.algorithms.state): every algorithm's server and client states
are its declared dataclasses, survive a checkpoint field for field, and a checkpoint written
before states were typed (untyped dicts, raw client values) resumes to the same result."""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from registered import explained
from same import assert_same
from test_executors import BASE, CASES, WRITTEN

from fedhet.algorithms.base import ALGORITHMS, Algorithm, Message, NoParams, ServerState
from fedhet.algorithms.state import (
    ClientState,
    client_record,
    initial_state,
    restore_client,
    restore_clients,
    restore_state,
)
from fedhet.engine.assembly import assemble
from fedhet.engine.client_store import CLIENT_STATES, read_records
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.rundir.store import TIME_COLUMNS, RunStore, read_checkpoint

NAMES = sorted({CASES[c].get("algorithm", c) for c in CASES} & set(ALGORITHMS.names()))


def settings(name: str, **extra: Any) -> dict[str, Any]:
    """tests/test_executors.py's ready-made digits config for the algorithm (its own case)."""
    return {**BASE, "algorithm": name, **CASES[name], "executor": "sequential", **extra}


def simulate(name: str, out: Path | None = None, resume: bool = False, **extra: Any):
    rows: list[dict[str, Any]] = []
    with explained(name, "tests/test_executors.py", WRITTEN):
        sim = assemble(config_of(settings(name, **extra)), store=RunStore(out) if out else None,
                       log=lambda _: None, callbacks=[rows.append])
        sim.run(resume=resume)
    return sim, rows



def same_row(a: dict[str, Any], b: dict[str, Any]) -> None:
    keys = [k for k in a if k not in TIME_COLUMNS]
    assert keys == [k for k in b if k not in TIME_COLUMNS]
    for k in keys:
        assert_same(a[k], b[k], k)


def test_every_registered_algorithm_is_covered():
    shipped = {entry.name for entry in ALGORITHMS if entry.source == "fedhet"}
    assert shipped <= set(NAMES)  # what other tests load as plugins is theirs


# -- the typed classes -----------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_states_are_the_algorithms_typed_classes(name):
    """`init` returns the algorithm's `ServerState` class; a round's `aggregate` returns a new
    object of the same class and leaves the old one as it was; every client state is the
    algorithm's `ClientState` class (or None, for algorithms whose clients keep none)."""
    sim = assemble(config_of(settings(name)), store=None, log=lambda _: None)
    algo = sim.side.algorithm
    state = algo.init(sim.w0)
    assert isinstance(state, ServerState) and type(state) is algo.state_class
    before = copy.deepcopy(state.to_record())
    new, _ = sim.parts.runner(sim.round_context(), state, 0, list(range(sim.side.run_info.num_clients)))
    assert type(new) is type(state) and new is not state
    assert_same(state.to_record(), before, "old state")
    assert sim.side.clients.states, "no client ran"
    for client_id, c in sim.side.clients.states.items():
        if algo.client_state_class is None:
            assert c is None
        else:
            assert type(c) is algo.client_state_class, client_id
        first = algo.client_init(client_id)
        assert first is None or type(first) is algo.client_state_class


@pytest.mark.parametrize("name", NAMES)
def test_states_round_trip_through_a_checkpoint(name, tmp_path):
    """The engine's store keeps the states as plain records (`weights_only` loading) that come
    back as the same typed states, field for field."""
    sim, _ = simulate(name, tmp_path, rounds=2)
    ckpt = RunStore(tmp_path).load_checkpoint()
    assert isinstance(ckpt["server"], dict)
    assert_same(restore_state(sim.side.algorithm, ckpt["server"]), sim.final_state, "server")
    records = read_records(tmp_path / CLIENT_STATES, ckpt["client_store"])
    assert_same(restore_clients(sim.side.algorithm, records), dict(sim.side.clients.states), "clients")


# -- checkpoints written before states were typed --------------------------------------------
FEDAVG_FAMILY = {"fedavg", "fedavgm", "fedprox", "grab-fedavg", "moon"}


def old_server(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """The untyped server dict the algorithm kept before states were typed: the same keys,
    without what it did not have (the engine popped `_buffers` before saving; FedAvg's family
    had `cum_move` only with `nwda=true`; FedNova `u` only with server momentum)."""
    old = {k: v for k, v in record.items() if k != "buffers"}
    if name in FEDAVG_FAMILY:
        del old["cum_move"]
    if name == "fednova" and old["u"] is None:
        del old["u"]
    return old


def old_client(name: str, record: Any) -> Any:
    """The raw client state kept before states were typed."""
    if record is None:
        return None
    if name == "scaffold":
        return record["c_i"]  # the control variate itself
    if name == "moon":
        return record["w_prev"]  # the previous local model itself
    if name == "bherd-scaffold":
        return {"cursor": record["cursor"], "c": record["c_i"]}
    return dict(record)  # BHerd's {"cursor"}, GraB's dict: the same keys as the fields


@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_from_before_typed_states_resumes_to_the_same_run(name, tmp_path):
    whole, whole_rows = simulate(name, rounds=3)
    simulate(name, tmp_path, rounds=2)
    store = RunStore(tmp_path)
    ckpt = store.load_checkpoint()
    ckpt["server"] = old_server(name, ckpt["server"])
    records = read_records(tmp_path / CLIENT_STATES, ckpt.pop("client_store"))
    ckpt["clients"] = {i: old_client(name, r) for i, r in records.items()}  # inline, as then
    shutil.rmtree(tmp_path / CLIENT_STATES, ignore_errors=True)
    store.save_checkpoint(ckpt)
    assert read_checkpoint(store.ckpt_path)["server"].keys() == ckpt["server"].keys()
    resumed, rows = simulate(name, tmp_path, resume=True, rounds=3)
    assert len(rows) == 1
    same_row(rows[-1], whole_rows[-1])
    assert_same(resumed.final_state, whole.final_state, "server")
    assert_same(resumed.side.clients.states, whole.side.clients.states, "clients")


# -- the records themselves ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, eq=False)
class Probe(ServerState):
    v: Any = None


def test_a_record_holds_only_plain_values():
    w = torch.zeros(2)
    nested = Probe(w=w, v={"a": [1, 2.5, None, torch.ones(1)], "b": "text"})
    assert_same(Probe.from_record(nested.to_record()), nested)
    with pytest.raises(FedhetError, match=r"Probe.v\['x'\] is a set"):
        Probe(w=w, v={"x": {1, 2}}).to_record()
    with pytest.raises(FedhetError, match="Probe.v is a Message"):
        Probe(w=w, v=Message()).to_record()


def test_a_record_of_another_state_is_refused():
    with pytest.raises(FedhetError, match=r"unknown \['c'\]"):
        Probe.from_record({"w": torch.zeros(1), "c": torch.zeros(1)})
    with pytest.raises(FedhetError, match=r"missing \['w'\]"):
        Probe.from_record({"v": 1})
    with pytest.raises(FedhetError, match="not a record"):
        Probe.from_record(torch.zeros(1))
    assert Probe.from_record({"w": torch.zeros(1), "_buffers": torch.ones(1)}).buffers is not None


class Untyped(Algorithm):
    name = "states-test-untyped"

    def init(self, w0: torch.Tensor):
        return {"w": w0.clone()}


def test_an_untyped_init_or_client_state_is_a_clear_error():
    algo = Untyped(NoParams(), None)
    with pytest.raises(FedhetError, match="init returned a dict, not its state class ServerState"):
        initial_state(algo, torch.zeros(2))
    with pytest.raises(FedhetError, match="clients keep none"):
        restore_client(algo, {"c": torch.zeros(1)}, 0)
    with pytest.raises(FedhetError, match="client state is a int"):
        client_record(3)
    assert restore_client(algo, None, 0) is None


def test_client_state_base_has_no_fields():
    assert ClientState().to_record() == {}


# -- a checkpoint continued on another device ------------------------------------------------
def test_on_device_moves_every_tensor_of_a_record_and_leaves_the_rest():
    """`on_device` reaches tensors inside dicts, lists and tuples (the "meta" device stands for
    a GPU here: it exists on every build) and keeps containers' types and plain values."""
    from fedhet.algorithms.state import on_device

    record = {"w": torch.ones(3), "nested": {"c": [torch.zeros(2), (torch.ones(1), 4)]},
              "round": 7, "name": "fedavg", "none": None}
    moved = on_device(record, "meta")
    assert moved["w"].device.type == "meta" and moved["w"].shape == (3,)
    assert moved["nested"]["c"][0].device.type == "meta"
    assert isinstance(moved["nested"]["c"][1], tuple) and moved["nested"]["c"][1][0].is_meta
    assert moved["nested"]["c"][1][1] == 4 and moved["round"] == 7 and moved["name"] == "fedavg"
    assert moved["none"] is None and record["w"].device.type == "cpu"  # the record is not changed


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_a_resume_puts_the_checkpoints_state_on_the_runs_device(name, tmp_path, monkeypatch):
    """A checkpoint is read onto the CPU; the resumed run's state is moved to its own device
    (a CPU checkpoint continued on a GPU computed with CPU tensors before: "Expected all tensors
    to be on the same device"), and the run still ends where the uninterrupted run does."""
    import fedhet.engine.simulation as simulation

    whole, whole_rows = simulate(name, rounds=3)
    simulate(name, tmp_path, rounds=2)
    seen = []
    moved = simulation.states.on_device

    def spy(record, device):
        seen.append((sorted(record) if isinstance(record, dict) else record, device))
        return moved(record, device)

    monkeypatch.setattr(simulation.states, "on_device", spy)
    resumed, rows = simulate(name, tmp_path, resume=True, rounds=3)
    checkpoints = [(keys, device) for keys, device in seen if isinstance(keys, list) and "round" in keys]
    assert len(checkpoints) == 1 and checkpoints[0][1] == resumed.side.plan.device  # the checkpoint, once
    assert {"server", "buffers"} <= set(checkpoints[0][0])
    same_row(rows[-1], whole_rows[-1])
    assert_same(resumed.final_state, whole.final_state, "server")
