"""A test helper: make one client of a simulation raise in its client half."""

from __future__ import annotations

from typing import Any


def make_client_fail(sim: Any, client_id: int, message: str) -> None:
    """From now on `sim`'s client `client_id` raises `RuntimeError(message)` in `client_update`."""
    inner = sim.side.algorithm.client_update

    def faulty(msg, ctx, state):
        if ctx.client_id == client_id:
            raise RuntimeError(message)
        return inner(msg, ctx, state)

    sim.side.algorithm.client_update = faulty
