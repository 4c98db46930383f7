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
The edge role (`edge_groups`, `edge_init`, `edge_configure`, `edge_aggregate`, `edge_report`)
has the server half's shape; see `fedhet.algorithms.hierarchical.EdgeRole`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from fedhet.algorithms.base import Algorithm, Message, Reply
from fedhet.algorithms.hierarchical import EdgeRole
from fedhet.engine.comm import CommLedger


class RoundContext(Protocol):
    algorithm: Algorithm
    comm: CommLedger

    def configure(self, state: dict[str, Any], client_id: int, round: int) -> Message:
        """`algorithm.configure` plus what the engine adds to every downlink (BN statistics)."""
        ...

    def client_update(self, client_id: int, message: Message, round: int) -> Message:
        """Run the client half where the client's data lives; returns its reply."""
        ...

    def client_updates(
        self, round: int, requests: Sequence[tuple[int, Message]]
    ) -> Iterator[tuple[int, Message]]:
        """Run several independent client halves (the executor decides how: one after another,
        or side by side) and yield `(client_id, reply)` as replies become available."""
        ...


RoundRunner = Callable[[RoundContext, dict[str, Any], int, Sequence[int]], tuple[dict, dict]]


def star_round(
    rc: RoundContext, state: dict[str, Any], round: int, clients: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cloud → each sampled device → cloud, then one aggregation."""
    requests = []
    for client_id in clients:
        down = rc.configure(state, client_id, round)
        rc.comm.send("device-cloud", "down", down)
        requests.append((client_id, down))
    replies = []
    for client_id, up in rc.client_updates(round, requests):
        rc.comm.send("device-cloud", "up", up)
        replies.append(Reply(client_id, up))
    return rc.algorithm.aggregate(state, round, replies)


def _edge_role(rc: RoundContext) -> EdgeRole:
    algorithm = rc.algorithm
    if not isinstance(algorithm, EdgeRole):
        raise TypeError(f"{type(algorithm).__name__} has no edge role for topology {algorithm.topology}")
    return algorithm


def _with_groups(result: tuple[dict, dict], groups: list[tuple[int, list[int]]]) -> tuple[dict, dict]:
    """Record the round's edge groups (in ring order) for diagnostics.jsonl."""
    state, diag = result
    return state, {**diag, "rings": [list(g) for _, g in groups], "edge_ids": [m for m, _ in groups]}


def run_ring(rc: RoundContext, message: Message, ring: Sequence[int], passes: int, round: int) -> Message:
    """`passes` trips around `ring` starting with `message` at `ring[0]`; returns the last reply.

    Every hop after the first is a `device-device` message: the reply of one device is the
    downlink of the next (the caller counts the message that enters the ring)."""
    for hop in range(passes * len(ring)):
        if hop:
            rc.comm.send("device-device", "peer", message)
        message = rc.client_update(ring[hop % len(ring)], message, round)
    return message


def ring_round(
    rc: RoundContext, state: dict[str, Any], round: int, clients: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ring of all sampled devices (ring-optimization, eqs. 8–9)."""
    role = _edge_role(rc)
    ((_, ring),) = role.edge_groups(clients, round)
    down = rc.configure(state, ring[0], round)
    rc.comm.send("device-device", "peer", down)
    last = run_ring(rc, down, ring, 1, round)
    state, diag = rc.algorithm.aggregate(state, round, [Reply(ring[-1], last)])
    return state, {**diag, "rings": [list(ring)]}


def edge_ring_round(
    rc: RoundContext, state: dict[str, Any], round: int, clients: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cloud → edges → one ring per edge (`R` passes) → edges → cloud (FedSR, Algorithm 1)."""
    role = _edge_role(rc)
    reports = []
    groups = role.edge_groups(clients, round)
    for edge_id, ring in groups:
        down = rc.configure(state, edge_id, round)
        rc.comm.send("edge-cloud", "down", down)
        edge = role.edge_init(down, edge_id, ring, round)
        first = role.edge_configure(edge, ring[0], round, 0)
        rc.comm.send("device-edge", "down", first)
        last = run_ring(rc, first, ring, role.ring_passes(), round)
        rc.comm.send("device-edge", "up", last)
        edge = role.edge_aggregate(edge, round, [Reply(ring[-1], last)])
        up = role.edge_report(edge)
        rc.comm.send("edge-cloud", "up", up)
        reports.append(Reply(edge_id, up))
    return _with_groups(rc.algorithm.aggregate(state, round, reports), groups)


def edge_star_round(
    rc: RoundContext, state: dict[str, Any], round: int, clients: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cloud → edges; `κ2` edge aggregations of their devices; edges → cloud (HierFAVG)."""
    role = _edge_role(rc)
    reports = []
    groups = role.edge_groups(clients, round)
    for edge_id, members in groups:
        down = rc.configure(state, edge_id, round)
        rc.comm.send("edge-cloud", "down", down)
        edge = role.edge_init(down, edge_id, members, round)
        for iteration in range(role.edge_iterations()):
            requests = []
            for client_id in members:
                message = role.edge_configure(edge, client_id, round, iteration)
                rc.comm.send("device-edge", "down", message)
                requests.append((client_id, message))
            replies = []
            for client_id, reply in rc.client_updates(round, requests):
                rc.comm.send("device-edge", "up", reply)
                replies.append(Reply(client_id, reply))
            edge = role.edge_aggregate(edge, round, replies)
        up = role.edge_report(edge)
        rc.comm.send("edge-cloud", "up", up)
        reports.append(Reply(edge_id, up))
    return _with_groups(rc.algorithm.aggregate(state, round, reports), groups)


ROUND_RUNNERS: dict[str, RoundRunner] = {
    "star": star_round,
    "ring": ring_round,
    "edge-ring": edge_ring_round,
    "edge-star": edge_star_round,
}
