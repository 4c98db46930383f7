"""Edges in lockstep (engine/rounds.py): FedSR's rings and HierFAVG's edges share executor calls.

At each ring hop (FedSR) or edge iteration (HierFAVG) every edge's request goes into one
`client_updates` call, so the stacked executor stacks devices of several edges. The round must
equal running the edges one after another, bill the same messages, and handle a device that
fails in the middle of a ring the same way under both executors.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from faulty import make_client_fail
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, Message, Reply, RunInfo, ServerState
from fedhet.engine.assembly import assemble
from fedhet.engine.comm import CommLedger
from fedhet.engine.config import config_of
from fedhet.engine.failures import ClientFailure, UserCodeFailed
from fedhet.engine.rounds import edge_ring_round, edge_star_round
from fedhet.engine.simulation import Simulation
from fedhet.models.registry import MODELS
from fedhet.registry import NoParams

BASE = {"dataset": "digits", "partition": "dirichlet", "partition.alpha": 0.5, "lr": 0.05,
        "batch_size": 16, "local_steps": 3, "momentum": 0.5, "seed": 3, "executor": "sequential"}
MLP = {"model": "mlp", "model.hidden": 16}
FEDSR = {"algorithm": "fedsr", "algorithm.clusters": 3, "algorithm.ring_passes": 2}
HIERFAVG = {"algorithm": "hierfavg", "algorithm.clusters": 3, "algorithm.kappa1": 2,
            "algorithm.kappa2": 2}
BN_MODEL = "bn-mlp-lockstep-test"


@pytest.fixture
def bn_model():
    """A 64 → 16 → BatchNorm → 10 MLP, registered for one test only."""
    def build(input_shape, num_classes, params):
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], 16), nn.BatchNorm1d(16),
                             nn.ReLU(), nn.Linear(16, num_classes))

    with MODELS.added(BN_MODEL, build, NoParams, "test only: MLP with BatchNorm"):
        yield BN_MODEL


def simulation(**settings) -> Simulation:
    """A run of BASE with `settings` (the small MLP unless `settings` names a model)."""
    model = {} if "model" in settings else MLP
    return assemble(config_of({**BASE, **model, **settings}, "test"), store=None, log=lambda _: None)


# -- the round equals the edges one after another -------------------------------------------
def fedsr_edges_one_by_one(sim: Simulation, order: list[int]) -> ServerState:
    """Round 0 of FedSR by hand: each edge's ring alone, in `order`, every hop a sequential
    client update (Algorithm 1 through the public roles); the cloud aggregates in edge order."""
    algo, state = sim.side.algorithm, sim.side.algorithm.init(sim.w0)
    groups = dict(algo.edge_groups(range(sim.side.run_info.num_clients), 0))
    reports = {}
    for edge_id in order:
        ring = groups[edge_id]
        down = sim.configure(state, edge_id, 0)
        edge = algo.edge_init(down, edge_id, ring, 0)
        message = algo.edge_configure(edge, ring[0], 0, 0)
        for hop in range(algo.ring_passes() * len(ring)):
            device = ring[hop % len(ring)]
            message = sim.client_update(device, message, 0)
        edge = algo.edge_aggregate(edge, 0, [Reply(device, message)])
        reports[edge_id] = Reply(edge_id, algo.edge_report(edge))
    return algo.aggregate(state, 0, iter([reports[m] for m in sorted(reports)]))[0]


def hierfavg_edges_one_by_one(sim: Simulation, order: list[int]) -> ServerState:
    """Round 0 of HierFAVG by hand: each edge's `κ2` iterations alone, in `order`."""
    algo, state = sim.side.algorithm, sim.side.algorithm.init(sim.w0)
    groups = dict(algo.edge_groups(range(sim.side.run_info.num_clients), 0))
    reports = {}
    for edge_id in order:
        members = groups[edge_id]
        down = sim.configure(state, edge_id, 0)
        edge = algo.edge_init(down, edge_id, members, 0)
        for t in range(algo.edge_iterations()):
            replies = [Reply(c, sim.client_update(c, algo.edge_configure(edge, c, 0, t), 0))
                       for c in members]
            edge = algo.edge_aggregate(edge, 0, iter(replies))
        reports[edge_id] = Reply(edge_id, algo.edge_report(edge))
    return algo.aggregate(state, 0, iter([reports[m] for m in sorted(reports)]))[0]


