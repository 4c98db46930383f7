"""Typed algorithm states and their plain records (docs/design.md "The algorithm contract").

Every algorithm keeps its server state in a frozen dataclass derived from `ServerState` (the
model `w` plus its own fields: FedAvgM's `d`, SCAFFOLD's `c`, …) and, when its clients keep
something between rounds, their state in a dataclass derived from `ClientState` (SCAFFOLD's
`c_i`, MOON's previous local model, GraB's order, …); an algorithm without client state uses
`None`. `aggregate` returns a new server state (`dataclasses.replace`), never changing the one
it was given.

Checkpoints and Flower's `Context.state` hold a state as its *record*: the plain dict of its
fields (`Record.to_record`), which `torch.load(weights_only=True)` reads without allowing any
class, so a checkpoint still cannot run code and does not depend on where a class lives or what
it is called. `Record.from_record` builds the state back from such a dict. The record's keys
are the field names, which are also the keys of the untyped dicts that checkpoints of untyped
states hold, so such a checkpoint reads as records; its values that are not dicts (SCAFFOLD's
and MOON's client state as a bare tensor) come back through `from_legacy`, and a renamed field
through `RENAMED`.

The engine reaches states only through the functions at the end of this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, fields, replace
from typing import Any, ClassVar, Protocol, Self

import numpy as np
import torch

from fedhet.errors import FedhetError

BUFFERS = "_buffers"
"""Message tensor with the model's BatchNorm running statistics (flattened). The engine adds it
to every downlink and every reply of a model that has them. An algorithm that aggregates them
itself (the hierarchical ones: at the edge, as the model) returns the new statistics in its
state's `buffers`; otherwise the engine averages the round's replies with the run's weights
(`Simulation._average_buffers`). Untyped server states of older checkpoints used this key."""

PLAIN = (torch.Tensor, np.ndarray, np.generic, bool, int, float, str, type(None))
"""Leaf values a record may hold: what `weights_only` loading reads (with `store.SAFE_GLOBALS`)."""


def check_plain(value: Any, where: str) -> None:
    """Raise unless `value` is made of `PLAIN` leaves in lists, tuples and dicts (str or int keys)."""
    if isinstance(value, PLAIN):
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_plain(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str | int):
                raise FedhetError(f"{where} has a {type(k).__name__} key; use str or int keys")
            check_plain(v, f"{where}[{k!r}]")
        return
    raise FedhetError(
        f"{where} is a {type(value).__name__}; a state field holds tensors, numbers, strings, "
        "None, or lists and dicts of them, so that a checkpoint can be loaded without running code"
    )


class Record:
    """A state dataclass ↔ the plain dict of its fields (its record)."""

    RENAMED: ClassVar[dict[str, str]] = {}
    """Keys of older records → the fields they became."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    """Declared, not set: every state class derived from `Record` is a dataclass, which sets it
    (so that `dataclasses.fields` accepts a `Record`)."""

    def to_record(self) -> dict[str, Any]:
        """`{field: value}` for every field; the values are checked to be plain (`PLAIN`)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            check_plain(value, f"{type(self).__name__}.{f.name}")
            out[f.name] = value
        return out

    @classmethod
    def from_record(cls, record: Any) -> Self:
        """The state whose `to_record` is `record`; fields a record lacks take their defaults,
        keys the class does not know are refused. A non-dict goes to `from_legacy`."""
        if not isinstance(record, Mapping):
            return cls.from_legacy(record)
        known = {f.name: f for f in fields(cls)}
        named: Mapping[str, Any] = record  # a record's keys are its fields' names
        values = {cls.RENAMED.get(k, k): v for k, v in named.items()}
        unknown = sorted(set(values) - set(known))
        missing = sorted(
            n for n, f in known.items()
            if n not in values and f.default is MISSING and f.default_factory is MISSING
        )
        if unknown or missing:
            what = [f"unknown {unknown}"] * bool(unknown) + [f"missing {missing}"] * bool(missing)
            raise FedhetError(
                f"a saved {cls.__name__} does not match the algorithm's state ({'; '.join(what)}); "
                "was it saved by another algorithm?"
            )
        return cls(**values)

    @classmethod
    def from_legacy(cls, value: Any) -> Self:
        """A state from a record that is not a dict (an older format); none by default."""
        raise FedhetError(f"a saved {cls.__name__} is a {type(value).__name__}, not a record of fields")


@dataclass(frozen=True, kw_only=True, eq=False)
class ServerState(Record):
    """What the server keeps between rounds: the global model and, in subclasses, the
    algorithm's own fields. Frozen: `aggregate` builds the next one (`dataclasses.replace`)."""

    w: torch.Tensor
    """The global model `w_k` (SCAFFOLD's `x`), a flat float32 vector."""
    buffers: torch.Tensor | None = None
    """BatchNorm running statistics (flattened) that the algorithm aggregated itself (the
    hierarchical ones, at the edges as the model); the engine takes them out of the state after
    the round (`take_buffers`) and sends them with every downlink. None: the engine averages the
    clients' statistics itself (`Simulation._average_buffers`)."""

    RENAMED: ClassVar[dict[str, str]] = {BUFFERS: "buffers"}


