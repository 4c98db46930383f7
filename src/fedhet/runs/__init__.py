"""Runs: one run, a grid of runs, and what carries them (above the engine, below the reports).

- `single`: one run from settings to a finished run directory (`execute`);
- `grid`, `sweep`: a grid TOML file, or one from the command line, as `RunSpec`s;
- `comparison`: `fedhet compare` (`compare`), a grid run and tabulated;
- `runner`: many `RunSpec`s over processes, finished runs skipped, partial ones resumed;
- `cluster`, `raylink`: the same runs as Ray tasks over a cluster's nodes;
- `presets`: what a paper preset is (`Preset`, `RunSpec`); the presets live with the papers;
- `results`: a set of runs' `results.csv` and `summary.md`;
- `progress`, `tensorboard`: progress lines for a log file, TensorBoard scalars;
- `demo`, `show`: the README's main job; `fedhet config show`.

The names below are this layer's surface; importing the package imports none of its modules
(and no torch) until one of them is first used (`fedhet.lazy`: `results` tabulates CSVs without
torch); mypy and an IDE read them from the `TYPE_CHECKING` block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.lazy import attach

if TYPE_CHECKING:
    from fedhet.runs.cluster import run_units
    from fedhet.runs.comparison import compare
    from fedhet.runs.grid import Changes, Grid, load_grid
    from fedhet.runs.presets import Preset, RunSpec, with_seeds
    from fedhet.runs.progress import RoundLines
    from fedhet.runs.results import collect, git_commit
    from fedhet.runs.runner import run_specs
    from fedhet.runs.single import execute
    from fedhet.runs.tensorboard import TensorBoardLogger

__all__ = [
    "Changes",
    "Grid",
    "Preset",
    "RoundLines",
    "RunSpec",
    "TensorBoardLogger",
    "collect",
    "compare",
    "execute",
    "git_commit",
    "load_grid",
    "run_specs",
    "run_units",
    "with_seeds",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = attach(__name__, __file__)
