"""A `Dataset` from the user's own arrays: the one door every own-data loader goes through.

`from_arrays` takes NumPy arrays, torch tensors or nested lists, checks them (one `FedhetError`
line for each problem, naming the array and the fix), and returns the tensors the engine works
on: float32 features `(n, *feature_shape)` and int64 labels in `[0, C)`. Labels that are not
already `0..C-1` (arbitrary integers, strings) are numbered in sorted order and the original
values kept in `meta["classes"]`. Optional `client_ids` (the user or device of each training
sample) become the dataset's `natural_partition`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from fedhet.data.base import Dataset
from fedhet.errors import FedhetError


def _numpy(value: Any) -> np.ndarray:
    """`value` (a tensor, an array, a list) as a NumPy array, without copying when it can."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except ValueError:  # a ragged nested list
        return np.asarray(value, dtype=object)


def features(x: Any, what: str) -> np.ndarray:
    """Features `x` as float32 `(n, *feature_shape)` (a 1-D `x` is one feature per sample),
    refusing an empty set, non-numeric values and NaN or infinite ones."""
    arr = _numpy(x)
    if arr.ndim == 0:
        raise FedhetError(f"{what} is a single value; give one row of features per sample")
    if len(arr) == 0:
        raise FedhetError(f"{what} is empty; give at least one sample")
    if arr.dtype.kind not in "biuf":
        raise FedhetError(
            f"{what} is not numeric (dtype {arr.dtype}); give numbers (encode text or categories "
            "as numbers, and give every sample the same feature shape)"
        )
    arr = arr.astype(np.float32, copy=False)
    if arr.ndim == 1:
        arr = arr[:, None]
    bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)
    if bad.any():
        raise FedhetError(
            f"{what} has a NaN or infinite value (sample {int(np.flatnonzero(bad)[0])}); "
            "remove those samples or fill the missing values in"
        )
    return arr


def labels(y: Any, what: str) -> np.ndarray:
    """Labels `y` as a 1-D array of integers or strings; whole floats (`2.0`) count as integers."""
    arr = _numpy(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise FedhetError(
            f"{what} has shape {tuple(arr.shape)}; give one class label per sample (a 1-D array, "
            "not one-hot rows)"
        )
    if len(arr) == 0:
        raise FedhetError(f"{what} is empty; give at least one sample")
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        whole = np.isfinite(arr) & (arr == np.round(arr))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise FedhetError(
                f"{what}[{i}] is {arr[i]}, not a class; labels are integers or strings (one class "
                "per sample, not a regression target)"
            )
        return arr.astype(np.int64)
    if arr.dtype.kind in "US":
        return arr.astype(str)
    if arr.dtype.kind == "O" and all(isinstance(v, str) for v in arr):
        return arr.astype(str)
    raise FedhetError(
        f"{what} holds {arr.dtype} values; labels are integers or strings (one class per sample)"
    )


def _sorted_unique(values: Sequence[Hashable]) -> list[Any]:
    """The distinct values in sorted order; values of types that do not compare (`1` and `"a"`)
    are sorted by type name, then value."""
    distinct = list(dict.fromkeys(values))
    try:
        return sorted(distinct)
    except TypeError:
        return sorted(distinct, key=lambda v: (type(v).__name__, repr(v)))


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it stands for (JSON-able, prints without `np.`)."""
    return value.item() if isinstance(value, np.generic) else value


def class_ids(
    y_train: np.ndarray, y_test: np.ndarray, num_classes: int | None
) -> tuple[np.ndarray, np.ndarray, int, list[Any]]:
    """Labels numbered `0..C-1`: `(train ids, test ids, C, classes)`, `classes[k]` the original
    value of class k.

    Integer labels that already lie in `[0, num_classes)` (or are exactly `0..max` when
    `num_classes` is not given) are kept; other labels are numbered in sorted order of their
    values, over train and test together."""
    if y_train.dtype.kind != y_test.dtype.kind:
        raise FedhetError(
            f"y_train holds {'strings' if y_train.dtype.kind == 'U' else 'integers'} but y_test "
            f"holds {'strings' if y_test.dtype.kind == 'U' else 'integers'}; give both the same kind"
        )
    both = np.concatenate([y_train, y_test])
    classes = np.unique(both)
    numeric = both.dtype.kind == "i"
    if num_classes is not None:
        if num_classes < 1:
            raise FedhetError(f"num_classes must be ≥ 1, got {num_classes}")
        if numeric and (classes.min() < 0 or classes.max() >= num_classes):
            bad = int(classes.min() if classes.min() < 0 else classes.max())
            raise FedhetError(
                f"label {bad} lies outside [0, num_classes={num_classes}); give labels 0..{num_classes - 1}, "
                "or leave num_classes out to number the labels found"
            )
        if numeric:
            return y_train, y_test, num_classes, list(range(num_classes))
        if len(classes) > num_classes:
            raise FedhetError(
                f"the labels hold {len(classes)} classes but num_classes={num_classes}; raise "
                "num_classes or leave it out"
            )
    elif numeric and classes[0] == 0 and classes[-1] == len(classes) - 1:
        return y_train, y_test, len(classes), list(range(len(classes)))
    ids_train = np.searchsorted(classes, y_train).astype(np.int64)
    ids_test = np.searchsorted(classes, y_test).astype(np.int64)
    c = num_classes if num_classes is not None else len(classes)
    return ids_train, ids_test, c, [_plain(v) for v in classes]


def stratified_holdout(
    y: np.ndarray, fraction: float, seed: int, owner: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`(train, test)` sorted indices: `round(fraction · n_c)` random samples of each class c held
    out, fixed by `seed`. With `owner` (each sample's client number), a client whose every sample
    was held out gets its first one back, so each client keeps a training sample."""
    if not 0.0 < fraction < 1.0:
        raise FedhetError(
            f"test_fraction must lie strictly between 0 and 1, got {fraction}; or give a test set"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7E57]))
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: int(round(fraction * len(idx)))]] = True
    if owner is not None:
        kept = np.bincount(owner[~test], minlength=int(owner.max()) + 1)
        _, first = np.unique(owner, return_index=True)
        test[first[kept == 0]] = False
    if not test.any():
        raise FedhetError(
            f"test_fraction={fraction:g} of {len(y)} samples holds out no test sample; raise "
            "test_fraction or give a test set"
        )
    if test.all():
        raise FedhetError(
            f"test_fraction={fraction:g} leaves no training sample; lower it or give a test set"
        )
    return np.flatnonzero(~test), np.flatnonzero(test)


