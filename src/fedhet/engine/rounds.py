"""Round runners: how one round's messages flow for a topology.

A runner is `(round_ctx, state, round, clients) -> (state, diagnostics)`. It calls the
algorithm's server half, hands each downlink message to `round_ctx.client_update` (which runs
the client half where the client's data lives) and records every message in `round_ctx.comm`.
The star runner is FedAvg's protocol; hierarchical and ring topologies add their own runners.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fedhet.algorithms.base import Algorithm, Message, Reply
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


RoundRunner = Callable[[RoundContext, dict[str, Any], int, Sequence[int]], tuple[dict, dict]]


def star_round(
    rc: RoundContext, state: dict[str, Any], round: int, clients: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cloud → each sampled device → cloud, then one aggregation."""
    replies = []
    for client_id in clients:
        down = rc.configure(state, client_id, round)
        rc.comm.send("device-cloud", "down", down)
        up = rc.client_update(client_id, down, round)
        rc.comm.send("device-cloud", "up", up)
        replies.append(Reply(client_id, up))
    return rc.algorithm.aggregate(state, round, replies)


ROUND_RUNNERS: dict[str, RoundRunner] = {"star": star_round}