@dataclass(kw_only=True, eq=False)
class ClientState(Record):
    """What one client keeps between rounds, on the client (checkpointed by the engine, kept in
    the node's `Context.state` under Flower). Mutable: a client may update it in place."""


# -- what the engine calls --------------------------------------------------------------------
class HasStates(Protocol):
    """What the functions below need of an algorithm (`fedhet.algorithms.base.Algorithm` has
    it): its state classes and their first values. Declared here, below `base`, so that this
    module imports nothing above it."""

    name: ClassVar[str]
    state_class: ClassVar[type[ServerState]]
    client_state_class: ClassVar[type[ClientState] | None]

    def init(self, w0: torch.Tensor) -> ServerState: ...

    def client_init(self, client_id: int) -> ClientState | None: ...


def initial_state(algorithm: HasStates, w0: torch.Tensor) -> ServerState:
    """`algorithm.init(w0)`, checked to be the algorithm's `state_class`."""
    state = algorithm.init(w0)
    check_server_state(algorithm, state, "init")
    return state


def check_server_state(algorithm: HasStates, state: Any, where: str) -> None:
    cls = algorithm.state_class
    if not isinstance(state, cls):
        raise FedhetError(
            f"algorithm {algorithm.name or type(algorithm).__name__}: {where} returned a "
            f"{type(state).__name__}, not its state class {cls.__name__} "
            "(a ServerState dataclass, fedhet.algorithms.state)"
        )


def state_record(state: ServerState) -> dict[str, Any]:
    """The server state as a checkpoint holds it."""
    return state.to_record()


def restore_state(algorithm: HasStates, record: Any) -> ServerState:
    """The server state of a checkpoint: a record, or the untyped dict of older checkpoints."""
    return algorithm.state_class.from_record(record)


def client_record(state: ClientState | None) -> Any:
    """One client's state as a checkpoint or Flower's `Context.state` holds it."""
    if state is not None and not isinstance(state, ClientState):
        raise FedhetError(
            f"a client state is a {type(state).__name__}; client_update returns a ClientState "
            "dataclass (fedhet.algorithms.state) or None"
        )
    return None if state is None else state.to_record()


def restore_client(algorithm: HasStates, record: Any, client_id: int) -> ClientState | None:
    """One client's state from its record (or the raw value an older checkpoint holds). `None`
    is the state before the client's first round: `client_init`."""
    if record is None:
        return algorithm.client_init(client_id)
    cls = algorithm.client_state_class
    if cls is None:
        raise FedhetError(
            f"algorithm {algorithm.name}: a saved client state ({type(record).__name__}) for an "
            "algorithm whose clients keep none; was it saved by another algorithm?"
        )
    return cls.from_record(record)


def on_device(record: Any, device: torch.device | str) -> Any:
    """`record` (a checkpoint, or a state's record: tensors inside dicts, lists and tuples) with
    every tensor moved to `device`: a run resumed on another device than the one that saved it
    (a CPU checkpoint continued on a GPU, or the reverse) computes with its state where its
    model is. Everything else is returned as it is."""
    if isinstance(record, torch.Tensor):
        return record.to(device)
    if isinstance(record, Mapping):
        return {k: on_device(v, device) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return type(record)(on_device(v, device) for v in record)
    return record


def client_records(states: Mapping[int, ClientState | None]) -> dict[int, Any]:
    return {i: client_record(s) for i, s in states.items()}


def restore_clients(algorithm: HasStates, records: Mapping[int, Any]) -> dict[int, ClientState | None]:
    return {int(i): restore_client(algorithm, r, int(i)) for i, r in records.items()}


def take_buffers(state: ServerState) -> tuple[ServerState, torch.Tensor | None]:
    """`(state without buffers, the buffers)` (`ServerState.buffers`)."""
    if state.buffers is None:
        return state, None
    return replace(state, buffers=None), state.buffers


def ring_holder(state: ServerState) -> int | None:
    """The device that holds the model after a ring round (`RingState.holder`), None before
    the first round or for a state without one."""
    return getattr(state, "holder", None)


__all__ = [
    "BUFFERS",
    "ClientState",
    "HasStates",
    "Record",
    "ServerState",
    "check_plain",
    "check_server_state",
    "client_record",
    "client_records",
    "initial_state",
    "on_device",
    "restore_client",
    "restore_clients",
    "restore_state",
    "ring_holder",
    "state_record",
    "take_buffers",
]
