"""Centralized SGD (docs/spec.md): all training data on one node, the same model, plain SGD.

The engine gives this algorithm one client holding every training sample. Each round runs the
configured number of steps (`local_steps`, or `⌊E·D/B⌋`), so `K` rounds of `τ_all / K` steps
reproduce FedVeca §IV-A1's reference run of `τ_all` iterations at batch `B`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from fedhet.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    Message,
    NoParams,
    Reply,
    ServerState,
)
from fedhet.algorithms.fedavg import local_sgd_update


@ALGORITHMS.register("central", NoParams, "centralized SGD on the pooled data (reference line)")
class Central(Algorithm[ServerState, None]):
    name = "central"
    centralized = True

    def client_update(self, message: Message, ctx: ClientContext, state: Any):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state: ServerState, round: int, replies: Iterable[Reply]):
        (reply,) = replies
        return replace(state, w=state.w + reply.message.tensors["delta"]), {
            "local_train_loss": reply.message.scalars["train_loss"]
        }