@pytest.mark.parametrize("batchnorm", [False, True])
@pytest.mark.parametrize(("settings", "by_hand"), [(FEDSR, fedsr_edges_one_by_one),
                                                   (HIERFAVG, hierfavg_edges_one_by_one)])
def test_lockstep_round_equals_edges_one_after_another(request, settings, by_hand, batchnorm):
    """Bit for bit, whichever order the edges run in by hand: every client's randomness is
    keyed by (seed, round, client, purpose), and the edges share no device."""
    model = {"model": request.getfixturevalue("bn_model")} if batchnorm else {}
    common = {**settings, **model, "clients": 9, "rounds": 1}
    engine = simulation(**common)
    engine.run()
    edges = [m for m, _ in engine.side.algorithm.edge_groups(range(9), 0)]
    assert len(edges) == 3
    for order in (edges, edges[::-1]):
        expected = by_hand(simulation(**common), order)
        assert torch.equal(engine.final_state.w, expected.w)
        if batchnorm:
            assert torch.equal(engine.buffers, expected.buffers)
    assert not torch.equal(engine.final_state.w, engine.w0)


# -- the stacked executor stacks devices of several edges -----------------------------------
class StackSpy:
    """Which clients each stacked `sgd_many` call of a stacked run holds: a client's id is
    recorded while its `ctx.trainer.sgd` is parked (one client thread runs at a time)."""

    def __init__(self, sim: Simulation) -> None:
        self.parked: set[int] = set()
        self.stacks: list[set[int]] = []
        self.sizes: list[int] = []
        """`len(jobs)` of each call, to check that the parked clients are exactly the stack."""
        self.joined: list[list[int]] = []
        """Per call, the number of jobs handed in each time jobs left the stack."""
        run_client, sgd_many = sim.side.clients.run_client, sim.side.executor.cohort.sgd_many
        spy = self

        class Trainer:
            def __init__(self, inner, client_id):
                self.inner, self.client_id = inner, client_id

            def __getattr__(self, name):
                return getattr(self.inner, name)

            def sgd(self, *args, **kwargs):
                spy.parked.add(self.client_id)
                try:
                    return self.inner.sgd(*args, **kwargs)
                finally:
                    spy.parked.discard(self.client_id)

        def spied_run_client(client_id, message, round, trainer):
            return run_client(client_id, message, round, Trainer(trainer, client_id))

        def stacked(jobs, next_jobs=None):
            self.sizes.append(len(jobs))
            self.stacks.append(set(self.parked))
            self.joined.append([])
            if next_jobs is None:
                return sgd_many(jobs)

            def spied_next(gone):
                made = next_jobs(gone)
                self.joined[-1].append(len(made))
                return made

            return sgd_many(jobs, spied_next)

        sim.side.clients.run_client = spied_run_client
        sim.side.executor.cohort.sgd_many = stacked

    def check(self) -> list[set[int]]:
        assert self.sizes == [len(s) for s in self.stacks]
        return self.stacks


def edge_of(sim: Simulation) -> dict[int, int]:
    return {d: m for m, devices in enumerate(sim.side.algorithm.edges) for d in devices}


def test_fedsr_trains_every_hop_of_a_round_in_one_stacked_call():
    """The stacked executor walks each ring as one chain: a round is one stacked call that
    starts with one device per ring, and every later hop joins the stack as its predecessor
    leaves (R·Q − 1 hand-offs per ring), with no call in between."""
    sim = simulation(**FEDSR, clients=9, rounds=2, executor="stacked")
    spy = StackSpy(sim)
    sim.run()
    edge = edge_of(sim)
    stacks = spy.check()
    assert len(stacks) == 2  # one call per round
    for stack, joined in zip(stacks, spy.joined, strict=True):
        assert sorted(edge[d] for d in stack) == [0, 1, 2]  # the first hop of each ring
        # local_steps = 3 on every device: the rings hand over together, each ring's next hop
        # joining as its last leaves; R·Q − 1 = 5 hand-offs, then the walks end
        assert joined == [3, 3, 3, 3, 3, 0]


