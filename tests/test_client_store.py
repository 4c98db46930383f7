"""Client states within a memory budget (fedhet.engine.client_store): a run whose states are
spilled to files after every update gives the rows and states of one that keeps them all in
memory, for every algorithm whose clients keep state; a resume from spilled states equals the
uninterrupted run, even after a kill between a spill and the next checkpoint; a checkpoint
writes only the clients that changed; a client never sampled never gets a state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from same import assert_same
from test_executors import BASE, CASES

from fedhet.algorithms.base import ALGORITHMS, PER_CLIENT_COLUMNS
from fedhet.engine.assembly import assemble
from fedhet.engine.client_store import CLIENT_STATES, ClientStateStore, state_nbytes
from fedhet.engine.config import config_of
from fedhet.engine.simulation import sample_clients
from fedhet.errors import FedhetError
from fedhet.rundir.store import TIME_COLUMNS, RunStore, read_checkpoint

STATEFUL = ["scaffold", "moon", "grab-fedavg", "bherd", "bherd-fednova", "bherd-scaffold", "fedsr"]
"""The algorithms whose clients keep a state between rounds."""

SPILL = 0.0
"""`client_state_memory_mb` that keeps no state in memory between updates: every update spills."""

SAMPLED = {"clients": 6, "sample_fraction": 0.5, "client_steps": [3, 5, 2, 4, 3, 2]}
"""Half the clients a round: some are pushed out and come back in a later round."""


def test_every_stateful_algorithm_is_covered():
    kept = {n for n in ALGORITHMS.names() if ALGORITHMS.get(n).factory.client_state_class}
    assert kept == {CASES[c].get("algorithm", c) for c in STATEFUL}


def settings(case: str, **extra: Any) -> dict[str, Any]:
    out = {**BASE, "algorithm": CASES[case].get("algorithm", case), **CASES[case],
           "executor": "sequential", "rounds": 3, "model_params": {"hidden": 8}}
    if case == "moon":
        out["model_params"] = {"hidden": 8, "proj_dim": 8}
    if "client_steps" in out and out["client_steps"]:
        out["client_steps"] = SAMPLED["client_steps"]
    return {**out, **{k: v for k, v in SAMPLED.items() if k != "client_steps"}, **extra}


def simulate(case: str, out: Path | None = None, resume: bool = False, callbacks=(), **extra):
    rows: list[dict[str, Any]] = []
    sim = assemble(config_of(settings(case, **extra)), store=RunStore(out) if out else None,
                   log=lambda _: None, callbacks=[rows.append, *callbacks])
    sim.run(resume=resume)
    return sim, rows


def same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        keys = [k for k in x if k not in TIME_COLUMNS]
        assert keys == [k for k in y if k not in TIME_COLUMNS]
        for k in keys:
            assert_same(x[k], y[k], k)


def same_run(a, a_rows, b, b_rows) -> None:
    same_rows(a_rows, b_rows)
    assert_same(a.final_state, b.final_state, "server")
    assert_same(a.side.clients.states, b.side.clients.states, "clients")


# -- results do not depend on the budget --------------------------------------------------------
@pytest.mark.parametrize("case", STATEFUL)
def test_spilling_every_state_gives_the_run_kept_in_memory(case):
    kept, kept_rows = simulate(case)
    spilled, spilled_rows = simulate(case, client_state_memory_mb=SPILL)
    store = spilled.side.clients.states
    assert store.spills > 0 and store.loads > 0, "no state went to a file and came back"
    assert kept.side.clients.states.spills == 0 and kept.side.clients.states.loads == 0
    same_run(spilled, spilled_rows, kept, kept_rows)


def test_a_budget_of_a_few_states_keeps_the_recent_ones_and_the_same_results(tmp_path):
    """A budget of two SCAFFOLD states: at most two stay resident, the rest are read back."""
    probe, _ = simulate("scaffold", rounds=1)
    one = state_nbytes(next(iter(probe.side.clients.states.values())))
    budget = 2 * one / 2**20
    kept, kept_rows = simulate("scaffold", rounds=4)
    small, small_rows = simulate("scaffold", tmp_path, rounds=4, client_state_memory_mb=budget)
    store = small.side.clients.states
    assert len(store.resident()) <= 2 and store.resident_bytes <= 2 * one
    assert store.loads > 0
    same_run(small, small_rows, kept, kept_rows)


@pytest.mark.parametrize("executor", ["stacked", "workers"])
def test_the_other_executors_work_with_spilled_states(executor):
    extra = {"workers": 2} if executor == "workers" else {"executor": "stacked"}
    kept, kept_rows = simulate("scaffold", **extra)
    spilled, spilled_rows = simulate("scaffold", client_state_memory_mb=SPILL, **extra)
    assert spilled.side.executor.name == kept.side.executor.name
    assert spilled.side.clients.states.loads > 0
    same_run(spilled, spilled_rows, kept, kept_rows)


# -- resume ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["scaffold", "grab-fedavg"])
def test_a_resume_from_spilled_states_equals_the_uninterrupted_run(case, tmp_path):
    whole, whole_rows = simulate(case, rounds=4)
    simulate(case, tmp_path, rounds=2, client_state_memory_mb=SPILL)
    resumed, rows = simulate(case, tmp_path, resume=True, rounds=4, client_state_memory_mb=SPILL)
    assert len(rows) == 2
    same_rows(rows, whole_rows[-2:])
    assert_same(resumed.final_state, whole.final_state, "server")
    assert_same(resumed.side.clients.states, whole.side.clients.states, "clients")


class Kill:
    """Raise `KeyboardInterrupt` once round `at` is saved (its checkpoint, if any, written)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round(self, row: dict[str, Any]) -> None:
        if row["round"] == self.at:
            raise KeyboardInterrupt


