"""The Flower `ServerApp`: fedhet's round loop with client updates sent to SuperNodes.

`server_run` assembles the engine's `Simulation` (sampling, round runners, evaluation on the
test set, metrics, checkpoints: the same code and the same run directory) with one more
executor, `FlowerExecutor`: it sends the round's downlink messages to the clients' SuperNodes
through the Flower `Grid` (all at once) and yields the replies instead of computing them
in-process. Every round runner in `ROUND_RUNNERS` therefore runs over Flower unchanged; for
hierarchical and ring topologies the edge role is played by this server app and a ring hop
`i → j` is relayed through it (node `i` replies, the server forwards to node `j`), while
`CommLedger` still counts it once as a device-to-device transfer. The star topology gets
`flower_star_round`, the same protocol as `engine.rounds.star_round` but with all downlinks
pushed at once so that nodes train in parallel. A client whose node does not answer within the
round timeout, or whose node the SuperLink reports offline (a SuperNode that died: no heartbeat
for two intervals), is dropped from the round and the round completes with the replies that
arrived, as a `client_dropout` client is in process (docs/faults.md); the client stays dropped
in the rounds that follow until a SuperNode for its partition joins again (a restarted node:
`Roster.refresh` at the start of each round), and then takes part again. `clients_dropped` in
each round's metrics row counts the clients that missed it. A round where no client replied
keeps the server state, as in process.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.app import Message as FlowerMessage
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from fedhet import plugins, provenance
from fedhet.algorithms import Message, Reply, ServerState
from fedhet.deploy.client_app import SETTINGS_KEY, fingerprint
from fedhet.deploy.node import shorten_pull_backoff
from fedhet.deploy.records import from_record, to_record, wire_bytes
from fedhet.engine import (
    CallbackLike,
    ClientHost,
    RunConfig,
    RunnerContext,
    Simulation,
    assemble,
    config_of,
)
from fedhet.errors import FedhetError
from fedhet.rundir import RunStore, atomic_write_text, prepare_out, to_json
from fedhet.rundir import ownership as rundir

OUT_KEY = "out"
ROUND_TIMEOUT_KEY = "round-timeout"
NODE_WAIT_KEY = "node-wait-timeout"
FORCE_KEY = "force"
FAST_PULLS_KEY = "fast-pulls"
NODE_EVENTS_KEY = "node-events"
SUPERNODE_AUTH_KEY = "supernode-auth"
"""True when the federation was started so that only registered SuperNodes join (recorded in
`deploy.json` as `supernode_auth`; the SuperLink, not the server app, enforces it)."""
POLL_S = 0.1
UNREACHABLE = "unreachable"
"""Error code reported for a node that did not reply in time (or that the SuperLink gave up on)."""

app = ServerApp()


def say(line: str) -> None:
    """Print a line of the server app's progress at once (`flwr run --stream` relays it and
    `fedhet deploy local` echoes lines starting with `fedhet:`)."""
    print(line, flush=True)


def exchange(
    grid: Grid, messages: dict[Any, FlowerMessage], timeout: float,
    gone: Callable[[], set[Any]] | None = None,
) -> tuple[dict[Any, FlowerMessage], list[Any]]:
    """Push all `messages`, pull replies until every one arrived or `timeout` s passed.

    Returns the replies by key and the keys that got none. Polls every `POLL_S` s (Flower's
    own `send_and_receive` polls every 3 s, which would dominate a round on localhost);
    `gone()`, asked at each poll, names keys whose node is known to be dead: they stop the
    wait for their reply at once.
    """
    if not messages:
        return {}, []
    keys = list(messages)
    ids = list(grid.push_messages([messages[k] for k in keys]))
    key_of = dict(zip(ids, keys, strict=True))
    pending = set(ids)
    replies: dict[Any, FlowerMessage] = {}
    deadline = time.monotonic() + timeout
    given_up: list[Any] = []
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid in pending:
                pending.discard(mid)
                replies[key_of[mid]] = reply
        if pending and gone is not None:
            dead = gone()
            for mid in [m for m in pending if key_of[m] in dead]:
                pending.discard(mid)
                given_up.append(key_of[mid])
        if pending:
            time.sleep(POLL_S)
    return replies, [*given_up, *(key_of[m] for m in pending)]


def node_failure(reply: FlowerMessage) -> str | None:
    """Why a reply carries no result: None (it does), UNREACHABLE, or the ClientApp's error."""
    if not reply.has_error():
        return None
    if reply.error.code in (ErrorCode.NODE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
                            ErrorCode.MESSAGE_UNAVAILABLE):
        return UNREACHABLE
    return reply.error.reason


