"""Round runners: how one round's messages flow for a topology.

A runner is `(round_ctx, state, round, clients) -> (state, diagnostics)`. It calls the
algorithm's server half, hands the downlink messages to `round_ctx.client_updates` (the run's
executor, which runs the client halves where the clients' data lives) and records every message
in `round_ctx.comm`. The star runner is FedAvg's protocol; hierarchical and ring topologies add
their own runners.

Topologies (an algorithm names one in its `topology` ClassVar):
- `star`: cloud ↔ each sampled device (`device-cloud` links).
- `ring` (ring-optimization, FedSR eqs. 8–9): the sampled devices form one ring; each hop is a
  `device-device` message, the reply of device j being the downlink of device j+1. The hop into
  the first device (from the previous round's last device, or the initialiser in round 0) is
  counted too, so a round costs one transfer per device. The last reply goes to `aggregate`.
- `edge-ring` (FedSR, Algorithm 1): cloud → edge (`edge-cloud`), edge → first device of its ring
  (`device-edge`), `R` passes around the ring (`device-device`, `R·Q − 1` hops for `Q`
  devices), last device → edge (`device-edge`), `edge_aggregate`, edge → cloud (`edge-cloud`),
  then the cloud's `aggregate` over the edges' reports, in edge order.
- `edge-star` (HierFAVG): cloud → edge; `κ2` times: edge → each device and back
  (`device-edge`), `edge_aggregate`; edge → cloud; cloud `aggregate`.
Edges are independent. An executor that runs chains (`RoundContext.client_chains`: the
stacked one) gets each ring's walk, and each HierFAVG edge's `κ2` iterations, as one chain,
and trains a round of all of them in one stacked call; otherwise they go in lockstep: hop `h`
of every edge's ring (`walk_rings`), or edge iteration `t` of every edge, in one
`client_updates` call. Hops of one ring stay in order (each starts from the previous hop's
reply; a round holds one model per ring). The result is
that of running the edges one after another: they share no device and every client's
randomness is keyed by (seed, round, client, purpose).
Hops from a device to itself (a ring of one device, or the same device ending one round and
starting the next) move nothing and are not billed.

Faults (engine/faults.py, docs/faults.md): each sampled client is admitted or dropped (offline,
or a straggler past the deadline) by the run's `FaultModel` before the round's work starts; a
client whose update raises is isolated as a `ClientFailure`, logged in one line and dropped for
the rest of the round; a reply with a non-finite tensor or loss raises `Diverged`. Replies reach
`aggregate` (and `edge_aggregate`) as a one-pass generator, so a round holds one reply at a time
plus the algorithm's running sums; a round (or an edge iteration) with no reply keeps its state.
Every round's diagnostics carry `clients_sampled`, `clients_returned`, `clients_dropped`,
`clients_late` and `clients_failed`.
The edge role (`edge_groups`, `edge_init`, `edge_configure`, `edge_aggregate`, `edge_report`)
has the server half's shape; see `fedhet.algorithms.hierarchical.EdgeRole`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from typing import Any, Protocol

from fedhet.algorithms.base import Algorithm, Message, Reply, ServerState
from fedhet.algorithms.hierarchical import EdgeRole
from fedhet.algorithms.state import ring_holder
from fedhet.engine.comm import CommLedger
from fedhet.engine.failures import ClientFailure
from fedhet.engine.faults import (
    NO_FAULTS,
    FaultModel,
    RoundTally,
    check_finite,
    failure_line,
    first_and_rest,
    isolate,
)


class RoundContext(Protocol):
    """What a round runner reads of the run (read-only: `RunnerContext` is frozen)."""

    @property
    def algorithm(self) -> Algorithm: ...

    @property
    def comm(self) -> CommLedger: ...

    @property
    def faults(self) -> FaultModel:
        """Optional (`NO_FAULTS` when absent): which sampled clients drop out of a round."""
        ...

    @property
    def log(self) -> Callable[[str], None]:
        """Optional (`print` when absent): one line per failed client or empty round."""
        ...

    @property
    def round_failures(self) -> list[ClientFailure]:
        """Optional: the round's client failures are appended here, first one first."""
        ...

    @property
    def client_chains(self) -> Callable[[int, Sequence[Chain]], None] | None:
        """Optional (None when absent): runs independent chains of client halves (ring walks,
        HierFAVG edges) as the executor pleases (`StackedExecutor.chains`); without it they go
        in lockstep."""
        ...

    def configure(self, state: ServerState, client_id: int, round: int) -> Message:
        """`algorithm.configure` plus what the engine adds to every downlink (BN statistics)."""
        ...

    def client_update(self, client_id: int, message: Message, round: int) -> Message:
        """Run the client half where the client's data lives; returns its reply (for a runner
        that relays one client at a time; the built-in runners use `client_updates`)."""
        ...

    def client_updates(
        self, round: int, requests: Sequence[tuple[int, Message]]
    ) -> Iterator[tuple[int, Message | ClientFailure]]:
        """Run several independent client halves (the executor decides how: one after another,
        or side by side) and yield `(client_id, reply)` as replies become available, or
        `(client_id, ClientFailure)` for a client that raised."""
        ...