def test_states_spilled_after_the_checkpoint_are_not_read_on_resume(tmp_path):
    """Killed after round 3 with its states spilled but its checkpoint not written (one every
    2 rounds): the resume starts from round 2's states, deletes the newer files, and ends as
    the uninterrupted run."""
    whole, whole_rows = simulate("scaffold", rounds=4)
    with pytest.raises(KeyboardInterrupt):
        simulate("scaffold", tmp_path, rounds=4, checkpoint_every=2, client_state_memory_mb=SPILL,
                 callbacks=[Kill(3)])
    files = {p.name for p in (tmp_path / CLIENT_STATES).iterdir()}
    assert any(name.endswith("-3.pt") for name in files), "round 3 spilled nothing"
    assert RunStore(tmp_path).load_checkpoint()["round"] == 2
    resumed, rows = simulate("scaffold", tmp_path, resume=True, rounds=4, checkpoint_every=2,
                             client_state_memory_mb=SPILL)
    same_rows(rows, whole_rows[-2:])
    assert_same(resumed.side.clients.states, whole.side.clients.states, "clients")


def test_a_missing_state_file_is_one_line(tmp_path):
    simulate("scaffold", tmp_path, rounds=2)
    for path in (tmp_path / CLIENT_STATES).iterdir():
        path.unlink()
    with pytest.raises(FedhetError, match="client state files"):
        simulate("scaffold", tmp_path, resume=True, rounds=3)


# -- what a checkpoint writes ------------------------------------------------------------------
class Listing:
    """The state files in the run directory after each saved round."""

    def __init__(self, out: Path) -> None:
        self.out = out / CLIENT_STATES
        self.after: dict[int, set[str]] = {}

    def on_round(self, row: dict[str, Any]) -> None:
        self.after[int(row["round"])] = {p.name for p in self.out.iterdir()} if self.out.is_dir() else set()


def test_a_checkpoint_writes_only_the_clients_of_its_round(tmp_path):
    listing = Listing(tmp_path)
    sim, _ = simulate("scaffold", tmp_path, rounds=3, callbacks=[listing])
    ckpt = RunStore(tmp_path).load_checkpoint()
    assert "clients" not in ckpt  # no state inline: a manifest of files
    manifest = ckpt["client_store"]
    sampled = [sample_clients(sim.parts.loop, 6, k) for k in range(3)]
    assert manifest["changed"].tolist() == sampled[2]
    for k in (1, 2):  # round k + 1's checkpoint added the files of round k + 1's clients only
        new = listing.after[k + 1] - listing.after[k]
        assert new == {f"{c}-{k + 1}.pt" for c in sampled[k]}
    versions = dict(zip(manifest["ids"].tolist(), manifest["versions"].tolist(), strict=True))
    assert set(versions) == set().union(*sampled)
    for c, v in versions.items():  # each client's newest state is the file of its last round
        assert v == 1 + max(k for k in range(3) if c in sampled[k])
    # what this checkpoint or the previous one (the fallback) names is left on disk, no more
    prev = read_checkpoint(RunStore(tmp_path).prev_ckpt_path)["client_store"]
    named = {f"{c}-{v}.pt" for m in (manifest, prev)
             for c, v in zip(m["ids"].tolist(), m["versions"].tolist(), strict=True)}
    assert {p.name for p in (tmp_path / CLIENT_STATES).iterdir()} == named


def test_clients_never_sampled_never_get_a_state(tmp_path):
    cfg = settings("scaffold", rounds=2, clients=8, sample_fraction=0.25, client_steps=[],
                   local_steps=2)
    sim = assemble(config_of(cfg), store=RunStore(tmp_path), log=lambda _: None)
    made: list[int] = []
    inner = sim.side.algorithm.client_init
    sim.side.algorithm.client_init = lambda i: made.append(i) or inner(i)
    sim.run()
    sampled = {c for k in range(2) for c in sample_clients(sim.parts.loop, 8, k)}
    assert len(sampled) < 8
    assert set(made) == sampled and set(sim.side.clients.states) == sampled
    on_disk = {int(p.name.split("-")[0]) for p in (tmp_path / CLIENT_STATES).iterdir()}
    assert on_disk == sampled


# -- the store itself ----------------------------------------------------------------------------
def scaffold_store(budget: int | None, directory: Path | None = None) -> ClientStateStore:
    sim = assemble(config_of(settings("scaffold", rounds=1)), store=None, log=lambda _: None)
    return ClientStateStore(sim.side.algorithm, budget, directory)


