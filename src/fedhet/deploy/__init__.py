"""fedhet on Flower: the same algorithms across real processes and machines.

This package is the only part of fedhet that imports `flwr` (install with
`pip install fedhet[flower]`). It holds a Flower `ServerApp` (`server_app.app`) and
`ClientApp` (`client_app.app`) that run any registered algorithm through its message contract
(`fedhet.algorithms.base`), the lossless conversion between fedhet and Flower messages
(`records`), the generated Flower App project (`project`) and a localhost launcher (`launch`).
See docs/deploy.md.
"""

from __future__ import annotations

from fedhet.errors import FedhetError

__all__ = ["FLOWER_VERSION", "require_flower"]

FLOWER_VERSION = "1.41.0"
"""The Flower release this package is written against (the `flower` extra pins it)."""


def require_flower() -> None:
    """Raise a clear `FedhetError` when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise FedhetError(
            "Flower is not installed; install it with `pip install fedhet[flower]` "
            f"(flwr=={FLOWER_VERSION})"
        ) from None