def client_numbers(ids: Sequence[Hashable]) -> tuple[list[Any], np.ndarray]:
    """`(the distinct ids in sorted order, each sample's position in that list)`."""
    order = _sorted_unique(ids)
    number = {k: i for i, k in enumerate(order)}
    return order, np.fromiter((number[k] for k in ids), dtype=np.int64, count=len(ids))


def groups(owner: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The sorted sample indices of each group `0..n_groups-1`, given each sample's group."""
    by_group = np.argsort(owner, kind="stable")
    return np.split(by_group, np.cumsum(np.bincount(owner, minlength=n_groups))[:-1])


def _client_list(client_ids: Any, n: int) -> list[Hashable]:
    """`client_ids` as a list of `n` hashable Python values."""
    if isinstance(client_ids, torch.Tensor | np.ndarray):
        arr = _numpy(client_ids)
        if arr.ndim != 1:
            raise FedhetError(
                f"client_ids has shape {tuple(arr.shape)}; give one id per training sample"
            )
        client_ids = arr
    ids = [_plain(v) for v in client_ids]
    if len(ids) != n:
        raise FedhetError(
            f"client_ids has {len(ids)} entries but there are {n} training samples; give one "
            "client id per training sample"
        )
    for i, v in enumerate(ids):
        if not isinstance(v, Hashable) or (isinstance(v, float) and v != v):
            raise FedhetError(
                f"client_ids[{i}] is {v!r}; a client id is a number or a string (NaN is none)"
            )
    return ids


def from_arrays(
    x_train: Any, y_train: Any, x_test: Any = None, y_test: Any = None, *,
    name: str = "arrays", client_ids: Any = None, num_classes: int | None = None,
    test_fraction: float = 0.2, seed: int = 0,
) -> Dataset:
    """A `Dataset` from in-memory arrays (NumPy, torch or lists).

    Without `x_test`/`y_test`, a stratified `test_fraction` of the training samples is held
    out (`stratified_holdout`, fixed by `seed`). `client_ids` gives each training sample's
    client (any hashable id); the `natural` partition then makes each distinct id, in sorted
    order, one client, and `meta["client_ids"]` lists them. `num_classes` keeps integer labels
    as they are with that many classes (some may be absent); without it labels are numbered
    `0..C-1` in sorted order (`class_ids`).
    """
    x_tr, y_tr = features(x_train, "x_train"), labels(y_train, "y_train")
    if len(x_tr) != len(y_tr):
        raise FedhetError(
            f"x_train has {len(x_tr)} samples but y_train has {len(y_tr)} labels; give one label "
            "per sample"
        )
    ids, owner = None, None
    if client_ids is not None:
        ids, owner = client_numbers(_client_list(client_ids, len(y_tr)))
    if (x_test is None) != (y_test is None):
        raise FedhetError(
            "give both x_test and y_test, or neither (a test_fraction of the training set is then "
            "held out)"
        )
    if x_test is None:
        keep, held = stratified_holdout(y_tr, test_fraction, seed, owner)
        x_tr, x_te, y_tr, y_te = x_tr[keep], x_tr[held], y_tr[keep], y_tr[held]
        owner = None if owner is None else owner[keep]
    else:
        x_te, y_te = features(x_test, "x_test"), labels(y_test, "y_test")
        if len(x_te) != len(y_te):
            raise FedhetError(
                f"x_test has {len(x_te)} samples but y_test has {len(y_te)} labels; give one label "
                "per sample"
            )
        if x_te.shape[1:] != x_tr.shape[1:]:
            raise FedhetError(
                f"x_train's samples have shape {tuple(x_tr.shape[1:])} but x_test's have "
                f"{tuple(x_te.shape[1:])}; give train and test the same features"
            )
    ids_tr, ids_te, c, classes = class_ids(y_tr, y_te, num_classes)
    meta: dict[str, Any] = {"classes": classes}
    parts = None
    if ids is not None and owner is not None:  # both set by `client_ids`, or neither
        meta["client_ids"], parts = ids, groups(owner, len(ids))
    return Dataset(
        name, torch.from_numpy(np.ascontiguousarray(x_tr)), torch.from_numpy(ids_tr),
        torch.from_numpy(np.ascontiguousarray(x_te)), torch.from_numpy(ids_te),
        num_classes=c, natural_partition=parts, meta=meta,
    )
