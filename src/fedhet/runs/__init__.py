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
(and no torch) until one of them is first used.
"""

from __future__ import annotations

from fedhet.surface import offered

_SURFACE = {
    "execute": "single",
    "compare": "comparison",
    "Changes": "grid",
    "Grid": "grid",
    "load_grid": "grid",
    "run_specs": "runner",
    "run_units": "cluster",
    "RunSpec": "presets",
    "Preset": "presets",
    "with_seeds": "presets",
    "collect": "results",
    "git_commit": "results",
    "RoundLines": "progress",
    "TensorBoardLogger": "tensorboard",
}

__all__ = sorted(_SURFACE)

__getattr__ = offered(__name__, _SURFACE)
