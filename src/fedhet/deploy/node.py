"""`flower-supernode` with short waits, for federations on one machine.

Flower 1.41's SuperNode sleeps a fixed 3 s whenever the SuperLink has no message for it, and
0.5 s while it waits for a ClientApp's reply; a message's parts that are not yet there are
re-tried after 1 s, then 2 s, … (up to 10 s). On loopback those waits, not the training, set
the length of a round. `python -m fedhet.deploy.node ARGS` runs the unchanged
`flower-supernode ARGS` with the sleeps capped at `FEDHET_NODE_POLL_S` seconds (default 0.2)
and the object-pull back-off starting at 0.05 s (capped at 0.5 s): the SuperNode then asks
the SuperLink for work up to 5 times a second, which is cheap on 127.0.0.1 but is traffic you
may not want across a real network (use `flower-supernode` there). Its heartbeat interval is
`FEDHET_NODE_HEARTBEAT_S` (default 10 s, the least the SuperLink accepts, instead of 30 s):
the SuperLink takes a node that sent none for two intervals as offline and answers the
messages still waiting for it with `NODE_UNAVAILABLE`, so a dead SuperNode is a dropped
client within 20 s rather than 60 s. `fedhet deploy local`
uses it (and `fedhet.deploy.worker` applies the same back-off to its ClientApp tasks);
nothing else in Flower is changed.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType, SimpleNamespace

PULL_BACKOFF_S = (0.05, 0.5)
"""First and longest wait between tries to pull a message part that is not there yet."""


def shorten_pull_backoff() -> None:
    """Make Flower's object pulls in this process retry after 0.05 s instead of 1 s."""
    # optional extra: fedhet[flower]
    from flwr.supercore.inflatable import inflatable_utils

    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        defaults = fn.__kwdefaults__
        assert defaults is not None, "both take their back-off as keyword-only arguments"
        defaults["initial_backoff"], defaults["backoff_cap"] = PULL_BACKOFF_S


def _patch(module: ModuleType, name: str, value: object) -> None:
    """Set `module.name` to `value`, whose type is not the one the module declares for it (a
    float interval for an int constant, a stand-in for the `time` module): a patch of Flower's
    globals, which its types do not describe, hence `setattr`."""
    setattr(module, name, value)


def main() -> None:
    # optional extra: fedhet[flower]
    import flwr.supercore.heartbeat as heartbeat
    import flwr.supernode.fleet_http_connection as fleet
    import flwr.supernode.start_client_internal as internal
    from flwr.supernode.cli import flower_supernode

    cap = float(os.environ.get("FEDHET_NODE_POLL_S", "0.2"))
    # both modules read the interval through their module global (the sender and the value
    # sent to the SuperLink with each heartbeat)
    interval = float(os.environ.get("FEDHET_NODE_HEARTBEAT_S", "10"))
    for module in (heartbeat, fleet):
        _patch(module, "HEARTBEAT_DEFAULT_INTERVAL", interval)
    # `start_client_internal` calls `time.sleep` through its module global `time`
    shim = {k: getattr(time, k) for k in dir(time) if not k.startswith("_")}
    shim["sleep"] = lambda s: time.sleep(min(s, cap))
    _patch(internal, "time", SimpleNamespace(**shim))
    shorten_pull_backoff()
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
