"""A package's surface: the names it offers, each imported from its module when first used.

A package's `__init__` lists its names by module and hands the list to `offered`:

    _SURFACE = {"execute": "single", "compare": "comparison"}
    __all__ = sorted(_SURFACE)
    __getattr__ = offered(__name__, _SURFACE)

so importing the package (or any module in it) loads nothing else, and `from package import
name` loads the one module that defines it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def offered(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: `names` maps each offered name to the module
    (relative to the package) that defines it; the value is kept on the package after its
    first use."""

    def lookup(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return lookup