def test_hierfavg_trains_every_edge_iteration_of_a_round_in_one_stacked_call():
    """Each edge is a chain: its devices side by side, its average once the last is back,
    then its next iteration joins the same stacked call (κ1 = 2 steps everywhere, so the
    three edges hand over together: 9 devices leave, the next iteration's 9 join)."""
    sim = simulation(**HIERFAVG, clients=9, rounds=2, executor="stacked")
    spy = StackSpy(sim)
    sim.run()
    assert spy.check() == [set(range(9))] * 2  # one call per round, all edges' devices
    assert spy.joined == [[9, 0]] * 2  # κ2 = 2 iterations
    assert len({edge_of(sim)[d] for d in spy.stacks[0]}) == 3


def test_one_ring_is_one_row_for_the_whole_round():
    """ring-optimization's single ring: one stacked call a round, one row in it, each of the
    4 hops taking the row its predecessor left."""
    sim = simulation(algorithm="ring", clients=4, rounds=2, executor="stacked")
    spy = StackSpy(sim)
    sim.run()
    assert [len(s) for s in spy.check()] == [1, 1]
    assert spy.joined == [[1, 1, 1, 0]] * 2


@pytest.mark.parametrize("batchnorm", [False, True])
@pytest.mark.parametrize("settings", [FEDSR, {"algorithm": "ring"}, HIERFAVG])
def test_stacked_chains_follow_the_sequential_rounds(request, settings, batchnorm):
    """Rings and HierFAVG edges as chains in one stacked call, clients of unequal τ_i (2 to 7
    steps, so hand-offs and edge averages fall at different steps in different chains) and
    momentum restarting at each hand-off: the sequential executor's model and BatchNorm
    statistics, to the executors' tolerance (float32 rounding of stacks of another
    composition)."""
    model = {"model": request.getfixturevalue("bn_model")} if batchnorm else {}
    common = {**settings, **model, "clients": 9, "rounds": 2,
              "client_steps": [2, 7, 3, 5, 4, 6, 2, 3, 7]}
    runs = {}
    for executor in ("sequential", "stacked"):
        sim = simulation(**common, executor=executor)
        sim.run()
        runs[executor] = sim
    seq, bat = runs["sequential"], runs["stacked"]
    assert float((bat.final_state.w - seq.final_state.w).norm() / seq.final_state.w.norm()) < 1e-5
    if batchnorm:
        assert torch.allclose(bat.buffers, seq.buffers, rtol=1e-5, atol=1e-6)
    assert not torch.equal(seq.final_state.w, seq.w0)


# -- a device failing in the middle of a ring -----------------------------------------------
def with_a_failing_client(settings: dict, culprit: int) -> list[tuple[Simulation, list[str], list[dict]]]:
    """The run of `settings` under the sequential and then the stacked executor, `culprit`
    raising whenever it runs: each run, its log lines and its metrics rows."""
    runs = []
    for executor in ("sequential", "stacked"):
        lines: list[str] = []
        rows: list[dict] = []
        sim = assemble(config_of({**BASE, **MLP, **settings, "executor": executor}, "test"),
                       store=None, log=lines.append, callbacks=[rows.append])
        make_client_fail(sim, culprit, "disk on fire")
        sim.run()
        runs.append((sim, lines, rows))
    return runs


def test_failure_mid_ring_same_under_both_executors():
    """Device at position 1 of edge 0's first-round ring raises: it is tried once, skipped on
    the second pass, and its ring goes on from the device before it."""
    settings = {**FEDSR, "algorithm.clusters": 2, "clients": 8, "rounds": 2}
    probe = simulation(**settings)
    (_, ring0), _ = probe.side.algorithm.edge_groups(range(8), 0)
    culprit = ring0[1]
    (seq, seq_lines, seq_rows), (bat, bat_lines, bat_rows) = with_a_failing_client(settings, culprit)
    assert seq_lines == bat_lines
    said, where = seq_lines[0].split(" (")  # the line names the code that raised
    assert said == f"round 1: client {culprit} failed and is dropped for the round: " \
        "RuntimeError: disk on fire"
    assert re.fullmatch(r"(tests/)?faulty\.py:\d+ in faulty\)", where)
    assert seq.parts.comm.state() == bat.parts.comm.state()
    first = seq_rows[0]
    assert first["clients_failed"] == 1 and first["clients_returned"] == 7
    # R·Q − 1 = 7 hops in the healthy ring; 7 − 1 in edge 0's (the culprit is skipped once)
    assert first["device_device_transfers"] == 7 + 6
    assert first["device_edge_transfers"] == 4 and first["edge_cloud_transfers"] == 4
    for key in ("clients_failed", "clients_returned", "device_device_transfers", "model_transfers"):
        assert [r[key] for r in seq_rows] == [r[key] for r in bat_rows]
    w_seq, w_bat = seq.final_state.w, bat.final_state.w
    assert float((w_bat - w_seq).norm() / w_seq.norm()) < 1e-5


