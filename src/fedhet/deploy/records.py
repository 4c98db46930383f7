"""fedhet `Message` ↔ Flower `RecordDict`, lossless.

A fedhet message becomes three records: `fedhet.tensors` (an `ArrayRecord`, one numpy array
per tensor, dtype and shape kept), `fedhet.scalars` (a `ConfigRecord`; ints stay ints, floats
are IEEE doubles) and `fedhet.meta` (who and which round). Client state never travels: it is
packed into the node's own `Context.state` with `pack_state`, as its record (the plain dict of
its fields, `fedhet.algorithms.state`), as a checkpoint holds it.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, ConfigRecordValues, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedhet.algorithms import Algorithm, ClientState, Message, client_record, restore_client
from fedhet.errors import FedhetError
from fedhet.rundir import SAFE_GLOBALS

TENSORS = "fedhet.tensors"
SCALARS = "fedhet.scalars"
META = "fedhet.meta"
STATE = "fedhet.client-state"


def _scalar(name: str, value: Any) -> bool | int | float | str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, bool | int | float | str):
        raise FedhetError(f"message scalar {name!r} is a {type(value).__name__}; send it as a tensor")
    return value


def to_record(message: Message, **meta: int | float | str) -> RecordDict:
    """A fedhet message (plus `meta` such as client id and round) as a Flower `RecordDict`."""
    arrays = {
        name: Array(t.detach().cpu().contiguous().numpy())
        for name, t in message.tensors.items()
    }
    scalars: dict[str, ConfigRecordValues] = {
        name: _scalar(name, v) for name, v in message.scalars.items()
    }
    meta_values: dict[str, ConfigRecordValues] = dict(meta)
    return RecordDict({
        TENSORS: ArrayRecord(arrays), SCALARS: ConfigRecord(scalars), META: ConfigRecord(meta_values),
    })


def from_record(content: RecordDict) -> tuple[Message, dict[str, Any]]:
    """The fedhet message and its meta fields carried by `content`."""
    if TENSORS not in content or SCALARS not in content:
        raise FedhetError("received a Flower message that is not a fedhet message")
    tensors = {
        name: torch.from_numpy(np.array(arr.numpy(), copy=True))
        for name, arr in content.array_records[TENSORS].items()
    }
    scalars = dict(content.config_records[SCALARS].items())
    meta = dict(content.config_records[META].items()) if META in content else {}
    return Message(tensors, scalars), meta


def pack_state(state: ClientState | None) -> ConfigRecord:
    """A client's state (its record: a plain dict of tensors and numbers) for `Context.state`."""
    buf = io.BytesIO()
    torch.save(client_record(state), buf)
    return ConfigRecord({"state": buf.getvalue()})


def unpack_state(record: ConfigRecord, algorithm: Algorithm, client_id: int) -> ClientState | None:
    """The state `pack_state` stored, as `algorithm`'s client state. It never crosses the
    network, and is still unpickled with `weights_only` (tensors, containers and NumPy values
    only), as checkpoints are."""
    packed = record["state"]
    assert isinstance(packed, bytes), "pack_state stores the state as bytes"
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        plain = torch.load(io.BytesIO(packed), map_location="cpu", weights_only=True)
    return restore_client(algorithm, plain, client_id)


def wire_bytes(obj: Any) -> int:
    """Serialized size of a Flower message or record: every object of its tree, as Flower
    sends it (protobuf/HTTP framing not included)."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(obj).values())