@dataclass(frozen=True)
class RunnerContext:
    """The `RoundContext` a `Simulation` hands its round runner: only what a round needs (the
    algorithm, the ledger, the fault model, the log, the round's failures, and the clients
    through the run's executor), not the run's store, callbacks or loop."""

    algorithm: Algorithm
    comm: CommLedger
    faults: FaultModel
    log: Callable[[str], None]
    round_failures: list[ClientFailure]
    configure: Callable[[ServerState, int, int], Message]
    client_update: Callable[[int, Message, int], Message]
    client_updates: Callable[[int, Sequence[tuple[int, Message]]],
                             Iterator[tuple[int, Message | ClientFailure]]]
    executor: Any
    """The run's executor itself, for a runner that drives it (Flower's star round)."""
    client_chains: Callable[[int, Sequence[Chain]], None] | None = None
    """The executor's way of running independent chains of client halves (a ring's walk, a
    HierFAVG edge), when it has one (`StackedExecutor.chains`); otherwise they go in lockstep."""


RoundRunner = Callable[[RunnerContext, ServerState, int, Sequence[int]], tuple[ServerState, dict]]
"""A round runner as the engine calls it: with the `RunnerContext` of its `Simulation`. The
built-in runners take any `RoundContext`; a runner that drives the executor itself (Flower's
star round) reads `RunnerContext.executor`."""

class ChainClients(Protocol):
    """How a chain runs its clients' halves (`RoundContext.client_chains`)."""

    def __call__(self, client_id: int, message: Message) -> Message | ClientFailure:
        """One client's half: its reply, or its `ClientFailure`."""
        ...

    def many(self, requests: Sequence[tuple[int, Message]]) -> list[tuple[int, Message | ClientFailure]]:
        """Independent clients' halves, side by side: `(client_id, reply or ClientFailure)` in
        request order, once all are back."""
        ...


Chain = Callable[[ChainClients], None]
"""Client halves that depend on each other's replies (a ring's walk: each hop the previous
one's reply; a HierFAVG edge: each iteration the average of the last), run through the
`ChainClients` it is given; chains given to `client_chains` together share no client."""


def _faults(rc: RoundContext) -> FaultModel:
    return getattr(rc, "faults", None) or NO_FAULTS


def _log(rc: RoundContext, line: str) -> None:
    getattr(rc, "log", print)(line)


def _fail(rc: RoundContext, tally: RoundTally, failure: ClientFailure) -> None:
    tally.failed.add(failure.client_id)
    kept = getattr(rc, "round_failures", None)
    if kept is not None:
        kept.append(failure)
    _log(rc, failure_line(failure))


def returned(
    rc: RoundContext, round: int, requests: Sequence[tuple[int, Message]], tally: RoundTally
) -> Iterator[tuple[int, Message]]:
    """`(client_id, reply)` of `requests`, one at a time as the executor makes them: failures
    are logged, counted and left out; each reply is checked for non-finite values."""
    for client_id, up in isolate(rc.client_updates, round, requests):
        if isinstance(up, ClientFailure):
            _fail(rc, tally, up)
            continue
        check_finite(up, round, client_id)
        tally.returned.add(client_id)
        yield client_id, up


def reply_stream(
    rc: RoundContext, round: int, requests: Sequence[tuple[int, Message]], link: str,
    tally: RoundTally,
) -> Iterator[Reply]:
    """The replies of `requests` (`returned`), each billed on `link` as it comes."""
    for client_id, up in returned(rc, round, requests, tally):
        rc.comm.send(link, "up", up)
        yield Reply(client_id, up)


