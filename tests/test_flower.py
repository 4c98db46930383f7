"""fedhet on Flower: lossless messages, the server app over an in-process grid, and (slow) a
real SuperLink with 3 SuperNodes on 127.0.0.1."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower])")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from registered import example  # noqa: E402
from same import assert_same  # noqa: E402

from fedhet.algorithms.base import ALGORITHMS, Algorithm, ClientState, Message, weighted_sum  # noqa: E402
from fedhet.algorithms.fedavg import local_sgd_update  # noqa: E402
from fedhet.deploy import client_app  # noqa: E402
from fedhet.deploy.project import app_pyproject  # noqa: E402
from fedhet.deploy.records import from_record, pack_state, to_record, unpack_state  # noqa: E402
from fedhet.deploy.server_app import server_run  # noqa: E402
from fedhet.engine.assembly import assemble  # noqa: E402
from fedhet.engine.config import config_of  # noqa: E402
from fedhet.engine.executors import StackedExecutor  # noqa: E402
from fedhet.engine.rounds import ROUND_RUNNERS  # noqa: E402
from fedhet.errors import FedhetError  # noqa: E402
from fedhet.registry import NoParams  # noqa: E402
from fedhet.rundir.store import read_checkpoint  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")
BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 3, "rounds": 2, "lr": 0.1,
        "seed": 3, "local_steps": 4}


# -- messages ---------------------------------------------------------------------------
def test_message_round_trip_is_lossless():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(7, generator=g), "d": torch.randn(2, 3, dtype=torch.float64, generator=g),
        "i": torch.arange(5), "flag": torch.tensor(True), "scalar0d": torch.tensor(1.5),
    }
    scalars = {"num_samples": 17, "tau": 3, "loss": 0.1 + 1e-17, "tiny": 5e-324, "ok": True}
    back, meta = from_record(to_record(Message(tensors, scalars), client_id=2, round=9))
    assert meta == {"client_id": 2, "round": 9}
    assert back.scalars == scalars and all(type(back.scalars[k]) is type(v) for k, v in scalars.items())
    for name, t in tensors.items():
        assert back.tensors[name].dtype == t.dtype and back.tensors[name].shape == t.shape
        assert torch.equal(back.tensors[name], t)


def test_unsupported_scalar_is_a_clear_error():
    with pytest.raises(FedhetError, match="send it as a tensor"):
        to_record(Message(scalars={"v": [1.0, 2.0]}))


@dataclass(kw_only=True, eq=False)
class Count(ClientState):
    """A test client state: how many updates the client made, and nested plain values."""

    n: int = 0
    nested: list | None = None


def test_client_state_survives_packing():
    algo = CountingAvg(NoParams(), None)
    state = Count(n=3, nested=[torch.ones(2), {"c_i": torch.randn(4)}])
    back = unpack_state(pack_state(state), algo, 0)
    assert type(back) is Count and back.n == 3
    assert torch.equal(back.nested[0], torch.ones(2))
    assert torch.equal(back.nested[1]["c_i"], state.nested[1]["c_i"])
    fresh = unpack_state(pack_state(None), algo, 5)  # no state yet: the client's initial one
    assert type(fresh) is Count and fresh.n == 0


def test_every_algorithms_client_state_survives_packing():
    """Each registered algorithm's client state after a real round comes back from the node's
    `Context.state` record as the same typed state with equal fields."""
    for name in ALGORITHMS.names():
        settings = {**BASE, "algorithm": name, "clients": 4, "rounds": 1, **example(name)}
        sim = assemble(config_of(settings), store=None, log=lambda _: None)
        sim.run()
        for client_id, state in sim.side.clients.states.items():
            back = unpack_state(pack_state(state), sim.side.algorithm, client_id)
            assert type(back) is type(state), name
            if state is not None:
                assert_same(back, state, name)



def test_a_client_state_packed_before_states_were_typed_still_unpacks():
    """A node's `Context.state` packed by an older fedhet held the raw value (SCAFFOLD's `c_i`
    tensor); it unpacks as the typed state."""
    sim = assemble(config_of({**BASE, "algorithm": "scaffold"}), store=None, log=lambda _: None)
    c_i = torch.randn(sim.side.model.dim)
    buf = io.BytesIO()
    torch.save(c_i, buf)
    back = unpack_state(ConfigRecord({"state": buf.getvalue()}), sim.side.algorithm, 0)
    assert torch.equal(back.c_i, c_i)


def test_generated_app_is_a_valid_flower_app(tmp_path, monkeypatch):
    """The app's settings are the run's (no plugin loaded in this process: an earlier test's
    plugin would be recorded too, for the SuperNodes to import)."""
    import tomllib

    from flwr.common.config import validate_config

    from fedhet import plugins

    monkeypatch.setattr(plugins, "loaded", lambda: [])
    settings = {"algorithm": "fedavgm", "algorithm.gamma": 0.5, "clients": 4, "note": 'a "q"'}
    text = app_pyproject(settings, tmp_path / "out", round_timeout=30)
    config = tomllib.loads(text)
    valid, errors, _ = validate_config(config, check_module=True, project_dir=tmp_path)
    assert valid, errors
    run_config = config["tool"]["flwr"]["app"]["config"]
    assert json.loads(run_config["fedhet-settings"]) == settings
    assert run_config["round-timeout"] == 30.0 and run_config["out"] == str((tmp_path / "out").resolve())


def test_core_does_not_import_flower():
    code = (
        "import sys, fedhet, fedhet.cli, fedhet.engine.simulation, fedhet.runs.single\n"
        "fedhet.cli.build_parser()\n"
        "assert 'flwr' not in sys.modules, 'flwr imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": SRC})


# -- the server app over an in-process grid ---------------------------------------------
class InProcessGrid(Grid):
    """A Flower `Grid` whose nodes are `Context`s in this process: every message goes through
    the real ClientApp (serialization, `Context.state`, handlers) without a network."""

    def __init__(self, settings: dict[str, Any], num_nodes: int, silent: Sequence[int] = ()) -> None:
        run_config = {"fedhet-settings": json.dumps(settings)}
        self.contexts = {
            100 + i: Context(1, 100 + i, {"partition-id": i}, RecordDict(), run_config)
            for i in range(num_nodes)
        }
        self.silent = {100 + i for i in silent}
        self.replies: dict[str, Any] = {}
        self.pushed: list[tuple[int, str]] = []

    def set_run(self, run):  # pragma: no cover - not used
        pass

    @property
    def run(self):  # pragma: no cover - not used
        return None

    def create_message(self, *args, **kwargs):  # pragma: no cover - deprecated in Flower
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            ids.append(mid)
            node = msg.metadata.dst_node_id
            self.pushed.append((node, msg.metadata.message_type))
            if node not in self.silent:
                self.replies[mid] = client_app.app(msg, self.contexts[node])
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(m) for m in list(message_ids) if m in self.replies]

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - not used
        raise NotImplementedError


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    client_app._worlds.clear()
    yield
    client_app._worlds.clear()


def run_both(settings: dict[str, Any], timeout: float = 0.5):
    cfg = config_of(settings)
    local = assemble(cfg, store=None, log=lambda _: None)
    local.run()
    grid = InProcessGrid(settings, cfg.clients)
    cfg = config_of(settings)
    remote = server_run(cfg, None, grid, round_timeout=timeout, log=lambda _: None)
    remote.side.executor.roster.wait_for_all(1.0)
    summary = remote.run()
    return local, remote, grid, summary


@pytest.mark.parametrize("algorithm", ["fedavg", "fedavgm"])
def test_server_app_matches_in_process_engine(algorithm):
    local, remote, grid, _ = run_both({**BASE, "algorithm": algorithm})
    assert torch.allclose(remote.final_state.w, local.final_state.w, atol=1e-6, rtol=0)
    assert remote.parts.comm.state() == local.parts.comm.state()
    assert [t for _, t in grid.pushed].count("train") == BASE["clients"] * BASE["rounds"]


@pytest.mark.parametrize(
    "algorithm", [n for n in ALGORITHMS.names() if not ALGORITHMS.get(n).factory.centralized]
)
def test_every_registered_algorithm_runs_through_flower_messages(algorithm):
    """Each algorithm (star, ring and hierarchical topologies alike): the same model and the
    same communication count as the in-process engine, bit for bit."""
    settings = {**BASE, "algorithm": algorithm, "clients": 4, **example(algorithm)}
    local, remote, _, _ = run_both(settings)
    assert torch.equal(remote.final_state.w, local.final_state.w)
    assert remote.parts.comm.state() == local.parts.comm.state()


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adam_clients_under_fedadam_run_through_flower_messages(optimizer):
    """The SuperNodes read `client_optimizer` and Adam's settings from the run config: the same
    model as in process, bit for bit."""
    settings = {**BASE, "algorithm": "fedadam", "algorithm.server_lr": 0.01, "lr": 0.01,
                "client_optimizer": optimizer, "weight_decay": 0.01, "adam_beta1": 0.8}
    local, remote, _, _ = run_both(settings)
    assert torch.equal(remote.final_state.w, local.final_state.w)
    sgd, _, _, _ = run_both({**settings, "client_optimizer": "sgd"})
    assert not torch.equal(sgd.final_state.w, local.final_state.w)


# A client-stateful algorithm and a chain topology (each client trains on its predecessor's
# model, the hop relayed through the server) exercise `Context.state` and the generic path.
class CountingAvg(Algorithm):
    """FedAvg whose clients scale their update by 1/(number of updates they made before)."""

    name = "flower-test-counting"
    client_state_class = Count

    def client_init(self, client_id: int) -> Count:
        return Count()

    def client_update(self, message: Message, ctx, state: Count):
        _, _, reply = local_sgd_update(message, ctx)
        state = Count(n=state.n + 1)
        reply.tensors["delta"] = reply.tensors["delta"] / state.n
        return reply, state

    def aggregate(self, state, round, replies):
        replies = list(replies)  # the runners pass a one-pass stream; this rule needs len()
        p = torch.full((len(replies),), 1.0 / len(replies), dtype=torch.float64)
        return replace(state, w=state.w + weighted_sum(p, [r.message.tensors["delta"] for r in replies])), {}


class ChainAvg(CountingAvg):
    name = "flower-test-chain"
    topology = "flower-test-chain"


def chain_round(rc, state, round, clients):
    message = rc.configure(state, clients[0], round)
    rc.comm.send("device-cloud", "down", message)
    w = state.w
    for i, client_id in enumerate(clients):
        if i:
            rc.comm.send("device-device", "peer", message)
        reply = rc.client_update(client_id, message, round)
        w = w + reply.tensors["delta"]
        message = Message({**message.tensors, "w": w})
    rc.comm.send("device-cloud", "up", Message({"w": w}))
    return replace(state, w=w), {}


@pytest.fixture
def test_algorithms():
    ROUND_RUNNERS[ChainAvg.topology] = chain_round
    try:
        with ALGORITHMS.added(CountingAvg.name, CountingAvg), ALGORITHMS.added(ChainAvg.name, ChainAvg):
            yield
    finally:
        ROUND_RUNNERS.pop(ChainAvg.topology, None)



def test_client_state_lives_in_the_node_context(test_algorithms):
    settings = {**BASE, "algorithm": CountingAvg.name, "rounds": 3}
    local, remote, grid, _ = run_both(settings)
    assert torch.allclose(remote.final_state.w, local.final_state.w, atol=1e-6, rtol=0)
    assert remote.side.clients.states == {}  # the server holds no client state ...
    for ctx in grid.contexts.values():  # ... each node holds its own
        record = ctx.state.config_records["fedhet.client-state"]
        assert unpack_state(record, remote.side.algorithm, 0).n == 3


def test_nodes_train_through_the_runs_executor(monkeypatch):
    """A SuperNode runs its client update through the run's executor (here `stacked`, as the
    settings ask), one request per message, and ends where the in-process stacked run ends."""
    settings = {**BASE, "algorithm": "scaffold", "executor": "stacked"}
    requests: list[list[int]] = []
    original = StackedExecutor.run

    def spy(self, round, reqs):
        requests.append([c for c, _ in reqs])
        yield from original(self, round, reqs)

    monkeypatch.setattr(StackedExecutor, "run", spy)
    local, remote, _, _ = run_both(settings)
    assert torch.equal(remote.final_state.w, local.final_state.w)
    in_process = [r for r in requests if len(r) == BASE["clients"]]
    on_nodes = sorted(r[0] for r in requests if len(r) == 1)
    assert len(in_process) == BASE["rounds"]
    assert on_nodes == sorted(list(range(BASE["clients"])) * BASE["rounds"])


def test_a_failing_client_fails_its_node_clearly(monkeypatch):
    """A client half that raises on a node is a node failure naming the client and round."""
    def broken(self, message, ctx, state):
        raise ValueError("bad local data")

    monkeypatch.setattr(ALGORITHMS.get("fedavg").factory, "client_update", broken)
    settings = {**BASE, "algorithm": "fedavg"}
    remote = server_run(
        config_of(settings), None, InProcessGrid(settings, BASE["clients"]), round_timeout=0.5,
        log=lambda _: None,
    )
    remote.side.executor.roster.wait_for_all(1.0)
    with pytest.raises(FedhetError, match=r"client 0 failed in round 1 \(ctx\.round=0 in "
                       r"client_update's arguments\): ValueError: bad local data"):
        remote.run()


def test_relayed_topology_runs_unchanged_and_counts_peer_hops(test_algorithms):
    settings = {**BASE, "algorithm": ChainAvg.name}
    local, remote, grid, _ = run_both(settings)
    assert torch.allclose(remote.final_state.w, local.final_state.w, atol=1e-6, rtol=0)
    assert remote.parts.comm.state() == local.parts.comm.state()
    peer = remote.parts.comm.state()["bytes"][("device-device", "peer")]
    assert peer == BASE["rounds"] * (BASE["clients"] - 1) * local.side.model.dim * 4


def test_silent_node_is_dropped_and_the_run_goes_on():
    settings = {**BASE, "algorithm": "fedavg", "rounds": 3}
    grid_probe = InProcessGrid(settings, 3)
    cfg = config_of(settings)
    remote = server_run(cfg, None, grid_probe, round_timeout=0.3, log=lambda _: None)
    remote.side.executor.roster.wait_for_all(1.0)
    grid_probe.silent = {102}  # node of client 2 goes quiet after joining
    summary = remote.run()
    assert summary["finished"] and summary["rounds_done"] == 3
    assert 2 not in remote.side.executor.roster.node_of and 102 in remote.side.executor.roster.ignored
    trains = [n for n, t in grid_probe.pushed if t == "train"]
    assert trains.count(102) == 1  # tried once, then left out
    assert trains.count(100) == trains.count(101) == 3


def test_each_dropped_client_is_reported_in_each_round():
    """A line per dropped client per round (the deploy console echoes `fedhet:` lines)."""
    settings = {**BASE, "algorithm": "fedavg", "rounds": 3}
    grid = InProcessGrid(settings, 3)
    cfg = config_of(settings)
    lines: list[str] = []
    remote = server_run(cfg, None, grid, round_timeout=0.3, log=lines.append)
    remote.side.executor.roster.wait_for_all(1.0)
    grid.silent = {102}
    remote.run()
    assert lines == [
        "fedhet: round 1: dropped client 2 (SuperNode 102): no reply within 0.3 s; left out "
        "until a SuperNode for partition-id 2 joins again",
        "fedhet: round 2: dropped client 2: its SuperNode left the run in round 1",
        "fedhet: round 3: dropped client 2: its SuperNode left the run in round 1",
    ]


def test_a_node_that_left_is_dropped_until_its_partition_rejoins():
    """The node of client 2 goes offline in round 2 (the SuperLink answers NODE_UNAVAILABLE);
    a new node for partition 2 joins before round 4. Client 2 is dropped in rounds 2 and 3
    only, and the model equals the in-process engine's with client 2 offline in exactly those
    rounds (`client_dropout`'s partial participation)."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    from fedhet.engine.faults import DROPPED, OK, FaultModel

    settings = {**BASE, "algorithm": "fedavg", "rounds": 4}
    cfg = config_of(settings)
    grid = InProcessGrid(settings, 3)
    lines: list[str] = []
    remote = server_run(cfg, None, grid, round_timeout=5.0, log=lines.append)
    remote.side.executor.roster.wait_for_all(1.0)
    push = grid.push_messages

    def offline_node_102(messages):
        ids = push(messages)
        for mid, msg in zip(ids, messages, strict=True):
            if msg.metadata.dst_node_id == 102 and msg.metadata.message_type == "train" \
                    and msg.metadata.group_id == "2":
                grid.replies[mid] = flwr.app.Message(
                    Error(ErrorCode.NODE_UNAVAILABLE, "offline"), reply_to=msg)
        return ids

    grid.push_messages = offline_node_102
    rows: list[dict[str, Any]] = []

    def on_round(row):
        rows.append(row)
        if row["round"] == 3:  # the restarted node registers before round 4
            run_config = {"fedhet-settings": json.dumps(settings)}
            grid.contexts[103] = Context(1, 103, {"partition-id": 2}, RecordDict(), run_config)

    remote.callbacks.append(on_round)
    remote.run()
    assert [r["clients_dropped"] for r in rows] == [0, 1, 1, 0]
    assert lines == [
        "fedhet: round 2: dropped client 2 (SuperNode 102): the SuperLink reports its SuperNode "
        "offline; left out until a SuperNode for partition-id 2 joins again",
        "fedhet: round 3: dropped client 2: its SuperNode left the run in round 2",
        "fedhet: round 4: client 2 rejoined on SuperNode 103 (dropped since round 2)",
    ]
    assert remote.side.executor.roster.node_of == {0: 100, 1: 101, 2: 103}

    class Offline(FaultModel):
        def outcome(self, client_id: int, round: int) -> str:
            return DROPPED if (client_id, round) in {(2, 1), (2, 2)} else OK

    local = assemble(cfg, store=None, log=lambda _: None)
    local.parts.faults = Offline.from_config(cfg)
    assert isinstance(local.parts.faults, Offline)
    local.run()
    assert torch.allclose(remote.final_state.w, local.final_state.w, atol=1e-6, rtol=0)


def test_a_round_where_no_node_answers_keeps_the_server_state():
    """As in process (docs/faults.md): nobody returned, the model stays, the run goes on."""
    settings = {**BASE, "algorithm": "fedavg", "rounds": 2}
    grid = InProcessGrid(settings, 3)
    lines: list[str] = []
    remote = server_run(config_of(settings), None, grid, round_timeout=0.2,
                                log=lines.append)
    remote.side.executor.roster.wait_for_all(1.0)
    grid.silent = {100, 101, 102}
    rows: list[dict[str, Any]] = []
    remote.callbacks.append(rows.append)
    summary = remote.run()
    assert summary["finished"] and [r["clients_dropped"] for r in rows] == [3, 3]
    assert torch.equal(remote.final_state.w, remote.w0)
    assert "fedhet: round 1: no client returned; server state kept" in lines
    assert "fedhet: round 2: no client returned; server state kept" in lines


def test_silent_node_on_a_relayed_topology_fails_clearly(test_algorithms):
    settings = {**BASE, "algorithm": ChainAvg.name}
    grid = InProcessGrid(settings, 3)
    cfg = config_of(settings)
    remote = server_run(cfg, None, grid, round_timeout=0.3, log=lambda _: None)
    remote.side.executor.roster.wait_for_all(1.0)
    grid.silent = {101}
    with pytest.raises(FedhetError, match="cannot skip a client"):
        remote.run()


def test_node_with_a_different_partition_is_refused():
    settings = {**BASE, "algorithm": "fedavg"}
    grid = InProcessGrid({**settings, "seed": 4}, 3)  # nodes partition with another seed
    cfg = config_of(settings)
    remote = server_run(cfg, None, grid, round_timeout=0.3, log=lambda _: None)
    with pytest.raises(FedhetError, match="different partition"):
        remote.side.executor.roster.wait_for_all(1.0)


def test_missing_nodes_are_reported_by_partition_id():
    settings = {**BASE, "algorithm": "fedavg"}
    grid = InProcessGrid(settings, 2)
    cfg = config_of(settings)
    remote = server_run(cfg, None, grid, round_timeout=0.3, log=lambda _: None)
    with pytest.raises(FedhetError, match="missing partition-id 2"):
        remote.side.executor.roster.wait_for_all(0.2)


# -- real processes on 127.0.0.1 ----------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_superlink_and_three_supernodes_match_the_engine(tmp_path):
    """FedAvg and FedVeca (its extra gradient and estimate exchanges) for 2 rounds on digits over
    a real SuperLink and 3 SuperNodes; then a SuperNode killed mid-run."""
    from fedhet.deploy.launch import LocalFederation
    from fedhet.deploy.project import write_app

    pids: list[int] = []
    with LocalFederation(3, workdir=tmp_path / "fed") as fed:
        for algorithm in ("fedavg", "fedveca"):
            settings = {**BASE, "algorithm": algorithm}
            out = tmp_path / algorithm
            write_app(tmp_path / f"app-{algorithm}", settings, out, round_timeout=120)
            summary = fed.run(tmp_path / f"app-{algorithm}", out, timeout=400)
            assert summary["finished"] and summary["rounds_done"] == 2
            cfg = config_of(settings)
            local = assemble(cfg, store=None, log=lambda _: None)
            local.run()
            remote = read_checkpoint(out / "checkpoint.pt")["server"]["w"]
            assert torch.allclose(remote, local.final_state.w, atol=1e-6, rtol=0)

        # kill the node of client 2 as round 2 starts: rounds 2 and 3 finish without it
        settings = {**BASE, "algorithm": "fedavg", "rounds": 3}
        out = tmp_path / "killed"
        write_app(tmp_path / "app-killed", settings, out, round_timeout=60)
        client = fed.submit(tmp_path / "app-killed")
        deadline = time.monotonic() + 300
        while not _metrics_rows(out) >= 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        fed.kill_node(2)
        from fedhet.deploy.process_tree import stop_tree
        from fedhet.deploy.watchdog import wait_for_run

        try:
            summary = wait_for_run(out, 300, [client, fed.superlink], fed.logs)
        finally:
            stop_tree(client)
        assert summary["finished"] and summary["rounds_done"] == 3
        rows = (out / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        dropped = [int(r.split(",")[header.index("clients_dropped")]) for r in rows[1:]]
        assert dropped == [0, 0, 1, 1]
        pids = fed.all_pids()
    time.sleep(0.5)
    assert pids and not any(_alive(p) for p in pids), "Flower processes left running"


def _metrics_rows(out: Path) -> int:
    path = out / "metrics.csv"
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def test_deploy_app_command_writes_the_app_and_refuses_bad_settings(tmp_path, capsys):
    from fedhet.cli import main

    app = tmp_path / "app"
    rc = main(["deploy", "app", "-a", "fedavgm", "-n", "3", "-r", "2", "--set", "algorithm.gamma=0.5",
               "--out", str(tmp_path / "out"), "--app-dir", str(app), "--round-timeout", "30"])
    assert rc == 0 and "partition-id=2 num-partitions=3" in capsys.readouterr().out
    import tomllib

    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    cfg = config_of(json.loads(config["fedhet-settings"]))
    assert (cfg.algorithm, cfg.clients, cfg.algorithm_params.server_momentum) == ("fedavgm", 3, 0.5)
    bad = tmp_path / "bad"
    assert main(["deploy", "app", "--set", "lr=-1", "--out", "x", "--app-dir", str(bad)]) == 2
    assert "lr must be a positive number" in capsys.readouterr().err and not bad.exists()


def test_deploy_auth_commands_and_refusals(tmp_path, capsys):
    """`deploy app --auth` writes an app that records authentication and prints the key,
    register and SuperNode commands; `--auth` with `--simulation` is one line, nothing written."""
    from fedhet.cli import main

    app = tmp_path / "app"
    assert main(["deploy", "app", "--auth", "-n", "2", "-r", "1", "--out", str(tmp_path / "out"),
                 "--app-dir", str(app)]) == 0
    printed = capsys.readouterr().out
    assert "--enable-supernode-auth" in printed and "ssh-keygen -t ecdsa -b 384" in printed
    for i in (0, 1):
        assert f"flwr supernode register keys/supernode-{i}.pub" in printed
        assert f"--auth-supernode-private-key keys/supernode-{i} " in printed
    assert '"supernode-auth" = true' in (app / "pyproject.toml").read_text()
    out = tmp_path / "sim"
    assert main(["deploy", "local", "--auth", "--simulation", "-n", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--auth" in err[0] and "--simulation" in err[0] and not out.exists()


def test_supernode_keys_and_certificates_are_what_flower_reads(tmp_path):
    """The key pair loads as Flower loads it (OpenSSH, NIST curve) and the certificate names
    127.0.0.1 and is signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    from fedhet.deploy.auth import make_loopback_certificates, make_node_keys

    private, public = make_node_keys(tmp_path / "keys", "n0")
    key = load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert try_load_public_key(public) == public_key_to_bytes(key.public_key())
    assert private.stat().st_mode & 0o077 == 0  # private: owner only
    ca_path, cert_path, _ = make_loopback_certificates(tmp_path / "tls")
    ca, cert = (x509.load_pem_x509_certificate(p.read_bytes()) for p in (ca_path, cert_path))
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def _make_certificates(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a SuperLink certificate for 127.0.0.1, as docs/deploy.md generates them."""
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", "ca.key",
        "-out", "ca.crt", "-subj", "/CN=fedhet-test-ca")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=superlink")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-out", "server.pem", "-extfile", "san.ext")
    return d / "ca.crt", d / "server.pem", d / "server.key"


@pytest.mark.slow
def test_tls_federation_on_loopback(tmp_path):
    """SuperLink with a CA-signed certificate, SuperNodes and `flwr run` verifying it."""
    import shutil

    from fedhet.deploy.launch import LocalFederation
    from fedhet.deploy.project import write_app

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    tls = _make_certificates(tmp_path)
    settings = {**BASE, "algorithm": "fedavg", "clients": 2, "rounds": 1}
    write_app(tmp_path / "app", settings, tmp_path / "out", round_timeout=300)
    with LocalFederation(2, workdir=tmp_path / "fed", tls=tls) as fed:
        summary = fed.run(tmp_path / "app", tmp_path / "out", timeout=400)
        assert summary["finished"]
        assert f"https://127.0.0.1:{fed.port}" in (fed.logs / "superlink.log").read_text()


def test_batchnorm_statistics_travel_with_the_messages():
    """A model with BatchNorm buffers: they go down with `_buffers`, come back in the replies
    and are averaged by the server exactly as in-process."""
    import math

    from torch import nn

    from fedhet.models.registry import MODELS

    def bn_mlp(input_shape, num_classes, params):
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.BatchNorm1d(16),
                             nn.ReLU(), nn.Linear(16, num_classes))

    settings = {**BASE, "algorithm": "fedavg", "model": "flower-test-bn"}
    with MODELS.added("flower-test-bn", bn_mlp, NoParams, "MLP with BatchNorm (test only)"):
        initial = assemble(config_of(settings), store=None, log=lambda _: None).buffers
        local, remote, _, _ = run_both(settings)
    assert initial.numel() > 0 and not torch.equal(remote.buffers, initial)
    assert torch.equal(remote.buffers, local.buffers)
    assert torch.equal(remote.final_state.w, local.final_state.w)


@pytest.mark.slow
def test_only_registered_supernodes_join(tmp_path):
    """`--auth`: the SuperLink (TLS, `--enable-supernode-auth`) refuses a SuperNode whose key
    was never registered; the two registered ones train, and deploy.json says auth was on."""
    from fedhet.deploy.launch import LocalFederation
    from fedhet.deploy.project import write_app
    from fedhet.deploy.watchdog import REFUSED

    settings = {**BASE, "algorithm": "fedavg", "clients": 2, "rounds": 1}
    write_app(tmp_path / "app", settings, tmp_path / "out", round_timeout=300, supernode_auth=True)
    with LocalFederation(2, workdir=tmp_path / "fed", auth=True, node_max_wait=60) as fed:
        assert set(fed.registered) == {0, 1}
        intruder = fed.start_node(2, register=False)
        deadline = time.monotonic() + 90
        while intruder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert intruder.poll() is not None, "the unregistered SuperNode was not refused"
        assert REFUSED in (fed.logs / "supernode-2.log").read_text()
        assert "No SuperNode found with the given public key" in (fed.logs / "superlink.log").read_text()
        fed.kill_node(2)  # gone: the run goes on without it
        summary = fed.run(tmp_path / "app", tmp_path / "out", timeout=400)
        assert summary["finished"] and summary["rounds_done"] == 1
        deploy = json.loads((tmp_path / "out" / "deploy.json").read_text())
        assert deploy["supernode_auth"] is True
        assert sorted(map(str, deploy["nodes"].values())) == sorted(fed.registered.values())
        pids = fed.all_pids()
    time.sleep(0.5)
    assert pids and not any(_alive(p) for p in pids), "Flower processes left running"