class Roster:
    """Which SuperNode hosts which client id; nodes that failed are ignored for the run, and a
    new node for a dropped client's partition brings the client back (`left`)."""

    def __init__(self, grid: Grid, client_indices: Sequence[Any], log: Any) -> None:
        self.grid = grid
        self.client_indices = client_indices
        self.log = log
        self.node_of: dict[int, int] = {}
        self.ignored: set[int] = set()
        self.left: dict[int, int] = {}  # dropped client -> the round (1-based) it was dropped in
        self.round = 0  # the round (0-based) being started, for the log lines
        self.events: list[dict[str, Any]] = []  # {"round", "client", "event": dropped|rejoined}
        self.joined_at: dict[int, float] = {}  # node -> time.time() it was registered
        self.events_file: Path | None = None  # deaths the local launcher saw (`gone`)
        self._deaths: dict[int, float] = {}  # partition -> last death time read from it
        self._read = 0

    def refresh(self, timeout: float) -> None:
        """Ask every SuperNode not seen before who it is, and check its partition."""
        known = set(self.node_of.values()) | self.ignored
        new = [n for n in self.grid.get_node_ids() if n not in known]
        if not new:
            return
        queries = {
            n: FlowerMessage(to_record(Message()), n, "query", group_id="roster", ttl=timeout)
            for n in new
        }
        replies, silent = exchange(self.grid, queries, timeout)
        self.ignored.update(silent)
        for node, reply in replies.items():
            failure = node_failure(reply)
            if failure == UNREACHABLE:
                self.ignored.add(node)
            elif failure is not None:
                raise FedhetError(f"SuperNode {node} cannot join the run: {failure}")
            else:
                self._register(node, from_record(reply.content)[0].scalars)

    def _register(self, node: int, info: dict[str, Any]) -> None:
        client_id = int(info["client_id"])
        indices = self.client_indices[client_id]
        if info["num_samples"] != len(indices) or info["fingerprint"] != fingerprint(indices):
            raise FedhetError(
                f"SuperNode {node} (partition-id {client_id}) holds a different partition than "
                f"the server ({info['num_samples']} vs {len(indices)} samples): every machine "
                "must use the same dataset files, settings and fedhet version"
            )
        old = self.node_of.get(client_id)
        if old is not None:
            self.log(f"fedhet: partition-id {client_id}: SuperNode {node} replaces SuperNode {old}")
            self.ignored.add(old)
        if client_id in self.left:
            since = self.left.pop(client_id)
            self.log(f"fedhet: round {self.round + 1}: client {client_id} rejoined on SuperNode "
                     f"{node} (dropped since round {since})")
            self.events.append({"round": self.round + 1, "client": client_id, "event": "rejoined",
                                "node": node})
        self.node_of[client_id] = node
        self.joined_at[node] = time.time()

    def wait_for_all(self, timeout: float) -> None:
        n = len(self.client_indices)
        deadline = time.monotonic() + timeout
        while True:
            self.refresh(max(5.0, deadline - time.monotonic()))
            missing = sorted(set(range(n)) - set(self.node_of))
            if not missing:
                return
            if time.monotonic() > deadline:
                raise FedhetError(
                    f"{n - len(missing)} of {n} clients have a SuperNode after {timeout:.0f} s "
                    f"(missing partition-id {', '.join(map(str, missing))}); start one "
                    "`flower-supernode --node-config 'partition-id=<i>'` per client"
                )
            time.sleep(0.5)

    def gone(self, client_ids: Any) -> set[int]:
        """The clients among `client_ids` whose current node died after it joined, as the
        launcher recorded in `events_file` (one JSON object a line: partition, time)."""
        if self.events_file is None:
            return set()
        try:
            with self.events_file.open("rb") as f:
                f.seek(self._read)
                data = f.read()
        except OSError:
            return set()
        end = data.rfind(b"\n") + 1
        self._read += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            self._deaths[int(event["partition"])] = float(event["time"])
        return {c for c in client_ids if c in self.node_of and c in self._deaths
                and self._deaths[c] > self.joined_at.get(self.node_of[c], float("inf"))}

    def drop(self, client_id: int, round: int) -> None:
        """The client's node left in `round` (0-based): ignore it until a new one joins."""
        node = self.node_of.pop(client_id)
        self.ignored.add(node)
        self.left[client_id] = round + 1
        self.events.append({"round": round + 1, "client": client_id, "event": "dropped",
                            "node": node})