def test_failure_in_a_hierfavg_edge_same_under_both_executors():
    """A device of edge 0 raises in its first iteration: dropped for the round (not asked in
    the second iteration), its edge averages the others; lockstep and chains agree."""
    settings = {**HIERFAVG, "clients": 9, "rounds": 2}
    culprit = 1
    (seq, seq_lines, seq_rows), (bat, bat_lines, bat_rows) = with_a_failing_client(settings, culprit)
    assert seq_lines == bat_lines and len(seq_lines) == 2  # once a round
    assert seq.parts.comm.state() == bat.parts.comm.state()
    # κ2 = 2 iterations: 9 devices down and 8 up, then 8 down and 8 up
    assert seq_rows[0]["clients_failed"] == 1 and seq_rows[0]["device_edge_transfers"] == 9 + 8 + 8 + 8
    for key in ("clients_failed", "clients_returned", "device_edge_transfers", "model_transfers"):
        assert [r[key] for r in seq_rows] == [r[key] for r in bat_rows]
    w_seq, w_bat = seq.final_state.w, bat.final_state.w
    assert float((w_bat - w_seq).norm() / w_seq.norm()) < 1e-5


@pytest.mark.parametrize("method", ["edge_init", "edge_configure", "edge_aggregate"])
@pytest.mark.parametrize("settings", [FEDSR, HIERFAVG], ids=["fedsr", "hierfavg"])
def test_an_edge_method_that_raises_names_the_round_and_the_index_it_got(
        monkeypatch, settings, method):
    """The second round calls the edge role with `round=1`: its error line says both."""
    sim = simulation(**settings, rounds=2)
    original = getattr(type(sim.side.algorithm), method)

    def broken(self, *args):
        index = inspect.signature(original).bind(self, *args).arguments["round"]
        if index >= 1:
            raise RuntimeError(f"edge down at index {index}")
        return original(self, *args)

    monkeypatch.setattr(type(sim.side.algorithm), method, broken)
    with pytest.raises(UserCodeFailed) as failed:
        sim.run()
    assert re.fullmatch(rf"round 2 \(round=1 in {method}'s arguments\): (tests/)?"
                        r"test_edge_lockstep\.py:\d+ in broken: RuntimeError: edge down at index 1",
                        str(failed.value)), str(failed.value)


# -- billing: a hand count ------------------------------------------------------------------
@pytest.mark.parametrize("executor", ["sequential", "stacked"])
def test_comm_hand_count_two_edges_of_three(executor):
    """2 edges × 3 devices. FedSR, R = 2, per round: 2 edge-cloud each way, 2 device-edge each
    way, R·Q − 1 = 5 ring hops per edge. HierFAVG, κ2 = 2: 2 edge-cloud each way and
    κ2 · 3 devices each way per edge."""
    sim = simulation(**{**FEDSR, "algorithm.clusters": 2}, clients=6, executor=executor, rounds=2)
    rows = []
    sim.callbacks.append(rows.append)
    sim.run()
    assert len(rows) == 2
    for row in rows:
        assert (row["edge_cloud_transfers"], row["device_edge_transfers"],
                row["device_device_transfers"]) == (4, 4, 10)
    assert rows[-1]["cum_model_transfers"] == 2 * 18
    sim = simulation(**{**HIERFAVG, "algorithm.clusters": 2}, clients=6, executor=executor, rounds=2)
    sim.run()
    assert dict(sim.parts.comm.total_transfers) == {"edge-cloud": 2 * 4, "device-edge": 2 * 2 * 2 * 2 * 3}


# -- runner level: hand-made replies --------------------------------------------------------
class Recorder:
    """A round context whose executor answers with hand-made replies and records its calls;
    clients in `raises` come back as `ClientFailure`, as the engine's executors report them."""

    def __init__(self, algorithm, reply, raises=()):
        self.algorithm, self.reply, self.raises = algorithm, reply, set(raises)
        self.comm = CommLedger(3)
        self.calls: list[list[int]] = []
        self.lines: list[str] = []
        self.log = self.lines.append

    def configure(self, state, client_id, round):
        return self.algorithm.configure(state, client_id, round)

    def client_updates(self, round, requests):
        self.calls.append([c for c, _ in requests])
        for c, message in requests:
            if c in self.raises:
                yield c, ClientFailure(c, round, "RuntimeError: down")
            else:
                yield c, self.reply(c, message)


