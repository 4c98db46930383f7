"""The Flower `ClientApp`: one SuperNode is one fedhet client.

The node reads its client id from its node config (`partition-id`), builds the clients' half of
the run from the run config (`fedhet.engine.assembly.assemble_clients`: the same settings the
server resolves; no evaluator, no round loop), re-runs the deterministic partitioner on its own
copy of the dataset and keeps only its partition: no training data crosses the network. Each
`train` message carries the algorithm's downlink message; the node runs it through the run's
executor (over its `ClientHost`: the very code the in-process simulator runs, with the same
random streams), keeps the algorithm's client state (SCAFFOLD's `c_i`, …) in the node's
`Context.state` between rounds and replies with the uplink message. A `query` message asks the
node who it is, so the server can map client ids to nodes and check that both sides hold the
same partition.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedhet import plugins
from fedhet.algorithms import Message as FedMessage
from fedhet.deploy.records import STATE, from_record, pack_state, to_record, unpack_state
from fedhet.engine import ClientFailure, ClientSide, assemble_clients, config_of
from fedhet.errors import FedhetError

SETTINGS_KEY = "fedhet-settings"
PARTITION_KEY = "partition-id"
DATA_DIR_KEY = "data-dir"

app = ClientApp()

_worlds: dict[str, ClientSide] = {}
"""Each run's clients' half, by its settings: built once per process (and, under
`fedhet.deploy.worker`, once per SuperNode: forked task processes inherit it)."""

announce: Callable[[dict[str, Any]], Any] | None = None
"""Set by `fedhet.deploy.worker` in a task process: told the settings of a world built here,
so that the warm parent can build it too."""


def build_world(settings: dict[str, Any]) -> ClientSide:
    """The clients' half of the run of these settings, from the cache or built (and
    announced) now."""

    key = json.dumps(settings, sort_keys=True)
    if key not in _worlds:
        plugins.ensure_recorded(settings, "the Flower run config")
        cfg = config_of(settings, "run config")
        _worlds[key] = assemble_clients(cfg, log=lambda _: None)
        if announce is not None:
            announce(settings)
    return _worlds[key]


def node_world(context: Context) -> ClientSide:
    """The node's view of the run: data, its partition, model and algorithm (cached per process)."""
    raw = context.run_config.get(SETTINGS_KEY)
    if not isinstance(raw, str):
        raise FedhetError(f"run config has no {SETTINGS_KEY!r}; start the run with `fedhet deploy`")
    settings = json.loads(raw)
    if DATA_DIR_KEY in context.node_config:
        settings["data_dir"] = str(context.node_config[DATA_DIR_KEY])
    return build_world(settings)


def node_client_id(context: Context, world: ClientSide) -> int:
    if PARTITION_KEY not in context.node_config:
        raise FedhetError(
            "this SuperNode has no partition-id; start it with --node-config 'partition-id=<i>'"
        )
    client_id = int(context.node_config[PARTITION_KEY])
    if not 0 <= client_id < world.run_info.num_clients:
        raise FedhetError(
            f"partition-id {client_id} is out of range: the run has "
            f"{world.run_info.num_clients} clients (ids 0..{world.run_info.num_clients - 1})"
        )
    return client_id


def fingerprint(indices: Any) -> str:
    """A short hash of a client's sample indices (the server checks it against its own)."""
    return hashlib.sha256(indices.numpy().tobytes()).hexdigest()[:16]


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """Who this node is: its client id, sample count and partition fingerprint."""

    world = node_world(context)
    client_id = node_client_id(context, world)
    indices = world.client_indices[client_id]
    info = FedMessage(scalars={
        "client_id": client_id, "num_samples": len(indices), "fingerprint": fingerprint(indices),
    })
    return Message(to_record(info), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One client update: downlink in, `algorithm.client_update` on local data, uplink out."""
    world = node_world(context)
    client_id = node_client_id(context, world)
    down, meta = from_record(msg.content)
    if int(meta["client_id"]) != client_id:
        raise FedhetError(
            f"message for client {meta['client_id']} reached the node of client {client_id}"
        )
    host = world.clients
    if STATE in context.state:
        host.hold_only(
            client_id, unpack_state(context.state.config_records[STATE], world.algorithm, client_id)
        )
    else:
        host.hold_only(client_id)
    round = int(meta["round"])
    ((_, up),) = world.executor.run(round, [(client_id, down)])
    host.take_buffers()  # the server averages what the reply carries
    if isinstance(up, ClientFailure):
        raise FedhetError(f"client {client_id} failed in {up.when}: {up.error}")
    context.state[STATE] = pack_state(host.states[client_id])
    return Message(to_record(up, client_id=client_id), reply_to=msg)

