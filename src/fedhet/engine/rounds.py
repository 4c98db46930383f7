"""Round runners: how one round's messages flow for a topology.

A runner is `(round_ctx, state, round, clients) -> (state, diagnostics)`. It calls the
algorithm's server half, hands each downlink message to `round_ctx.client_update` (which runs
the client half where the client's data lives) and records every message in `round_ctx.comm`.
The star runner is FedAvg's protocol; hierarchical and ring topologies add their own runners.

Topologies (an algorithm names one in its `topology` ClassVar):
- `star`: cloud ↔ each sampled device (`device-cloud` links).
- `ring` (ring-optimization, FedSR eqs. 8–9): the sampled devices form one ring; each hop is a
  `device-device` message, the reply of device j being the downlink of device j+1. The hop into
  the first device (from the previous round's last device, or the initialiser in round 0) is
  counted too, so a round costs one transfer per device. The last reply goes to `aggregate`.
- `edge-ring` (FedSR, Algorithm 1): cloud → edge (`edge-cloud`), edge → first device of its ring
  (`device-edge`), `R` passes around the ring (`device-device`, `R·Q − 1` hops for `Q`
  devices), last device → edge (`device-edge`), `edge_aggregate`, edge → cloud (`edge-cloud`),
  then the cloud's `aggregate` over the edges' reports.
- `edge-star` (HierFAVG): cloud → edge; `κ2` times: edge → each device and back
  (`device-edge`), `edge_aggregate`; edge → cloud; cloud `aggregate`.
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
    one_line,
)


class RoundContext(Protocol):
    algorithm: Algorithm
    comm: CommLedger
    faults: FaultModel
    """Optional (`NO_FAULTS` when absent): which sampled clients drop out of a round."""
    log: Callable[[str], None]
    """Optional (`print` when absent): one line per failed client or empty round."""

    def configure(self, state: ServerState, client_id: int, round: int) -> Message:
        """`algorithm.configure` plus what the engine adds to every downlink (BN statistics)."""
        ...

    def client_update(self, client_id: int, message: Message, round: int) -> Message:
        """Run the client half where the client's data lives; returns its reply."""
        ...

    def client_updates(
        self, round: int, requests: Sequence[tuple[int, Message]]
    ) -> Iterator[tuple[int, Message | ClientFailure]]:
        """Run several independent client halves (the executor decides how: one after another,
        or side by side) and yield `(client_id, reply)` as replies become available, or
        `(client_id, ClientFailure)` for a client that raised."""
        ...


RoundRunner = Callable[[RoundContext, ServerState, int, Sequence[int]], tuple[ServerState, dict]]


def _faults(rc: RoundContext) -> FaultModel:
    return getattr(rc, "faults", None) or NO_FAULTS


def _log(rc: RoundContext, line: str) -> None:
    getattr(rc, "log", print)(line)


def _fail(rc: RoundContext, tally: RoundTally, failure: ClientFailure) -> None:
    tally.failed.add(failure.client_id)
    _log(rc, failure_line(failure))


def reply_stream(
    rc: RoundContext, round: int, requests: Sequence[tuple[int, Message]], link: str,
    tally: RoundTally,
) -> Iterator[Reply]:
    """The replies of `requests`, one at a time as the executor makes them: failures are logged
    and left out, each reply is checked for non-finite values and billed on `link`."""
    for client_id, up in isolate(rc.client_updates, round, requests):
        if isinstance(up, ClientFailure):
            _fail(rc, tally, up)
            continue
        check_finite(up, round, client_id)
        rc.comm.send(link, "up", up)
        tally.returned.add(client_id)
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


