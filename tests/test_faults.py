"""Simulated faults: dropout, stragglers, clients that raise, empty rounds, rings, divergence.

Runner-level cases use a small hand-made round context (known replies, no training); engine
cases run tiny digits simulations.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from fedhet.algorithms.base import ALGORITHMS, Message, RunInfo
from fedhet.engine.assembly import assemble
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import build, config_of, parse
from fedhet.engine.failures import ClientFailure, Diverged
from fedhet.engine.faults import DROPPED, LATE, OK, FaultModel, isolate
from fedhet.engine.rounds import edge_ring_round, ring_round, star_round
from fedhet.engine.simulation import Simulation
from fedhet.errors import FedhetError

BASE = {
    "dataset": "digits", "partition": "iid", "clients": 6, "rounds": 2, "lr": 0.1,
    "local_steps": 2, "batch_size": 16, "model": "mlp", "model_params": {"hidden": 8},
}


def simulate(algorithm: str = "fedavg", **settings) -> tuple[Simulation, list[str]]:
    cfg = config_of({**BASE, "algorithm": algorithm, **settings}, "test")
    lines: list[str] = []
    sim = assemble(cfg, store=None, log=lines.append)
    sim.run()
    return sim, lines


class Drop:
    """A fault model that drops a fixed set of clients (late ones in `late`) in every round."""

    def __init__(self, dropped=(), late=()):
        self.dropped, self.late = set(dropped), set(late)

    def outcome(self, client_id: int, round: int) -> str:
        return DROPPED if client_id in self.dropped else LATE if client_id in self.late else OK


class Context:
    """A round context whose clients return prebuilt replies (or raise)."""

    def __init__(self, algorithm, replies, faults=None, raises=(), dim=3):
        self.algorithm = algorithm
        self.comm = CommLedger(dim)
        self.faults = faults or FaultModel()
        self.replies = replies
        self.raises = set(raises)
        self.calls: list[int] = []
        self.lines: list[str] = []
        self.log = self.lines.append

    def configure(self, state, client_id, round):
        return self.algorithm.configure(state, client_id, round)

    def client_update(self, client_id, message, round):
        self.calls.append(client_id)
        if client_id in self.raises:
            raise RuntimeError(f"disk full on {client_id}")
        return self.replies(client_id, message)

    def client_updates(self, round, requests):
        for client_id, message in requests:
            yield client_id, self.client_update(client_id, message, round)


def algorithm(name: str, num_clients: int = 4, dim: int = 3, **params):
    run = RunInfo(num_clients, 1, 0.1, 0.0, 0.0, 0, dim, ())
    return ALGORITHMS.get(name).factory(ALGORITHMS.params(name, params), run)


SIZES = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}


def delta(i: int) -> torch.Tensor:
    return torch.tensor([1.0 + i, -float(i), 0.5 * i])


def star_reply(i: int, message: Message) -> Message:
    return Message(
        {"delta": delta(i), "delta_c": 2 * delta(i), "d": -delta(i)},
        {"num_samples": SIZES[i], "steps": 2.0 + i, "train_loss": 0.1 * i, "a": 1.0 + i, "lr": 0.1},
    )


# -- the fault model ----------------------------------------------------------------------
def test_outcomes_are_fixed_by_seed_round_and_client():
    faults = FaultModel(seed=3, client_dropout=0.3, straggler_fraction=0.2)
    table = [[faults.outcome(c, k) for c in range(50)] for k in range(4)]
    again = FaultModel(seed=3, client_dropout=0.3, straggler_fraction=0.2)
    assert table == [[again.outcome(c, k) for c in range(50)] for k in range(4)]
    flat = [o for row in table for o in row]
    assert {DROPPED, LATE, OK} == set(flat)
    assert table[0] != table[1]  # a fresh draw every round
    assert FaultModel(seed=4, client_dropout=0.3).outcome != faults.outcome
    # dropout draws do not depend on the straggler setting
    only = FaultModel(seed=3, client_dropout=0.3)
    assert [only.outcome(c, 0) == DROPPED for c in range(50)] == [o == DROPPED for o in table[0]]
    assert all(FaultModel(client_dropout=1.0).outcome(c, 0) == DROPPED for c in range(10))
    assert all(FaultModel().outcome(c, 0) == OK for c in range(10))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("client_dropout", "1.5", "client_dropout must be a probability in [0, 1], got 1.5"),
        ("client_dropout", "-0.1", "client_dropout must be a probability in [0, 1]"),
        ("straggler_fraction", "2", "straggler_fraction must be a probability in [0, 1], got 2.0"),
    ],
)
def test_settings_are_validated_with_one_line(key, value, message):
    values = parse([f"{key}={value}"], "--set")
    with pytest.raises(FedhetError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        build(values)
    assert "\n" not in str(err.value)


def test_straggler_policy_accepts_only_drop():
    assert build(parse(["straggler_policy=drop"], "--set")).straggler_policy == "drop"
    with pytest.raises(FedhetError):
        parse(["straggler_policy=stale"], "--set")


# -- partial participation: each algorithm against a hand computation ----------------------
@pytest.mark.parametrize(
    ("name", "faults"),
    [
        ("fedavg", Drop(dropped={1})),
        ("scaffold", Drop(late={0, 2})),
        ("fednova", Drop(dropped={3}, late={1})),
    ],
)
def test_partial_participation_matches_hand_computation(name, faults):
    algo = algorithm(name)
    state = algo.init(torch.zeros(3))
    rc = Context(algo, star_reply, faults)
    new, diag = star_round(rc, state, 0, [0, 1, 2, 3])
    kept = [i for i in range(4) if i not in faults.dropped | faults.late]
    assert rc.calls == kept  # dropped clients do no work
    total = sum(SIZES[i] for i in kept)
    p = {i: SIZES[i] / total for i in kept}
    mean = sum(p[i] * delta(i) for i in kept)
    if name == "fedavg":
        assert torch.allclose(new.w, mean)
    elif name == "scaffold":
        assert torch.allclose(new.w, mean)
        assert torch.allclose(new.c, (len(kept) / 4) * 2 * mean)  # c += (|S|/N) Σ_S p_i Δc_i
    else:
        tau_eff = sum(p[i] * (1.0 + i) for i in kept)
        assert diag["tau_eff"] == pytest.approx(tau_eff)
        assert torch.allclose(new.w, 0.1 * tau_eff * mean)  # w − η τ_eff Σ p_i d_i, d_i = −Δ_i
    assert diag["clients_sampled"] == 4
    assert diag["clients_returned"] == len(kept)
    assert diag["clients_dropped"] == len(faults.dropped) + len(faults.late)
    assert diag["clients_late"] == len(faults.late)
    assert diag["clients_failed"] == 0
    # every sampled client was sent the model; only the ones that returned are billed up
    down = 2 if name == "scaffold" else 1  # SCAFFOLD sends x and c
    assert rc.comm.round_transfers["device-cloud"] == 4 * down + 3 * len(kept)


def test_a_client_that_raises_is_dropped_and_logged():
    algo = algorithm("fedavg")
    rc = Context(algo, star_reply, raises={2})
    new, diag = star_round(rc, algo.init(torch.zeros(3)), 4, [0, 1, 2, 3])
    kept = [0, 1, 3]
    total = sum(SIZES[i] for i in kept)
    assert torch.allclose(new.w, sum(SIZES[i] / total * delta(i) for i in kept))
    assert diag["clients_failed"] == 1 and diag["clients_returned"] == 3
    assert rc.calls == [0, 1, 2, 3]
    # the line names the code that raised: here this file's fake client half
    [line] = rc.lines
    said, where = line.split(" (")
    assert said == "round 5: client 2 failed and is dropped for the round: RuntimeError: disk full on 2"
    assert re.fullmatch(r"(tests/)?test_faults\.py:\d+ in client_update\)", where)


def test_executor_failures_are_accepted_from_any_executor():
    """A parallel executor yields ClientFailure items itself; one that loses a client is a
    failure too."""
    algo = algorithm("fedavg")

    class Pool(Context):
        def client_updates(self, round, requests):
            for client_id, message in reversed(requests):
                if client_id == 0:
                    yield client_id, ClientFailure(client_id, round, "OSError: worker died")
                elif client_id != 3:
                    yield client_id, self.client_update(client_id, message, round)

    rc = Pool(algo, star_reply)
    new, diag = star_round(rc, algo.init(torch.zeros(3)), 0, [0, 1, 2, 3])
    assert torch.allclose(new.w, (2 * delta(1) + 3 * delta(2)) / 5)
    assert diag["clients_failed"] == 2
    assert rc.lines[0].endswith("OSError: worker died")
    assert "no reply from the executor" in rc.lines[1]


def test_isolate_restarts_a_sequential_executor_after_the_failing_client():
    rc = Context(algorithm("fedavg"), star_reply, raises={0, 2})
    requests = [(i, Message()) for i in range(4)]
    out = list(isolate(rc.client_updates, 0, requests))
    assert [c for c, _ in out] == [0, 1, 2, 3]
    assert [isinstance(r, ClientFailure) for _, r in out] == [True, False, True, False]


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fednova", "fedveca", "bherd"])
def test_nobody_returns_keeps_the_state(name):
    algo = algorithm(name)
    state = algo.init(torch.ones(3))
    rc = Context(algo, star_reply, Drop(dropped={0, 1}), raises={2})
    new, diag = star_round(rc, state, 0, [0, 1, 2])
    assert new is state
    assert diag == {
        "clients_sampled": 3.0, "clients_returned": 0.0, "clients_dropped": 2.0,
        "clients_late": 0.0, "clients_failed": 1.0,
    }
    assert rc.lines[-1] == "round 1: no client returned; server state kept"


@pytest.mark.parametrize(
    ("what", "reply"),
    [
        ("tensor 'delta'", Message({"delta": torch.tensor([1.0, math.nan, 0.0])}, {"num_samples": 1.0})),
        ("train_loss", Message({"delta": torch.zeros(3)}, {"num_samples": 1.0, "train_loss": math.inf})),
    ],
)
def test_non_finite_reply_is_divergence_not_a_fault(what, reply):
    algo = algorithm("fedavg")
    rc = Context(algo, lambda i, m: reply if i == 1 else star_reply(i, m))
    with pytest.raises(Diverged) as err:
        star_round(rc, algo.init(torch.zeros(3)), 2, [0, 1, 2])
    assert (err.value.round, err.value.what, err.value.client_id) == (2, what, 1)


# -- rings ---------------------------------------------------------------------------------
def ring_reply(i: int, message: Message) -> Message:
    hop = message.scalars.get("hop", 0.0)
    return Message(
        {"w": message.tensors["w"] + 1.0},
        {"hop": hop + 1, "loss_sum": message.scalars.get("loss_sum", 0.0) + 0.5,
         "num_samples": 1.0, "steps": 1.0, "ring_samples": message.scalars.get("ring_samples", 0.0) + 1},
    )


def ring_algorithm(name: str, **params):
    run = RunInfo(4, 1, 0.1, 0.0, 0.0, 0, 3, ())
    return ALGORITHMS.get(name).factory(ALGORITHMS.params(name, {"shuffle": False, **params}), run)


@pytest.mark.parametrize(("dropped", "raises"), [({1}, ()), ((), {1}), ({0}, {3})])
def test_ring_skips_dropped_and_failed_devices(dropped, raises):
    algo = ring_algorithm("ring")
    rc = Context(algo, ring_reply, Drop(dropped=dropped), raises=raises)
    new, diag = ring_round(rc, algo.init(torch.zeros(3)), 0, [0, 1, 2, 3])
    live = [d for d in range(4) if d not in dropped]
    assert rc.calls == live  # a dropped device is never contacted; a failing one is tried
    answered = [d for d in live if d not in raises]
    assert torch.equal(new.w, torch.full((3,), float(len(answered))))
    assert new.holder == answered[-1]
    # one hop into each device that was tried (the entry hop included)
    assert rc.comm.round_transfers["device-device"] == len(live)
    assert diag["clients_returned"] == len(answered)


def test_ring_with_nobody_left_keeps_the_state():
    algo = ring_algorithm("ring")
    state = algo.init(torch.zeros(3))
    rc = Context(algo, ring_reply, Drop(dropped={0, 1}), raises={2, 3})
    new, diag = ring_round(rc, state, 0, [0, 1, 2, 3])
    assert new is state and diag["clients_failed"] == 2 and diag["clients_dropped"] == 2
    rc = Context(algo, ring_reply, Drop(dropped={0, 1, 2, 3}))
    new, _ = ring_round(rc, state, 0, [0, 1, 2, 3])
    assert new is state and rc.calls == []


def test_edge_ring_skips_an_edge_with_nobody_left():
    algo = ring_algorithm("fedsr", clusters=2, ring_passes=2)
    state = algo.init(torch.zeros(3))
    rc = Context(algo, ring_reply, Drop(dropped={0, 1}))
    new, diag = edge_ring_round(rc, state, 0, [0, 1, 2, 3])
    # edge 1 (devices 2, 3) ran 2 passes: 4 hops, each adding 1; edge 0 sent no report
    assert torch.equal(new.w, torch.full((3,), 4.0))
    assert diag["edges"] == 1.0 and rc.calls == [2, 3, 2, 3]
    assert rc.comm.round_transfers["edge-cloud"] == 3  # two downlinks, one report


# -- ring of one device: no bill for a hop to itself ---------------------------------------
def test_ring_of_one_device_bills_no_hop_to_itself():
    sim, _ = simulate("ring", clients=1, rounds=3)
    # the initialiser → device hop of round 0; afterwards the model never leaves the device
    assert dict(sim.parts.comm.total_transfers) == {"device-device": 1}
    sim, _ = simulate("fedsr", clients=1, rounds=2, **{"algorithm.clusters": 1, "algorithm.ring_passes": 3})
    # per round: cloud ↔ edge and edge ↔ device, but none of the R − 1 = 2 passes to itself
    assert dict(sim.parts.comm.total_transfers) == {"edge-cloud": 4, "device-edge": 4}
    assert ("device-device", "peer") not in sim.parts.comm.total_bytes


# -- engine runs ---------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["fedavg", "scaffold", "fednova"])
def test_dropout_zero_equals_the_plain_run(algo):
    plain, _ = simulate(algo)
    zero, _ = simulate(algo, client_dropout=0.0, straggler_fraction=0.0)
    assert torch.equal(plain.final_state.w, zero.final_state.w)


def test_dropout_is_reproducible_and_changes_the_run():
    settings = {"client_dropout": 0.4, "straggler_fraction": 0.2, "rounds": 3, "seed": 5}
    a, _ = simulate("scaffold", **settings)
    b, _ = simulate("scaffold", **settings)
    plain, _ = simulate("scaffold", rounds=3, seed=5)
    assert torch.equal(a.final_state.w, b.final_state.w)
    assert not torch.equal(a.final_state.w, plain.final_state.w)
    faults = FaultModel(seed=5, client_dropout=0.4, straggler_fraction=0.2)
    dropped = sum(faults.outcome(c, k) != OK for c in range(6) for k in range(3))
    assert dropped > 0


@pytest.mark.parametrize("algo", ["fedavg", "ring", "fedsr", "hierfavg"])
def test_all_clients_dropped_keeps_the_initial_model(algo):
    edges = {"algorithm.clusters": 2} if algo in ("fedsr", "hierfavg") else {}
    sim, lines = simulate(algo, client_dropout=1.0, **edges)
    assert torch.equal(sim.final_state.w, sim.w0)
    assert lines.count("round 1: no client returned; server state kept") == 1
    assert sim.parts.comm.total_transfers.get("device-device", 0) == 0


def test_a_raising_client_is_dropped_and_the_run_finishes():
    cfg = config_of({**BASE, "algorithm": "fedavg"})
    lines: list[str] = []
    sim = assemble(cfg, store=None, log=lines.append)
    update = sim.side.algorithm.client_update

    def flaky(message, ctx, state):
        if ctx.client_id == 4 and ctx.round == 1:
            raise ValueError("simulated crash")
        return update(message, ctx, state)

    sim.side.algorithm.client_update = flaky
    rows: list[dict] = []
    sim.callbacks.append(rows.append)
    summary = sim.run()
    assert summary["finished"] and summary["rounds_done"] == 2
    [line] = lines  # naming the code that raised: `flaky`, above
    assert re.fullmatch(r"round 2: client 4 failed and is dropped for the round: ValueError: "
                        r"simulated crash \((tests/)?test_faults\.py:\d+ in flaky\)", line)
    assert [r["clients_failed"] for r in rows] == [0.0, 1.0]
    assert [r["clients_returned"] for r in rows] == [6.0, 5.0]


@pytest.mark.parametrize("executor", ["sequential", "stacked"])
def test_a_client_update_that_raises_names_the_round_and_ctx_round(monkeypatch, executor):
    """The algorithm's own client half raises for one client in the second round: its line
    names the round as runs count it and the index `ctx.round` it got."""
    cfg = config_of({**BASE, "algorithm": "fedavg", "executor": executor})
    lines: list[str] = []
    sim = assemble(cfg, store=None, log=lines.append)
    cls = type(sim.side.algorithm)
    update = cls.client_update

    def client_update(self, message, ctx, state):
        if ctx.client_id == 4 and ctx.round == 1:
            raise ValueError("simulated crash")
        return update(self, message, ctx, state)

    monkeypatch.setattr(cls, "client_update", client_update)
    assert sim.run()["finished"]
    [line] = lines
    assert re.fullmatch(r"round 2 \(ctx\.round=1 in client_update's arguments\): client 4 failed "
                        r"and is dropped for the round: ValueError: simulated crash "
                        r"\((tests/)?test_faults\.py:\d+ in client_update\)", line), line


def test_a_resumed_run_drops_the_same_clients(tmp_path):
    from fedhet.rundir.store import RunStore

    settings = {"algorithm": "scaffold", "client_dropout": 0.4, "straggler_fraction": 0.2, "seed": 2}
    cfg = config_of({**BASE, "rounds": 4, **settings}, "test")
    whole = assemble(cfg, store=None, log=lambda _: None)
    whole.run()
    cfg2 = config_of({**BASE, "rounds": 2, **settings}, "test")
    assemble(cfg2, store=RunStore(tmp_path), log=lambda _: None).run()
    resumed = assemble(cfg, store=RunStore(tmp_path), log=lambda _: None)
    runner, rounds = resumed.parts.runner, []
    resumed.parts.runner = lambda rc, state, k, clients: (rounds.append(k), runner(rc, state, k, clients))[1]
    resumed.run(resume=True)
    assert rounds == [2, 3]  # it did continue from the checkpoint
    assert torch.equal(resumed.final_state.w, whole.final_state.w)
    assert torch.equal(resumed.final_state.c, whole.final_state.c)


def test_every_client_failing_in_fedhets_own_code_is_not_blamed_on_the_user(monkeypatch):
    """All clients of a round raise inside a built-in algorithm (no frame of the user's): the
    run fails naming fedhet's frame, and the summary's `user_code` says it is not the user's."""
    from fedhet.engine.failures import UserCodeFailed
    from fedhet.training.local import LocalTrainer

    monkeypatch.setattr(LocalTrainer, "sgd", math.hypot)  # raises in C: "no keyword arguments"
    sim = assemble(config_of({**BASE, "algorithm": "fedavg"}), store=None, log=lambda _: None)
    with pytest.raises(UserCodeFailed) as caught:
        sim.run()
    failed = caught.value
    assert failed.user is False and failed.record()["user_code"] is False
    assert re.search(r"fedhet/algorithms/fedavg\.py:\d+ in local_sgd_update$", failed.where)
    assert "every client that ran in round 1 failed" in failed.error



def test_one_line_runs_a_message_together_and_quotes_no_source():
    from fedhet.errors import one_line

    assert one_line(ValueError("two\n  lines")) == "ValueError: two lines"
    assert one_line(KeyError()) == "KeyError"
    try:
        compile("x = (", "plugin.py", "exec")
    except SyntaxError as e:
        line = one_line(e)
    assert line.startswith("SyntaxError: ") and "plugin.py" not in line and "\n" not in line
