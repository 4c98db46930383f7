"""Settings files shipped with fedhet, found by name from any directory.

`run-*.toml` are run files (`fedhet run --config run-fedprox-dirichlet`); the others are grids
(`fedhet compare --config grid-digits`, format: docs/grids.md). `resolve` turns what a user
typed into a file: an existing path wins; otherwise a shipped file's name, with or without
`.toml`. The files are package data (pyproject's `[tool.setuptools.package-data]`).
"""

from __future__ import annotations

from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.registry import did_you_mean

__all__ = ["HERE", "is_grid", "resolve", "shipped"]

HERE = Path(__file__).parent


def shipped() -> dict[str, Path]:
    """`{name: path}` of every shipped settings file, by name."""
    return {p.stem: p for p in sorted(HERE.glob("*.toml"))}


def is_grid(path: Path) -> bool:
    """A grid file (its stem does not start with `run-`)."""
    return not path.stem.startswith("run-")


def resolve(given: str | Path, what: str = "config file") -> Path:
    """The file `given` names: the path when it exists, else the shipped file of that name
    (`grid-digits` or `grid-digits.toml`); otherwise one `FedhetError` with the shipped names
    and the nearest one."""
    path = Path(given)
    if path.exists():
        return path
    files = shipped()
    name = path.name.removesuffix(".toml")
    if path.parent == Path(".") and name in files:
        return files[name]
    names = ", ".join(files)
    raise FedhetError(
        f"{what} {given} not found{did_you_mean(name, files)}; shipped files (by name): {names}"
    )
