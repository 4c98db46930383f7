"""Runs: one run, a grid of runs, and what carries them (above the engine, below the reports).

- `single`: one run from settings to a finished run directory (`execute`);
- `grid`, `sweep`: a grid TOML file, or one from the command line, as `RunSpec`s (`grid_document`,
  `grid_lines`, `grid_cells`: its document, key lines and cells; `grid_manifest`: `grid.json`);
- `comparison`: `fedhet compare` (`compare`), a grid run and tabulated;
- `runner`: many `RunSpec`s over processes, finished runs skipped, partial ones resumed; `jobs`:
  a grid's runs still to do and their batches; `processes`: the worker processes they run in;
  `grid_status`: the grid's status lines and outcomes;
- `cluster`, `raylink`, `raynodes`, `raytask`: the same runs as Ray tasks over a cluster's nodes
  (the driver, the connection, the nodes and their file probe, the task on a node);
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
    from fedhet.runs.cluster import session as cluster_session
    from fedhet.runs.comparison import compare
    from fedhet.runs.demo import run_demo
    from fedhet.runs.grid import Grid, load_grid
    from fedhet.runs.grid_cells import cell_key, duplicate_groups
    from fedhet.runs.grid_document import GridChanges
    from fedhet.runs.grid_manifest import read_manifest, write_manifest
    from fedhet.runs.jobs import DEFAULT_STACK_RUNS, Job, plan_jobs, stack_key, with_overrides
    from fedhet.runs.presets import PAPER_SEEDS, SCALES, Preset, PresetFactory, RunSpec, with_seeds
    from fedhet.runs.progress import RoundLines
    from fedhet.runs.results import (
        RANKING_RULE,
        collect,
        compare_published,
        git_commit,
        published_markdown,
        run_result,
        summary_tables,
        tables_html,
        uncovered_published,
    )
    from fedhet.runs.runner import run_specs
    from fedhet.runs.show import as_json as settings_json
    from fedhet.runs.show import render as render_settings
    from fedhet.runs.show import sections as settings_sections
    from fedhet.runs.single import execute, execute_together, resume_settings
    from fedhet.runs.tensorboard import TensorBoardLogger, require_tensorboard

__all__ = [
    "GridChanges",
    "DEFAULT_STACK_RUNS",
    "Grid",
    "Job",
    "PAPER_SEEDS",
    "Preset",
    "PresetFactory",
    "RANKING_RULE",
    "RoundLines",
    "RunSpec",
    "SCALES",
    "TensorBoardLogger",
    "stack_key",
    "cell_key",
    "cluster_session",
    "collect",
    "compare",
    "compare_published",
    "duplicate_groups",
    "execute",
    "execute_together",
    "git_commit",
    "load_grid",
    "plan_jobs",
    "published_markdown",
    "read_manifest",
    "render_settings",
    "require_tensorboard",
    "resume_settings",
    "run_demo",
    "run_result",
    "run_specs",
    "run_units",
    "settings_json",
    "settings_sections",
    "summary_tables",
    "tables_html",
    "uncovered_published",
    "with_overrides",
    "with_seeds",
    "write_manifest",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = attach(__name__, __file__)
