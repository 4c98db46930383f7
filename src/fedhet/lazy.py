"""A package whose names are imported on first use, written so that mypy, an IDE and a reader
see the real objects.

The package's `__init__` imports what it offers under `if TYPE_CHECKING:`, the one list every
tool reads, names it in `__all__`, and hands its own file to `attach` for the running program:

    from typing import TYPE_CHECKING

    from fedhet.lazy import attach

    if TYPE_CHECKING:
        from fedhet.runs.comparison import compare
        from fedhet.runs.single import execute

    __all__ = ["compare", "execute"]

    if not TYPE_CHECKING:
        __getattr__, __dir__ = attach(__name__, __file__)

The block never runs: `attach` reads its import lines from the file once, and the package's
`__getattr__` (PEP 562) imports a name's module when the name is first used and keeps the value
on the package. Importing the package therefore imports none of its modules; `from package
import name` imports the one module that defines `name`. A line of the block may be
`from M import N [as A]`, `import M as A` (a module) or `A = N.attr` (an attribute of a name
imported above it, e.g. a registry's `register`).

**[choice]** Only the packages a light process passes through use this (`fedhet`, whose import
must not import torch for `fedhet.rundir` and the CLI's `--help`; `fedhet.engine`,
`fedhet.runs` and `fedhet.reports`, whose CSV readers run without torch); every other package
imports its names plainly. lazy_loader (scipy, scikit-image) reads the same list from a `.pyi`
stub; keeping it in the `__init__` keeps a package's surface in one file.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any

Source = tuple[str, tuple[str, ...]]
"""Where a name comes from: a module, then the attributes to follow from it (none: the module)."""


def sources(init_file: str) -> dict[str, Source]:
    """`{name: (module, attributes)}` for each name the top-level `if TYPE_CHECKING:` block of
    `init_file` binds; any other statement in the block is refused (it could not load lazily)."""
    with open(init_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=init_file)
    found: dict[str, Source] = {}
    for block in tree.body:
        if not (isinstance(block, ast.If) and isinstance(block.test, ast.Name)
                and block.test.id == "TYPE_CHECKING"):
            continue
        for stmt in block.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                for alias in stmt.names:
                    found[alias.asname or alias.name] = (stmt.module, (alias.name,))
            elif isinstance(stmt, ast.Import) and all(a.asname for a in stmt.names):
                for alias in stmt.names:
                    found[str(alias.asname)] = (alias.name, ())
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  and isinstance(stmt.targets[0], ast.Name) and _chain(stmt.value)):
                base, *attrs = _chain(stmt.value)
                if base not in found:
                    raise ImportError(f"{init_file}:{stmt.lineno}: {base} is not imported above")
                module, path = found[base]
                found[stmt.targets[0].id] = (module, (*path, *attrs))
            else:
                raise ImportError(f"{init_file}:{stmt.lineno}: a lazy surface holds only "
                                  "`from M import N`, `import M as A` and `A = N.attr` lines")
    return found


def _chain(node: ast.expr) -> list[str]:
    """`["N", "a", "b"]` for the expression `N.a.b`; `[]` for any other expression."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    return [node.id, *attrs] if isinstance(node, ast.Name) else []


def attach(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package`, whose names are those of the
    `if TYPE_CHECKING:` block of `init_file`; each must also be in the package's `__all__`."""
    names = sources(init_file)
    module = sys.modules[package]
    unlisted = sorted(set(names) - set(getattr(module, "__all__", ())))
    if unlisted:
        raise ImportError(f"{package}: {unlisted} imported under TYPE_CHECKING but not in __all__")

    def lookup(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        origin, attrs = names[name]
        value: Any = importlib.import_module(origin)
        for attr in attrs:
            value = getattr(value, attr)
        setattr(module, name, value)
        return value

    def listing() -> list[str]:
        return sorted({*names, *vars(module)})

    return lookup, listing
