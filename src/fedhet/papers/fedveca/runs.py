"""Names and readers shared by FedVeca's comparison protocol and its plots (below both, so
neither imports the other)."""

from __future__ import annotations

from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.rundir import read_metric_rows

FEDVECA = "fedveca"
CENTRAL = "central"
LABELS = {FEDVECA: "FedVeca", CENTRAL: "Centralized SGD", "fedavg": "FedAvg", "fednova": "FedNova"}
"""Method directory name → legend label."""


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """`metrics.csv` as rows of floats (empty cells are NaN)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        raise FedhetError(f"{run_dir} has no metrics.csv; run it first")
    return read_metric_rows(path)