def run_ring(
    rc: RoundContext, message: Message, ring: Sequence[int], passes: int, round: int,
    tally: RoundTally | None = None, holder: int | None = None,
    entry: tuple[str, str] = ("device-device", "peer"),
) -> tuple[Message | None, int | None]:
    """`passes` trips around `ring` starting with `message`; returns `(last reply, its device)`,
    or `(None, None)` when no device answered.

    `holder` is the device that holds `message` (None: the edge or the initialiser, and the
    first delivery is billed on `entry`). Every other delivery is a `device-device` hop from the
    holder, the reply of one device being the downlink of the next; a hop from a device to
    itself is not billed. A device that fails is skipped for the rest of the round and the
    message goes on from its holder to the next device."""
    tally = tally if tally is not None else RoundTally()
    last_device = None
    for hop in range(passes * len(ring)):
        device = ring[hop % len(ring)]
        if device in tally.failed:
            continue
        if holder is None:
            rc.comm.send(*entry, message)
        elif holder != device:
            rc.comm.send("device-device", "peer", message)
        try:
            reply = rc.client_update(device, message, round)
        except Exception as exc:  # noqa: BLE001  (a client error drops the client, not the run)
            _fail(rc, tally, ClientFailure(device, round, one_line(exc)))
            continue
        check_finite(reply, round, device)
        tally.returned.add(device)
        message, holder, last_device = reply, device, device
    return (message, last_device) if last_device is not None else (None, None)


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
    down = rc.configure(state, live[0], round)
    last, device = run_ring(rc, down, live, 1, round, tally, ring_holder(state))
    if last is None:
        return _kept(rc, state, round, tally)
    state, diag = rc.algorithm.aggregate(state, round, [Reply(device, last)])
    return state, {**diag, "rings": [list(ring)], **tally.diagnostics()}


def edge_ring_round(
    rc: RoundContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """Cloud → edges → one ring per edge (`R` passes) → edges → cloud (FedSR, Algorithm 1).
    An edge whose ring returned nothing sends no report."""
    role = _edge_role(rc)
    tally = RoundTally()
    reports = []
    groups = role.edge_groups(clients, round)
    for edge_id, ring in groups:
        live = _admitted(rc, tally, ring, round)
        down = rc.configure(state, edge_id, round)
        rc.comm.send("edge-cloud", "down", down)
        if not live:
            continue
        edge = role.edge_init(down, edge_id, live, round)
        first = role.edge_configure(edge, live[0], round, 0)
        last, device = run_ring(
            rc, first, live, role.ring_passes(), round, tally, entry=("device-edge", "down")
        )
        if last is None:
            continue
        rc.comm.send("device-edge", "up", last)
        edge = role.edge_aggregate(edge, round, [Reply(device, last)])
        up = role.edge_report(edge)
        rc.comm.send("edge-cloud", "up", up)
        reports.append(Reply(edge_id, up))
    if not reports:
        return _kept(rc, state, round, tally)
    state, diag = _with_groups(rc.algorithm.aggregate(state, round, iter(reports)), groups)
    return state, {**diag, **tally.diagnostics()}


def edge_star_round(
    rc: RoundContext, state: ServerState, round: int, clients: Sequence[int]
) -> tuple[ServerState, dict[str, Any]]:
    """Cloud → edges; `κ2` edge aggregations of their devices; edges → cloud (HierFAVG).
    An edge iteration with no reply leaves the edge model as it is; an edge none of whose
    devices ever returned sends no report."""
    role = _edge_role(rc)
    tally = RoundTally()
    reports = []
    groups = role.edge_groups(clients, round)
    for edge_id, members in groups:
        live = _admitted(rc, tally, members, round)
        down = rc.configure(state, edge_id, round)
        rc.comm.send("edge-cloud", "down", down)
        edge = role.edge_init(down, edge_id, live, round)
        aggregated = False
        for iteration in range(role.edge_iterations()):
            requests = []
            for client_id in live:
                if client_id in tally.failed:
                    continue
                message = role.edge_configure(edge, client_id, round, iteration)
                rc.comm.send("device-edge", "down", message)
                requests.append((client_id, message))
            replies = reply_stream(rc, round, requests, "device-edge", tally)
            result = stream_into(lambda e, k, rs: (role.edge_aggregate(e, k, rs),), edge, round, replies)
            if result is not None:
                (edge,) = result
                aggregated = True
        if not aggregated:
            continue
        up = role.edge_report(edge)
        rc.comm.send("edge-cloud", "up", up)
        reports.append(Reply(edge_id, up))
    if not reports:
        return _kept(rc, state, round, tally)
    state, diag = _with_groups(rc.algorithm.aggregate(state, round, iter(reports)), groups)
    return state, {**diag, **tally.diagnostics()}


ROUND_RUNNERS: dict[str, RoundRunner] = {
    "star": star_round,
    "ring": ring_round,
    "edge-ring": edge_ring_round,
    "edge-star": edge_star_round,
}
