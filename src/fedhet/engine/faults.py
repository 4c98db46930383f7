"""Simulated client faults: dropout, stragglers that miss the round's deadline, clients that raise.

What happens to a sampled client in a round is decided before any work starts, from random
streams fixed by `(seed, round, client, purpose)` (`stream_seed`), so a run with faults is
reproducible and a resumed run drops exactly the clients an uninterrupted one would:

- `client_dropout = p`: with probability `p` the client is offline for the round. It was sent
  the downlink (the server cannot know) but returns nothing and does no work.
- `straggler_fraction = f`: with probability `f` the client is slow this round and misses the
  deadline. Policy `straggler_policy = "drop"` **[choice]**: its late work is discarded, which is
  the standard partial-participation reading; the simulation does not run it at all, so its
  client state (SCAFFOLD's `c_i`, MOON's previous model) stays as it was, consistent with a
  server that never saw the update.
- a client whose update raises is isolated (`ClientFailure`), logged in one line and dropped for
  the rest of the round.

A dropped client is dropped from aggregation: every algorithm aggregates the replies that came
back, renormalising its weights over them (partial participation). A round where nobody returns
keeps the server state. See docs/faults.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhet.algorithms.base import Message
from fedhet.engine.config import ConfigFields
from fedhet.engine.failures import ClientFailure, Diverged
from fedhet.errors import FedhetError
from fedhet.training.local import stream_seed

DROPOUT_STREAM = 31
"""Random-stream purpose of the dropout draw (purposes 0–13 and 100·p are taken)."""
STRAGGLER_STREAM = 37
"""Random-stream purpose of the straggler draw."""

OK, DROPPED, LATE = "ok", "dropped", "late"


@dataclass(frozen=True)
class FaultModel(ConfigFields):
    """Which sampled clients drop out or miss the deadline in a round (module docstring)."""

    seed: int = 0
    client_dropout: float = 0.0
    straggler_fraction: float = 0.0
    straggler_policy: str = "drop"

    def outcome(self, client_id: int, round: int) -> str:
        """`ok`, `dropped` (offline) or `late` (missed the deadline) for one client and round.

        Each draw has its own stream, so raising one probability never changes which clients
        the other one picks."""
        if self.client_dropout and self._draw(client_id, round, DROPOUT_STREAM) < self.client_dropout:
            return DROPPED
        if self.straggler_fraction and (
            self._draw(client_id, round, STRAGGLER_STREAM) < self.straggler_fraction
        ):
            return LATE
        return OK

    def _draw(self, client_id: int, round: int, purpose: int) -> float:
        return float(stream_seed(self.seed, round, client_id, purpose).random())


NO_FAULTS = FaultModel()


@dataclass
class RoundTally:
    """Who took part in one round; `diagnostics()` gives the metric columns.

    A client counts once per round whatever the number of visits (ring passes, edge
    iterations): `returned` are the clients with at least one accepted reply that never failed.
    """

    sampled: set[int] = field(default_factory=set)
    dropped: set[int] = field(default_factory=set)
    late: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    returned: set[int] = field(default_factory=set)

    def admit(self, faults: FaultModel, client_id: int, round: int) -> bool:
        """Record a sampled client; False when the fault model drops it for the round."""
        self.sampled.add(client_id)
        outcome = faults.outcome(client_id, round)
        if outcome == DROPPED:
            self.dropped.add(client_id)
        elif outcome == LATE:
            self.late.add(client_id)
        return outcome == OK

    def diagnostics(self) -> dict[str, float]:
        return {
            "clients_sampled": float(len(self.sampled)),
            "clients_returned": float(len(self.returned - self.failed)),
            "clients_dropped": float(len(self.dropped) + len(self.late)),
            "clients_late": float(len(self.late)),
            "clients_failed": float(len(self.failed)),
        }


def failure_line(failure: ClientFailure) -> str:
    """The one log line of a client dropped for a round because it raised."""
    return (
        f"{failure.when}: client {failure.client_id} failed and is dropped for the "
        f"round: {failure.error}" + (f" ({failure.where})" if failure.where else "")
    )


def isolate(
    client_updates: Any, round: int, requests: Sequence[tuple[int, Message]]
) -> Iterator[tuple[int, Message | ClientFailure]]:
    """Run `client_updates(round, requests)` (an executor) so that one client's exception never
    ends the round: yields `(client_id, reply)` or `(client_id, ClientFailure)`.

    An executor that isolates failures itself yields `ClientFailure` items, passed through. One
    that lets an exception escape (the sequential executor) is taken to have failed on the
    first request it had not answered yet, in request order; the executor is restarted on the
    requests after it. A request the executor never answered is a failure too."""
    pending = list(requests)
    while pending:
        answered: set[int] = set()
        try:
            for client_id, reply in client_updates(round, pending):
                answered.add(client_id)
                yield client_id, reply
        except (Diverged, FedhetError):
            raise  # a diverged run or a bad setting is not one client's fault
        except Exception as exc:  # noqa: BLE001  (any other client error is isolated)
            rest = [(c, m) for c, m in pending if c not in answered]
            culprit = rest[0][0]
            yield culprit, ClientFailure.of(culprit, round, exc)
            pending = rest[1:]
            continue
        for client_id, _ in pending:
            if client_id not in answered:
                yield client_id, ClientFailure(client_id, round, "no reply from the executor")
        return


def check_finite(message: Message, round: int, client_id: int | None) -> None:
    """Raise `Diverged` when a reply carries a non-finite tensor or loss scalar."""
    for name, value in message.scalars.items():
        if "loss" in name and not math.isfinite(value):
            raise Diverged(round, name, client_id)
    for name, tensor in message.tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise Diverged(round, f"tensor {name!r}", client_id)


def first_and_rest(items: Iterable[Any]) -> tuple[Any, Iterator[Any]] | None:
    """Peek one item of a one-pass iterable: `(first, iterator over all items)` or None if empty."""
    it = iter(items)
    for first in it:
        return first, _chain(first, it)
    return None


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


__all__ = [
    "DROPPED",
    "FaultModel",
    "LATE",
    "NO_FAULTS",
    "OK",
    "RoundTally",
    "check_finite",
    "failure_line",
    "first_and_rest",
    "isolate",
]
