"""What can go wrong with one client in one round, as values the round runners can act on.

An executor never lets one client's exception end the run: it yields `(client_id,
ClientFailure)` in place of the reply, and the round runner drops that client for the round
(partial participation, as FedAvg, FedNova and SCAFFOLD define it). Non-finite numbers are not
a client fault but a diverged run: `Diverged` stops the run, which is then marked `diverged`.

Code that raises is named by the frame that raised it in the user's own files (`blame`): a
failure line and a failed run's one error line say `file:line in function`, not a traceback.

Runs count rounds from 1; the algorithm's methods get the round's index from 0 (docs/library.md
"Round numbers"). A line about an error that came out of one of those methods names both
(`round_named`): `round 3 (round=2 in aggregate's arguments): …`.
"""

from __future__ import annotations

import sys
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path

from fedhet.errors import FedhetError, one_line

_FEDHET = str(Path(__file__).resolve().parents[1])
_LIBRARIES = tuple(
    {str(Path(p).resolve()) for k in ("stdlib", "platstdlib", "purelib", "platlib")
     if (p := sysconfig.get_paths().get(k))} | {str(Path(sys.prefix).resolve())}
)


def _library(filename: str) -> bool:
    """A frame of fedhet, of Python or of an installed package (torch, numpy), not the user's."""
    if filename.startswith("<"):  # <frozen ...>, <string>
        return True
    path = str(Path(filename).resolve())
    return path.startswith(_FEDHET) or path.startswith(_LIBRARIES)


def _shown(filename: str) -> str:
    """`filename` relative to the working directory when it lies below it, else absolute."""
    path = Path(filename).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


ROUND_ARGUMENT = {
    "configure": "round", "aggregate": "round", "note": "round", "client_update": "ctx.round",
    "edge_groups": "round", "edge_init": "round", "edge_configure": "round",
    "edge_aggregate": "round",
}
"""The algorithm's methods whose arguments carry the round's index, and the argument that does."""


def algorithm_call(error: BaseException) -> str:
    """The algorithm's method (`ROUND_ARGUMENT`) that the engine called and `error` came out of,
    or "" when it came out of none of them (a callback, a model, the engine, `eval_params`).

    That method is the outermost frame of the traceback run by an `Algorithm` (its `self`),
    named by its code: a subclass's own method, or one assigned to its class under that name."""
    # lazy: the algorithm kit (and torch) is only needed once an error is being reported
    from fedhet.algorithms.base import Algorithm

    for frame, _ in traceback.walk_tb(error.__traceback__):
        owner = frame.f_locals.get("self")
        if not isinstance(owner, Algorithm):
            continue
        if frame.f_code.co_name in ROUND_ARGUMENT:
            return frame.f_code.co_name
        for name in ROUND_ARGUMENT:
            if getattr(getattr(type(owner), name, None), "__code__", None) is frame.f_code:
                return name
        return ""
    return ""


def round_named(round: int, call: str = "") -> str:
    """Round index `round` as runs count it, `round {round + 1}`; when the error came out of
    the algorithm's method `call`, with the index that method got: `round 3 (round=2 in
    aggregate's arguments)`."""
    said = f"round {round + 1}"
    if call in ROUND_ARGUMENT:
        said += f" ({ROUND_ARGUMENT[call]}={round} in {call}'s arguments)"
    return said


def blame(error: BaseException) -> tuple[str, bool]:
    """Where `error` was raised, as `file:line in function`, and whether that is the user's code.

    The deepest frame outside fedhet, Python and installed packages is the user's (their
    algorithm, model or plugin); an error with no such frame is named by its deepest frame,
    fedhet's own or a library's, and reported as not the user's."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "", False
    mine = [f for f in frames if not _library(f.filename)]
    frame, user = (mine[-1], True) if mine else (frames[-1], False)
    return f"{_shown(frame.filename)}:{frame.lineno} in {frame.name}", user


@dataclass(frozen=True)
class ClientFailure:
    """A client that raised (or was otherwise lost) in a round; it is dropped for that round."""

    client_id: int
    round: int
    error: str
    """One line: the exception's type and message."""
    where: str = ""
    """`file:line in function` of the frame that raised it (`blame`), when known."""
    user: bool = False
    """Whether that frame is in the user's own code (`blame`), not fedhet's or a library's."""
    call: str = ""
    """The algorithm's method it came out of (`algorithm_call`), "" when none."""

    @classmethod
    def of(cls, client_id: int, round: int, error: BaseException) -> ClientFailure:
        """The failure of a client half that raised `error` (in this process or a worker)."""
        where, user = blame(error)
        return cls(client_id, round, one_line(error), where, user, algorithm_call(error))

    @property
    def when(self) -> str:
        """The round as a line names it (`round_named`)."""
        return round_named(self.round, self.call)


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


class UserCodeFailed(FedhetError):  # noqa: N818  (a run state, as Diverged)
    """Code called by the run raised (the algorithm's server half, a model's forward, a
    callback), or every client of a round failed: the run stops, is marked `failed` with the
    round, and resumes after the fix. Its message is the one error line the CLI prints; `call`
    is the algorithm's method the error came out of (`algorithm_call`), "" when none."""

    def __init__(self, round: int, error: str, where: str, user: bool, client: int | None = None,
                 call: str = ""):
        self.round, self.error, self.where, self.user, self.client = round, error, where, user, client
        self.call = call
        who = f"client {client}: " if client is not None else ""
        at = f"{where}: " if where else ""
        super().__init__(f"{round_named(round, call)}: {who}{at}{error}")

    def __reduce__(self):  # picklable, so a grid worker can report it
        return (type(self), (self.round, self.error, self.where, self.user, self.client, self.call))

    def record(self) -> dict[str, object]:
        """The summary's `failed` entry."""
        return {"round": self.round + 1, "error": self.error, "where": self.where,
                "client": self.client, "user_code": self.user}
