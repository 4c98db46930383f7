"""Communication cost to reach a target accuracy (FedSR Table III) from a run's `metrics.csv`.

FedSR Table III counts model transfers ("M" = the traffic of one model) until the global model
first reaches a target test accuracy. The engine's `CommLedger` writes, per round, the running
totals `cum_model_transfers` and `cum_bytes`, and per link kind `cum_<link>_transfers` and
`cum_<link>_bytes` (links `device_cloud`, `device_edge`, `edge_cloud`, `device_device`), so the
cost is read off the first evaluated row at or above the target. `links` restricts the count to
some link kinds (e.g. only the links that touch the cloud).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedhet.engine import LINKS
from fedhet.rundir import read_metrics

LINK_KEYS = tuple(link.replace("-", "_") for link in LINKS)


def transfers_to_target(
    metrics: Path | str | Iterable[dict[str, Any]], target: float,
    links: Sequence[str] | None = None, metric: str = "test_accuracy",
) -> dict[str, float] | None:
    """`{"round", "transfers", "bytes"}` when `metric` first reaches `target`; None if never.

    `target` is a fraction (0.9 for 90 %). Transfers and bytes are cumulative up to and
    including that round, over all link kinds or over `links` (`"device-edge"` or
    `"device_edge"` spellings both work).
    """
    rows = read_metrics(metrics) if isinstance(metrics, str | Path) else list(metrics)
    keys = None if links is None else [link.replace("-", "_") for link in links]
    for key in keys or ():
        if key not in LINK_KEYS:
            raise ValueError(f"unknown link {key!r}; links are {', '.join(LINK_KEYS)}")
    for row in rows:
        value = float(row.get(metric, math.nan))
        if math.isnan(value) or value < target:
            continue
        if keys is None:
            transfers = row.get("cum_model_transfers", 0.0)
            nbytes = row.get("cum_bytes", 0.0)
        else:
            transfers = sum(_num(row.get(f"cum_{k}_transfers")) for k in keys)
            nbytes = sum(_num(row.get(f"cum_{k}_bytes")) for k in keys)
        return {"round": float(row["round"]), "transfers": _num(transfers), "bytes": _num(nbytes)}
    return None


def _num(value: Any) -> float:
    if value is None:
        return 0.0
    value = float(value)
    return 0.0 if math.isnan(value) else value