class FlowerExecutor:
    """The executor of a Flower server's loop: a round's requests go to the clients' SuperNodes
    (`Roster`), and the replies that arrive in time are yielded (see the module docstring)."""

    name = "flower"

    def __init__(
        self, grid: Grid, host: ClientHost, round_timeout: float, algorithm: str, log: Any = say,
    ) -> None:
        self.grid = grid
        self.host = host
        """The server's `ClientHost`: it holds no client state, only the round's BatchNorm
        statistics the replies carry (their weights are the clients' sample counts)."""
        self.round_timeout = round_timeout
        self.algorithm = algorithm
        self.log = log
        self.roster = Roster(grid, host.client_indices, log)
        self.wire = {"down": 0, "up": 0, "total": 0}
        self.dropped = 0

    def available(self, client_id: int) -> bool:
        return client_id in self.roster.node_of

    def update(self, client_id: int, message: Message, round: int) -> Message:
        """Send one downlink to the client's node and return its reply; a topology that is
        not star cannot go on without it, so a missing reply is an error."""
        if not self.available(client_id):
            self.roster.refresh(self.round_timeout)
        replies = self.exchange({client_id: message}, round)
        if client_id not in replies:
            raise FedhetError(
                f"client {client_id} did not reply in round {round + 1}; "
                f"{self.algorithm} ({self.host.algorithm.topology} topology) cannot skip a client"
            )
        return replies[client_id]

    def run(self, round: int, requests: Sequence[tuple[int, Message]]) -> Iterator[tuple[int, Message]]:
        """All requests in flight at once; yields the replies that arrived in time."""
        ups = self.exchange(dict(requests), round)
        for client_id, _ in requests:
            if client_id in ups:
                yield client_id, ups[client_id]

    def exchange(self, downs: dict[int, Message], round: int) -> dict[int, Message]:
        """Send several downlinks at once; returns the replies that arrived in time."""
        downs = {c: m for c, m in downs.items() if self.available(c)}
        messages = {}
        for c, down in downs.items():
            content = to_record(down, client_id=c, round=round)
            self.wire["down"] += wire_bytes(content)
            messages[c] = FlowerMessage(
                content, self.roster.node_of[c], "train", group_id=str(round + 1),
                ttl=self.round_timeout,
            )
        replies, silent = exchange(self.grid, messages, self.round_timeout,
                                   gone=lambda: self.roster.gone(downs))
        dead = self.roster.gone(silent)
        why = {c: "its SuperNode died" if c in dead else f"no reply within {self.round_timeout:g} s"
               for c in silent}
        ups: dict[int, Message] = {}
        for c in sorted(replies):
            failure = node_failure(replies[c])
            if failure == UNREACHABLE:
                why[c] = "the SuperLink reports its SuperNode offline"
            elif failure is not None:
                raise FedhetError(f"client {c} failed in round {round + 1}: {failure}")
            else:
                self.wire["up"] += wire_bytes(replies[c].content)
                ups[c] = self._received(c, replies[c])
        for c in sorted(why):
            self.log(f"fedhet: round {round + 1}: dropped client {c} (SuperNode "
                     f"{self.roster.node_of[c]}): {why[c]}; left out until a SuperNode for "
                     f"partition-id {c} joins again")
            self.roster.drop(c, round)
            self.dropped += 1
        return ups

    def _received(self, client_id: int, reply: FlowerMessage) -> Message:
        up, _ = from_record(reply.content)
        self.host.keep_buffers(client_id, up)  # the round average of BatchNorm statistics
        return up

    def columns(self) -> dict[str, float]:
        """The bytes on the wire since the last row, their running total, and the clients that
        missed the round."""
        self.wire["total"] += self.wire["down"] + self.wire["up"]
        columns: dict[str, float] = {
            "wire_downlink_bytes": self.wire["down"], "wire_uplink_bytes": self.wire["up"],
            "cum_wire_bytes": self.wire["total"], "clients_dropped": self.dropped,
        }
        self.wire["down"] = self.wire["up"] = 0
        self.dropped = 0
        return columns

    def close(self) -> None:
        pass


def server_run(
    cfg: RunConfig, store: RunStore | None, grid: Grid, round_timeout: float, log: Any = say,
    callbacks: Sequence[CallbackLike] = (),
) -> Simulation:
    """The run of `cfg` with its clients on the SuperNodes of `grid` (`FlowerExecutor`, and
    `flower_star_round` for the star topology); `run.executor.roster` maps them."""
    return assemble(
        cfg, store=store, log=log, callbacks=callbacks,
        executor=lambda host: FlowerExecutor(grid, host, round_timeout, cfg.algorithm, log),
        runners={"star": flower_star_round},
    )