def test_the_store_keeps_the_budget_and_the_least_recently_used_go_first(tmp_path):
    from fedhet.algorithms.scaffold import ScaffoldClientState

    one = state_nbytes(ScaffoldClientState(c_i=torch.zeros(1000)))
    store = scaffold_store(3 * one, tmp_path)
    for c in range(5):
        store.put(c, ScaffoldClientState(c_i=torch.full((1000,), float(c))), 1)
    assert store.resident() == [2, 3, 4] and store.resident_bytes <= 3 * one
    assert {p.name for p in tmp_path.iterdir()} == {"0-1.pt", "1-1.pt"}
    assert float(store[0].c_i[0]) == 0.0  # read back, now the most recent
    assert store.resident() == [3, 4, 0]
    held = store.checkout(3)  # out for an update: not pushed out meanwhile
    for c in (5, 6):
        store.put(c, ScaffoldClientState(c_i=torch.zeros(1000)), 2)
    assert 3 in store.resident() and held is store[3]
    assert len(store) == 7 and 9 not in store


def test_a_state_that_views_a_stack_is_written_alone(tmp_path):
    from fedhet.algorithms.scaffold import ScaffoldClientState

    stack = torch.arange(20_000, dtype=torch.float32).reshape(20, 1000)
    store = scaffold_store(0, tmp_path)
    store.put(7, ScaffoldClientState(c_i=stack[3]), 1)
    assert (tmp_path / "7-1.pt").stat().st_size < 20_000  # one row, not the whole stack
    assert torch.equal(store[7].c_i, stack[3])


# -- a round's row does not grow with the clients ------------------------------------------------
@pytest.mark.parametrize("case", ["fedveca", "bherd"])
def test_per_client_diagnostics_beyond_the_column_limit_hold_the_rounds_clients(case, tmp_path):
    n = PER_CLIENT_COLUMNS + 20
    sim, rows = simulate(case, tmp_path, rounds=2, clients=n, sample_fraction=0.05, client_steps=[],
                         local_steps=3, partition="iid")
    assert not [k for k in rows[-1] if k.startswith(("tau_", "beta_", "herd_dist_", "kept_"))
                and k.split("_")[-1].isdigit()]
    records = [json.loads(line) for line in (tmp_path / "diagnostics.jsonl").read_text().splitlines()]
    for k, record in enumerate(records):
        sampled = {str(c) for c in sample_clients(sim.parts.loop, n, k)}
        assert set(record["tau_per_client"]) == sampled
        assert all(v >= 1 for v in record["tau_per_client"].values())


def test_per_client_columns_up_to_the_limit_cover_every_client():
    _, rows = simulate("fedveca", rounds=1)
    assert [k for k in rows[-1] if k.startswith("tau_") and k[4:].isdigit()] == [f"tau_{i}" for i in range(6)]


def test_a_client_that_raises_keeps_its_state_as_changed_whatever_the_budget():
    """A client whose update raises after changing its state in place keeps the changed state
    (what a dict of states holds), whether its state was in memory or read back for the update."""

    def run(budget: float):
        sim = assemble(config_of(settings("scaffold", rounds=4, client_state_memory_mb=budget)),
                       store=None, log=lambda _: None)
        sampled = [sample_clients(sim.parts.loop, 6, k) for k in range(4)]
        fail = next((k, c) for k in range(1, 4) for c in sampled[k]
                    if any(c in sampled[j] for j in range(k)))  # a client with a state already
        inner = sim.side.algorithm.client_update

        def faulty(message, ctx, state):
            if (ctx.round, ctx.client_id) == fail:
                state.c_i.add_(1.0)
                raise RuntimeError("after changing its state")
            return inner(message, ctx, state)

        sim.side.algorithm.client_update = faulty
        rows: list[dict[str, Any]] = []
        sim.callbacks.append(rows.append)
        sim.run()
        return sim, rows, fail

    kept, kept_rows, (round, _) = run(1024)
    spilled, spilled_rows, _ = run(SPILL)
    assert next(r for r in kept_rows if r["round"] == round + 1)["clients_failed"] == 1
    same_run(spilled, spilled_rows, kept, kept_rows)
    assert spilled.side.clients.states.loads > 0


def test_a_state_read_back_lands_on_the_stores_device(tmp_path):
    """A state file is read onto the store's device (a GPU run resuming states a CPU run wrote,
    or the reverse; "meta" stands for the other device here), not where it was saved."""
    from fedhet.algorithms.scaffold import ScaffoldClientState

    store = scaffold_store(0, tmp_path)
    store.device = "meta"
    store.put(3, ScaffoldClientState(c_i=torch.ones(10)), 1)  # budget 0: written out at once
    assert store.resident() == [] and (tmp_path / "3-1.pt").exists()
    back = store[3].c_i
    assert back.device.type == "meta" and back.shape == (10,)
    assert scaffold_store(0, tmp_path).device is None  # a store made alone reads where saved
