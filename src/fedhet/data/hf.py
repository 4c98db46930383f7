"""A `Dataset` from a Hugging Face `datasets.Dataset` or `DatasetDict` (the `hf` extra).

The `datasets` package is imported only when `from_huggingface` runs, so the core imports
without it. Columns become features as they are: scalar columns are stacked side by side, one
array column (a vector, an image) keeps its shape; images (`datasets.Image`) come out as
`(n, C, H, W)` in [0, 1], as from an image folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedhet.data.arrays import from_arrays
from fedhet.data.base import Dataset
from fedhet.errors import FedhetError


def require_datasets() -> Any:
    """The `datasets` module, or one line saying how to install it."""
    try:
        import datasets  # optional extra: fedhet[hf]
    except ImportError:
        raise FedhetError(
            "from_huggingface needs the datasets package; pip install 'fedhet[hf]'"
        ) from None
    return datasets


def _splits(ds: Any, datasets: Any) -> tuple[Any, Any | None]:
    """`(train, test or None)` from a `Dataset` or a `DatasetDict` with a `train` split."""
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise FedhetError(
                f"the DatasetDict has no 'train' split (it has {', '.join(ds)}); pass "
                "DatasetDict({'train': ..., 'test': ...}) or one split"
            )
        return ds["train"], ds.get("test")
    if isinstance(ds, datasets.Dataset):
        return ds, None
    raise FedhetError(
        f"from_huggingface takes a datasets.Dataset or DatasetDict, not {type(ds).__name__}; "
        "use from_arrays for arrays"
    )


def _column(split: Any, name: str, datasets: Any) -> np.ndarray:
    """One column as a NumPy array; an image column as float `(n, C, H, W)` in [0, 1]."""
    if name not in split.column_names:
        raise FedhetError(
            f"the dataset has no column {name!r} (columns: {', '.join(split.column_names)}); "
            "name an existing column"
        )
    arr = np.asarray(split.with_format("numpy", columns=[name])[:][name])
    if arr.dtype == object:
        raise FedhetError(
            f"column {name!r} holds values of different shapes; give every sample the same shape "
            "(resize images first, e.g. with dataset.map)"
        )
    if isinstance(split.features[name], datasets.Image):
        arr = arr[:, None] if arr.ndim == 3 else arr.transpose(0, 3, 1, 2)
        arr = arr.astype(np.float32) / 255.0
    return arr


def _features(split: Any, names: Sequence[str], datasets: Any) -> np.ndarray:
    """The feature columns: one column as it is, several flattened and stacked side by side."""
    columns = [_column(split, n, datasets) for n in names]
    if len(columns) == 1:
        return columns[0]
    return np.concatenate([c.reshape(len(c), -1) for c in columns], axis=1)


def from_huggingface(
    ds: Any, *, features: Sequence[str] | None = None, label: str = "label",
    client: str | None = None, name: str = "huggingface", test_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """A `Dataset` from a Hugging Face dataset: its `train` and `test` splits (or one split,
    with a stratified `test_fraction` held out), the `label` column as the classes, the
    `features` columns (default: every other column) as the input, and the `client` column, if
    given, as each sample's client id (the `natural` partition). A `ClassLabel` column keeps its
    class count and names (`meta["classes"]`)."""
    datasets = require_datasets()
    train, test = _splits(ds, datasets)
    label_feature = train.features.get(label)
    if label_feature is None:
        raise FedhetError(
            f"the dataset has no column {label!r} (columns: {', '.join(train.column_names)}); "
            "pass label=COLUMN"
        )
    names = list(features) if features is not None else [
        c for c in train.column_names if c not in (label, client)
    ]
    if not names:
        raise FedhetError(f"the dataset has no feature columns besides {label!r}; pass features=[...]")
    class_label = isinstance(label_feature, datasets.ClassLabel)
    data = from_arrays(
        _features(train, names, datasets), _column(train, label, datasets),
        None if test is None else _features(test, names, datasets),
        None if test is None else _column(test, label, datasets),
        name=name, client_ids=None if client is None else _column(train, client, datasets),
        num_classes=label_feature.num_classes if class_label else None,
        test_fraction=test_fraction, seed=seed,
    )
    if class_label:
        data.meta["classes"] = list(label_feature.names)
    return data