def flower_star_round(
    rc: RunnerContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """`star_round` with the sampled clients' updates in flight at the same time."""
    ex: FlowerExecutor = rc.executor
    ex.roster.round = round
    ex.roster.refresh(ex.round_timeout)  # a restarted SuperNode re-joins here
    downs = {}
    for client_id in clients:
        if ex.available(client_id):
            downs[client_id] = rc.configure(state, client_id, round)
            rc.comm.send("device-cloud", "down", downs[client_id])
        else:
            ex.dropped += 1
            rc.log(f"fedhet: round {round + 1}: dropped client {client_id}: its SuperNode left "
                   f"the run in round {ex.roster.left.get(client_id, '?')}")
    ups = ex.exchange(downs, round)
    replies = []
    for client_id in clients:
        if client_id in ups:
            rc.comm.send("device-cloud", "up", ups[client_id])
            replies.append(Reply(client_id, ups[client_id]))
    if not replies:
        rc.log(f"fedhet: round {round + 1}: no client returned; server state kept")
        return state, {}
    return rc.algorithm.aggregate(state, round, replies)


def progress_line(row: dict[str, Any], rounds: int, started: int, seconds: float) -> str:
    """`fedhet: round k/R: accuracy …, loss …, s/round, ETA` for one metrics row; `started`
    is the round this process began at and `seconds` its time since."""
    k = int(row["round"])
    per_round = seconds / max(k - started, 1)
    parts = [f"fedhet: round {k}/{rounds}:"]
    for name, key in (("accuracy", "test_accuracy"), ("loss", "test_loss")):
        value = float(row.get(key, float("nan")))
        if value == value:  # not NaN (rounds that are not evaluated)
            parts.append(f"{name} {value:.4f},")
    parts.append(f"{per_round:.2f} s/round, ETA {per_round * (rounds - k):.0f} s")
    return " ".join(parts)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one fedhet experiment over the federation; results go to the run config's `out`."""
    out = Path(str(context.run_config[OUT_KEY]))
    if context.run_config.get(FAST_PULLS_KEY, False):
        shorten_pull_backoff()
    try:
        with rundir.exclusive(out, "deploy"):
            run_experiment(grid, context, out)
    except Exception as e:
        reason = str(e) if isinstance(e, FedhetError) else traceback.format_exc()
        atomic_write_text(out / "error.txt", reason)
        raise


def run_experiment(grid: Grid, context: Context, out: Path) -> dict[str, Any]:
    settings = json.loads(str(context.run_config[SETTINGS_KEY]))
    plugins.ensure_recorded(settings, "the Flower run config")
    cfg = config_of(settings, "run config")
    prepare_out(out, bool(context.run_config.get(FORCE_KEY, False)))
    store = RunStore(out, provenance.of_run)
    store.write_config(cfg.to_dict())
    sim = server_run(cfg, store, grid, float(context.run_config.get(ROUND_TIMEOUT_KEY, 600.0)))
    flower = sim.side.executor
    assert isinstance(flower, FlowerExecutor), "server_run builds the run on a FlowerExecutor"
    if context.run_config.get(NODE_EVENTS_KEY):
        flower.roster.events_file = Path(str(context.run_config[NODE_EVENTS_KEY]))
    t0 = time.perf_counter()
    flower.roster.wait_for_all(float(context.run_config.get(NODE_WAIT_KEY, 300.0)))
    say(f"fedhet: {len(flower.roster.node_of)} SuperNodes joined in {time.perf_counter() - t0:.1f} s")
    t1 = time.perf_counter()
    sim.callbacks.append(lambda row: say(progress_line(row, cfg.rounds, 0, time.perf_counter() - t1)))
    summary = sim.run()
    summary["cum_wire_bytes"] = flower.wire["total"]
    store.write_summary(summary)
    finished_nodes = len(flower.roster.node_of)
    atomic_write_text(out / "deploy.json", to_json({
        "nodes": {str(c): n for c, n in sorted(flower.roster.node_of.items())},
        "dropped_nodes": sorted(flower.roster.ignored), "round_timeout_s": flower.round_timeout,
        "clients": cfg.clients, "supernodes_finished": finished_nodes,
        "node_events": flower.roster.events,
        "supernode_auth": bool(context.run_config.get(SUPERNODE_AUTH_KEY, False)),
    }))
    say(f"fedhet: finished with {finished_nodes} of {cfg.clients} SuperNodes; final accuracy "
          f"{summary['final_accuracy']:.4f}; results in {out}")
    return summary
