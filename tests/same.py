"""A test helper: deep equality of states, records and metrics, bit for bit."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fedhet.algorithms.state import Record


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal values, tensors equal in dtype and content, typed states equal in class and fields
    (NaN equals NaN)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, Record):
        assert_same(a.to_record(), b.to_record(), where)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, Mapping):  # a dict, or the clients' `ClientStateStore`
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), where
