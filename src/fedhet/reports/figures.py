"""Paper figures in `fedhet report`: algorithm name → a function that draws them.

A paper package registers its figures with `@paper_figures("fedveca")`; `fedhet report` calls
the function when a run of that algorithm is in the report, with `(runs: list[RunData], out:
Path)`, and puts the returned `[(caption, png_path), ...]` under "Paper figures". A user may add
an entry for their own algorithm the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

FigureMaker = Callable[[list[Any], Path], list[tuple[str, Path]]]
EXTRA_PLOTTERS: dict[str, FigureMaker] = {}
"""Algorithm name → its figure maker (filled by the paper packages when imported)."""


def paper_figures(*algorithms: str) -> Callable[[FigureMaker], FigureMaker]:
    """Register the decorated function as the figure maker of `algorithms`."""

    def deco(fn: FigureMaker) -> FigureMaker:
        for name in algorithms:
            if name in EXTRA_PLOTTERS:
                raise ValueError(f"figures for {name!r} registered twice")
            EXTRA_PLOTTERS[name] = fn
        return fn

    return deco


def slug(text: str) -> str:
    """A file-name-safe form of a run or group name."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80] or "all"
