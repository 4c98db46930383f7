"""fedhet.algorithms: every algorithm registers itself in `ALGORITHMS` (base.py) when its module
is imported, and importing this package imports every module in it. A new algorithm is a new
module here; a user's own is registered with `ALGORITHMS.register` in their code.

What it offers the layers above (runs, reports, papers, deploy, the CLI) is the list below; every other
name in the package is internal to it (tests/test_architecture.py).
"""

from fedhet.algorithms.base import ALGORITHMS, Algorithm, ClientState, Message, Reply, ServerState
from fedhet.algorithms.state import client_record, restore_client
from fedhet.registry import import_all

import_all(__name__, __path__)

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