def stream_into(aggregate: Callable, state: Any, round: int, replies: Iterable[Reply]):
    """`aggregate(state, round, replies)` over a one-pass stream; None when the stream is empty
    (the caller keeps its state). The stream must be consumed to the end."""
    peeked = first_and_rest(replies)
    if peeked is None:
        return None
    _, stream = peeked
    result = aggregate(state, round, stream)
    for _ in stream:
        raise RuntimeError(f"{aggregate.__qualname__} did not consume every reply")
    return result


def _kept(rc: RoundContext, state: ServerState, round: int, tally: RoundTally, where: str = ""):
    _log(rc, f"round {round + 1}: no client returned{where}; server state kept")
    return state, tally.diagnostics()


def star_round(
    rc: RoundContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """Cloud → each sampled device → cloud, then one aggregation over those that returned."""
    faults, tally = _faults(rc), RoundTally()
    requests = []
    for client_id in clients:
        down = rc.configure(state, client_id, round)
        rc.comm.send("device-cloud", "down", down)
        if tally.admit(faults, client_id, round):
            requests.append((client_id, down))
    replies = reply_stream(rc, round, requests, "device-cloud", tally)
    result = stream_into(rc.algorithm.aggregate, state, round, replies)
    if result is None:
        return _kept(rc, state, round, tally)
    state, diag = result
    return state, {**diag, **tally.diagnostics()}


def _edge_role(rc: RoundContext) -> EdgeRole:
    algorithm = rc.algorithm
    if not isinstance(algorithm, EdgeRole):
        raise TypeError(f"{type(algorithm).__name__} has no edge role for topology {algorithm.topology}")
    return algorithm


def _with_groups(
    result: tuple[ServerState, dict], groups: list[tuple[int, list[int]]]
) -> tuple[ServerState, dict]:
    """Record the round's edge groups (in ring order) for diagnostics.jsonl."""
    state, diag = result
    return state, {**diag, "rings": [list(g) for _, g in groups], "edge_ids": [m for m, _ in groups]}


@dataclass
class RingWalk:
    """One ring's trip in a round: `passes` times around `ring`, starting with `message`.

    `holder` is the device that holds `message` (None: the edge or the initialiser, and the
    first delivery is billed on `entry`). Every other delivery is a `device-device` hop from the
    holder, the reply of one device being the downlink of the next (eqs. 8, 13); a hop from a
    device to itself is not billed. A device that fails is skipped for the rest of the round
    and the message goes on from its holder to the next device. After the walk, `message` is
    the last reply and `last` its device (None when no device answered)."""

    ring: Sequence[int]
    passes: int
    message: Message
    holder: int | None = None
    entry: tuple[str, str] = ("device-device", "peer")
    position: int = 0
    """Index into the ring's `passes · len(ring)` visits of the next one to make."""
    last: int | None = None

    def next_device(self, failed: set[int]) -> int | None:
        """The next device to visit (devices in `failed` are passed over), or None when the walk
        is done."""
        while self.position < self.passes * len(self.ring):
            device = self.ring[self.position % len(self.ring)]
            self.position += 1
            if device not in failed:
                return device
        return None

    def deliver(self, comm: CommLedger, device: int) -> Message:
        """Bill the delivery of `message` to `device` and return it (the device's downlink)."""
        if self.holder is None:
            comm.send(*self.entry, self.message)
        elif self.holder != device:
            comm.send("device-device", "peer", self.message)
        return self.message

    def accept(self, device: int, reply: Message) -> None:
        """`device` answered: its reply is the next downlink, and it holds the model now."""
        self.message, self.holder, self.last = reply, device, device


def walk_rings(rc: RoundContext, round: int, walks: Sequence[RingWalk], tally: RoundTally) -> None:
    """Run independent rings. With an executor that runs chains (`rc.client_chains`), each
    ring's walk is one chain, its hops one after another as the executor pleases (the stacked
    executor trains every hop of every ring in one stacked call). Otherwise in lockstep: at
    each step, the next hop of every ring that has one left goes into one `rc.client_updates`
    call (so the stacked executor stacks them). Either way the hops of one ring stay in order,
    each starting from the previous hop's reply; failures are logged and the failing device is
    skipped for the rest of the round; each reply is checked for non-finite values. The result
    equals running the rings one after another: rings share no device, and every client's
    randomness is keyed by (seed, round, client, purpose)."""
    _check_disjoint(walks)
    chains = getattr(rc, "client_chains", None)
    if chains is not None:
        chains(round, [partial(_walk, rc, round, walk, tally) for walk in walks])
        return
    while True:
        walk_of: dict[int, RingWalk] = {}
        requests = []
        for walk in walks:
            device = walk.next_device(tally.failed)
            if device is None:
                continue
            walk_of[device] = walk
            requests.append((device, walk.deliver(rc.comm, device)))
        if not requests:
            return
        for device, up in returned(rc, round, requests, tally):
            walk_of[device].accept(device, up)


def _check_disjoint(walks: Sequence[RingWalk]) -> None:
    seen: set[int] = set()
    for walk in walks:
        shared = seen & set(walk.ring)
        if shared:
            raise ValueError(f"device {min(shared)} sits in two rings of one round")
        seen |= set(walk.ring)


def _walk(rc: RoundContext, round: int, walk: RingWalk, tally: RoundTally, update: ChainClients) -> None:
    """One ring's walk as a chain: deliver, run, check and accept hop after hop (`returned`'s
    rules for one reply at a time)."""
    while (device := walk.next_device(tally.failed)) is not None:
        reply = _accepted(rc, round, tally, device, update(device, walk.deliver(rc.comm, device)))
        if reply is not None:
            walk.accept(device, reply)


def _accepted(rc: RoundContext, round: int, tally: RoundTally, client_id: int,
              up: Message | ClientFailure) -> Message | None:
    """One reply of a chain, by `returned`'s rules: a failure logged and counted (None), else
    checked for non-finite values, counted as returned, and given back."""
    if isinstance(up, ClientFailure):
        _fail(rc, tally, up)
        return None
    check_finite(up, round, client_id)
    tally.returned.add(client_id)
    return up


def _admitted(rc: RoundContext, tally: RoundTally, devices: Sequence[int], round: int) -> list[int]:
    faults = _faults(rc)
    return [d for d in devices if tally.admit(faults, d, round)]


def ring_round(
    rc: RoundContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """One ring of all sampled devices (ring-optimization, eqs. 8–9); dropped devices are left
    out of the ring. The model enters from the device that held it at the end of the last round
    (`RingState.holder`; the initialiser in round 0)."""
    role = _edge_role(rc)
    tally = RoundTally()
    ((_, ring),) = role.edge_groups(clients, round)
    live = _admitted(rc, tally, ring, round)
    if not live:
        return _kept(rc, state, round, tally)
    walk = RingWalk(live, 1, rc.configure(state, live[0], round), ring_holder(state))
    walk_rings(rc, round, [walk], tally)
    if walk.last is None:
        return _kept(rc, state, round, tally)
    state, diag = rc.algorithm.aggregate(state, round, [Reply(walk.last, walk.message)])
    return state, {**diag, "rings": [list(ring)], **tally.diagnostics()}


def edge_ring_round(
    rc: RoundContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """Cloud → edges → one ring per edge (`R` passes) → edges → cloud (FedSR, Algorithm 1).
    The edges' rings run in lockstep (`walk_rings`); an edge whose ring returned nothing sends
    no report, and the reports reach the cloud in edge order."""
    role = _edge_role(rc)
    tally = RoundTally()
    groups = role.edge_groups(clients, round)
    started: list[tuple[int, dict, RingWalk]] = []
    for edge_id, ring in groups:
        live = _admitted(rc, tally, ring, round)
        down = rc.configure(state, edge_id, round)
        rc.comm.send("edge-cloud", "down", down)
        if not live:
            continue
        edge = role.edge_init(down, edge_id, live, round)
        first = role.edge_configure(edge, live[0], round, 0)
        walk = RingWalk(live, role.ring_passes(), first, entry=("device-edge", "down"))
        started.append((edge_id, edge, walk))
    walk_rings(rc, round, [walk for _, _, walk in started], tally)
    reports = []
    for edge_id, edge, walk in started:
        if walk.last is None:
            continue
        rc.comm.send("device-edge", "up", walk.message)
        edge = role.edge_aggregate(edge, round, [Reply(walk.last, walk.message)])
        up = role.edge_report(edge)
        rc.comm.send("edge-cloud", "up", up)
        reports.append(Reply(edge_id, up))
    if not reports:
        return _kept(rc, state, round, tally)
    state, diag = _with_groups(rc.algorithm.aggregate(state, round, iter(reports)), groups)
    return state, {**diag, **tally.diagnostics()}


@dataclass
class _StarEdge:
    """One HierFAVG edge during a round: its id, admitted devices, state, and whether any
    device has returned to it yet."""

    edge_id: int
    live: list[int]
    state: dict
    aggregated: bool = False


def edge_star_round(
    rc: RoundContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """Cloud → edges; `κ2` edge aggregations of their devices; edges → cloud (HierFAVG).
    With `rc.client_chains` each edge is one chain (`_edge_walk`); otherwise iteration `t` of
    every edge goes through one `rc.client_updates` call (requests edge by edge, so the
    stacked executor stacks all edges' devices) and each edge aggregates its own consecutive
    run of the reply stream. An edge iteration with no reply leaves the edge model
    as it is; an edge none of whose devices ever returned sends no report."""
    role = _edge_role(rc)
    tally = RoundTally()
    groups = role.edge_groups(clients, round)
    edges = []
    for edge_id, members in groups:
        live = _admitted(rc, tally, members, round)
        down = rc.configure(state, edge_id, round)
        rc.comm.send("edge-cloud", "down", down)
        edges.append(_StarEdge(edge_id, live, role.edge_init(down, edge_id, live, round)))
    chains = getattr(rc, "client_chains", None)
    if chains is not None:
        chains(round, [partial(_edge_walk, rc, role, edge, round, tally) for edge in edges])
    else:
        for iteration in range(role.edge_iterations()):
            _edge_iteration(rc, role, edges, round, iteration, tally)
    reports = []
    for edge in edges:
        if not edge.aggregated:
            continue
        up = role.edge_report(edge.state)
        rc.comm.send("edge-cloud", "up", up)
        reports.append(Reply(edge.edge_id, up))
    if not reports:
        return _kept(rc, state, round, tally)
    state, diag = _with_groups(rc.algorithm.aggregate(state, round, iter(reports)), groups)
    return state, {**diag, **tally.diagnostics()}


def _edge_walk(
    rc: RoundContext, role: EdgeRole, edge: _StarEdge, round: int, tally: RoundTally,
    clients: ChainClients,
) -> None:
    """One HierFAVG edge's `κ2` iterations as a chain: its devices side by side
    (`clients.many`), then its average of those that returned (in request order, one pass),
    then the next iteration from it; the same messages, bills and checks as the lockstep
    iteration (`_edge_iteration`)."""
    for iteration in range(role.edge_iterations()):
        requests = _edge_downlinks(rc, role, edge, round, iteration, tally)
        if not requests:
            continue
        replies = []
        for client_id, up in clients.many(requests):
            reply = _accepted(rc, round, tally, client_id, up)
            if reply is not None:
                rc.comm.send("device-edge", "up", reply)
                replies.append(Reply(client_id, reply))
        if replies:
            edge.state = role.edge_aggregate(edge.state, round, replies)
            edge.aggregated = True


def _edge_downlinks(
    rc: RoundContext, role: EdgeRole, edge: _StarEdge, round: int, iteration: int, tally: RoundTally,
) -> list[tuple[int, Message]]:
    """Edge iteration `iteration`'s downlink to each of `edge`'s devices still in the round,
    each billed on `device-edge`."""
    requests = []
    for client_id in edge.live:
        if client_id in tally.failed:
            continue
        message = role.edge_configure(edge.state, client_id, round, iteration)
        rc.comm.send("device-edge", "down", message)
        requests.append((client_id, message))
    return requests


def _edge_iteration(
    rc: RoundContext, role: EdgeRole, edges: Sequence[_StarEdge], round: int, iteration: int,
    tally: RoundTally,
) -> None:
    """Edge iteration `iteration` of every edge: all downlinks in one `client_updates` call,
    the reply stream cut lazily into per-edge runs (the executors yield in request order)."""
    edge_of: dict[int, int] = {}
    requests = []
    for index, edge in enumerate(edges):
        downlinks = _edge_downlinks(rc, role, edge, round, iteration, tally)
        requests += downlinks
        edge_of.update((client_id, index) for client_id, _ in downlinks)
    replies = reply_stream(rc, round, requests, "device-edge", tally)
    done: set[int] = set()
    for index, run in groupby(replies, key=lambda reply: edge_of[reply.client_id]):
        if index in done:
            raise RuntimeError(f"the replies of edge {edges[index].edge_id} came out of request order")
        done.add(index)
        edge = edges[index]
        (edge.state,) = stream_into(lambda e, k, rs: (role.edge_aggregate(e, k, rs),), edge.state, round, run)
        edge.aggregated = True


ROUND_RUNNERS: dict[str, RoundRunner] = {
    "star": star_round,
    "ring": ring_round,
    "edge-ring": edge_ring_round,
    "edge-star": edge_star_round,
}
