"""The algorithms layer (the algorithms and their registry) as the layers above see it.

`fedhet.experiments`, `fedhet.deploy` and `fedhet.cli` import this layer only from here, as a
user's code imports fedhet only from `fedhet/__init__.py`; every other name in
`fedhet.algorithms` is internal to it (tests/test_architecture.py).
"""

from fedhet.algorithms.base import ALGORITHMS, Algorithm, ClientState, Message, Reply, ServerState
from fedhet.algorithms.state import client_record, restore_client

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientState",
    "Message",
    "Reply",
    "ServerState",
    "client_record",
    "restore_client",
]
