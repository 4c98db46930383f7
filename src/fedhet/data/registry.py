"""The dataset registry: `DATASETS.get(name).factory(params, data_dir)` returns a `Dataset`.

Loaders register themselves on import of their module; `load_dataset` is the one entry point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from fedhet.data.base import Dataset
from fedhet.registry import Registry


class DatasetLoader(Protocol):
    def __call__(self, params: Any, data_dir: Path) -> Dataset: ...


DATASETS: Registry[DatasetLoader] = Registry("dataset")
"""Filled by the loader modules, which `fedhet.data` imports (so any import of this one does)."""


def load_dataset(name: str, params: Any, data_dir: Path | str) -> Dataset:
    """Load dataset `name` with validated `params`, reading files under `data_dir`."""
    return DATASETS.get(name).factory(params, Path(data_dir))