def algorithm(name: str, clients: int = 5, **params):
    run = RunInfo(clients, 1, 0.1, 0.0, 0.0, 0, 3, ())
    return ALGORITHMS.get(name).factory(ALGORITHMS.params(name, {"shuffle": False, **params}), run)


def ring_reply(i: int, message: Message) -> Message:
    """Device i adds `1 + i` to the model and to the ring's sample count."""
    s = message.scalars
    return Message({"w": message.tensors["w"] + (1.0 + i)},
                   {"hop": s["hop"] + 1, "loss_sum": s["loss_sum"] + 0.5, "num_samples": 1.0,
                    "steps": 1.0, "ring_samples": s["ring_samples"] + 1.0 + i})


def test_rings_advance_one_hop_each_per_call():
    algo = algorithm("fedsr", edge_map="0,1,2;3,4", ring_passes=2)
    rc = Recorder(algo, ring_reply, raises={1})
    new, diag = edge_ring_round(rc, algo.init(torch.zeros(3)), 0, range(5))
    # ring 0 visits 0 1 2 0 1 2 (1 fails, then is skipped), ring 1 visits 3 4 3 4
    assert rc.calls == [[0, 3], [1, 4], [2, 3], [0, 4], [2]]
    # edge 0: 1 + 3 + 1 + 3 = 8 (weight 8); edge 1: 4 + 5 + 4 + 5 = 18 (weight 18); eq. 15
    assert torch.allclose(new.w, torch.full((3,), (8 * 8 + 18 * 18) / 26))
    assert diag["clients_failed"] == 1 and diag["clients_returned"] == 4 and diag["edges"] == 2
    assert rc.lines == ["round 1: client 1 failed and is dropped for the round: RuntimeError: down"]
    # hops: ring 0 bills 1 2 0 2 from their holders, ring 1 bills 4 3 4
    assert dict(rc.comm.round_transfers) == {"edge-cloud": 4, "device-edge": 4, "device-device": 7}


def star_reply(i: int, message: Message) -> Message:
    return Message({"delta": torch.full((3,), 1.0 + i)},
                   {"num_samples": 1.0 + i, "steps": 1.0, "train_loss": 0.1})


def test_each_edge_aggregates_only_its_own_replies_in_one_pass():
    algo = algorithm("hierfavg", edge_map="0;1,2,3;4", kappa2=2)
    seen = []
    aggregate = algo.edge_aggregate

    def spied(edge, round, replies):
        assert iter(replies) is replies  # a one-pass stream, not a list
        replies = list(replies)
        seen.append((edge["id"], [r.client_id for r in replies]))
        return aggregate(edge, round, iter(replies))

    algo.edge_aggregate = spied
    rc = Recorder(algo, star_reply, raises={0})
    new, diag = edge_star_round(rc, algo.init(torch.zeros(3)), 0, range(5))
    assert rc.calls == [[0, 1, 2, 3, 4], [1, 2, 3, 4]]
    assert seen == [(1, [1, 2, 3]), (2, [4]), (1, [1, 2, 3]), (2, [4])]
    # edge 0 never heard back: no report; edge 1 moves Σ(1+i)²/Σ(1+i) = 29/9 per iteration,
    # edge 2 moves 5; the cloud weights them by their samples, 9 and 5
    expected = (9 * 2 * 29 / 9 + 5 * 2 * 5) / 14
    assert torch.allclose(new.w, torch.full((3,), expected))
    assert diag["edges"] == 2 and diag["clients_failed"] == 1
    assert dict(rc.comm.round_transfers) == {"edge-cloud": 3 + 2, "device-edge": 5 + 4 + 4 + 4}


def test_replies_out_of_request_order_are_refused():
    algo = algorithm("hierfavg", 4, edge_map="0,1;2,3", kappa2=1)

    class Shuffled(Recorder):
        def client_updates(self, round, requests):
            order = [requests[i] for i in (0, 2, 1, 3)]
            yield from super().client_updates(round, order)

    rc = Shuffled(algo, star_reply)
    with pytest.raises(RuntimeError, match="out of request order"):
        edge_star_round(rc, algo.init(torch.zeros(3)), 0, range(4))
