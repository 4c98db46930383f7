"""What can go wrong with one client in one round, as values the round runners can act on.

An executor never lets one client's exception end the run: it yields `(client_id,
ClientFailure)` in place of the reply, and the round runner drops that client for the round
(partial participation, as FedAvg, FedNova and SCAFFOLD define it). Non-finite numbers are not
a client fault but a diverged run: `Diverged` stops the run, which is then marked `diverged`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientFailure:
    """A client that raised (or was otherwise lost) in a round; it is dropped for that round."""

    client_id: int
    round: int
    error: str
    """One line: the exception's type and message."""


class Diverged(Exception):  # noqa: N818  (a run state, not an error in the program)
    """Non-finite loss, parameters or aggregate: the run stops and is marked `diverged`."""

    def __init__(self, round: int, what: str, client_id: int | None = None) -> None:
        self.round = round
        self.what = what
        self.client_id = client_id
        where = f" from client {client_id}" if client_id is not None else ""
        super().__init__(f"diverged in round {round + 1}: non-finite {what}{where}")

    def __reduce__(self):  # picklable, so a worker process can report it (engine/workers.py)
        return (type(self), (self.round, self.what, self.client_id))
