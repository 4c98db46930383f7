"""A finished or running run directory as Python values (`open_run`, `RunResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.rundir.store import read_config, read_metrics, read_summary


@dataclass
class RunResult:
    """A run directory as Python values: `dir`, `config` (`config.json`), `summary`
    (`summary.json`) and `metrics` (`metrics.csv` as one dict per evaluated round, numbers as
    floats, a missing cell as NaN)."""

    dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    metrics: list[dict[str, float]] = field(repr=False)

    @property
    def final_accuracy(self) -> float:
        """The last evaluated round's test accuracy (`summary["final_accuracy"]`)."""
        return float(self.summary.get("final_accuracy", math.nan))

    def to_pandas(self) -> Any:
        """The metrics as a `pandas.DataFrame`, one row per evaluated round (needs pandas)."""
        try:
            import pandas as pd  # optional: not a dependency of fedhet
        except ImportError:
            raise FedhetError("to_pandas needs pandas: pip install pandas") from None
        return pd.DataFrame(self.metrics)


def open_run(dir: str | Path) -> RunResult:
    """The run in `dir` as a `RunResult` (nothing is run or imported)."""
    path = Path(dir)
    if not (path / "config.json").is_file():
        raise FedhetError(f"{path} has no config.json: it is not a fedhet run directory")
    summary = read_summary(path) if (path / "summary.json").is_file() else {}
    return RunResult(path, read_config(path), summary, read_metrics(path, missing_ok=True))
