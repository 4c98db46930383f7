"""`fedhet compare --config GRID.toml --out DIR`: run a grid and tabulate it.

`DIR/grid.toml` (a copy of the grid), `DIR/grid.json` (the expanded runs), `DIR/runs/<name>/`
(one run directory each), `DIR/results.csv` and `DIR/summary.md`; `DIR/.fedhet` marks it
as fedhet's and `DIR/.fedhet.lock` keeps a second `compare` out while one runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, TextIO

from fedhet import plugins
from fedhet.engine import config_of, dry_check
from fedhet.errors import FedhetError
from fedhet.rundir import atomic_write_text, read_config
from fedhet.rundir import ownership as rundir
from fedhet.runs.cluster import run_units
from fedhet.runs.grid import load_grid
from fedhet.runs.grid_document import GridChanges
from fedhet.runs.grid_manifest import write_manifest
from fedhet.runs.jobs import DEFAULT_STACK_RUNS, plan_jobs, with_overrides
from fedhet.runs.results import collect
from fedhet.runs.runner import run_specs


def compare(
    config: str | Path | None, out: str | Path, jobs: int | None = None, force: bool = False,
    tensorboard: bool = False, stream: TextIO | None = None, overrides: dict[str, Any] | None = None,
    stack_runs: int = DEFAULT_STACK_RUNS, changes: GridChanges | None = None, hint: str | None = None,
    cluster: Any = None, extend: bool = False,
) -> list[dict[str, Any]]:
    """Validate the whole grid, run what is not finished, write results; returns the rows.

    The grid is the file `config` with the command line's `changes` (`grid.GridChanges`: settings
    fixed in every run, sweeps), or with `config` None the grid `changes` alone make; it is
    saved as `out/grid.toml`. `hint` is the command that resumes it (named after a Ctrl-C).
    `out` is marked as fedhet's grid directory and locked for the whole call, so a second
    `compare` (or `reproduce`) on it fails at once, naming this process. Ctrl-C stops the grid
    at the next saved round of each running run (`runner.Interrupted`); calling again resumes.
    `cluster` (`fedhet.runs.cluster.ClusterOptions`): run on a cluster, not in `jobs`.
    `extend` (`compare --resume`): runs that differ from their saved settings only in what a
    resume may change (more rounds, ...) are resumed with the new values (`plan_jobs`).
    """
    out = Path(out)
    import_recorded(out / "runs")
    grid = load_grid(config, changes)
    grid.specs = with_overrides(grid.specs, overrides)
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; choose a directory")
    if tensorboard:
        # optional extra: fedhet[tensorboard]
        from fedhet.runs.tensorboard import require_tensorboard

        require_tensorboard()

    hint = hint or f"fedhet compare --config {shlex.quote(str(config))} --out {shlex.quote(str(out))}"
    dry_check(config_of(spec.settings) for spec in grid.specs)  # a wrong model: nothing written
    with rundir.exclusive(out, "compare"):
        rundir.mark(out, "grid")
        # settings clashes fail before anything runs
        plan_jobs(grid.specs, out / "runs", force, extend=extend,
                  resume_hint=f"fedhet compare --resume {shlex.quote(str(out))}")
        if config is None or changes or Path(config).resolve() != (out / "grid.toml").resolve():
            atomic_write_text(out / "grid.toml", grid.text)
        write_manifest(out, grid.title, grid.specs, grid.target_accuracy)
        errors = run_specs(grid.specs, out / "runs", jobs, force, tensorboard, stream, hint,
                           stack_runs=stack_runs, cluster=cluster, backend=run_units,
                           extend=extend)
        return _finish(out, grid.title, grid.specs, grid.target_accuracy, errors)


def import_recorded(runs_dir: Path) -> None:
    """Import the plugins the grid's runs so far recorded (`fedhet.plugins.ensure_recorded`),
    so the grid runs again without `--plugin`."""
    for config_path in sorted(runs_dir.glob("*/config.json")):
        try:
            record = read_config(config_path.parent)
        except FedhetError:
            continue  # the run reports its own damage
        plugins.ensure_recorded(record, config_path)


def _finish(
    out: Path, title: str, specs: list, target: float | None, errors: dict[str, str]
) -> list[dict[str, Any]]:
    """Write results.csv and summary.md; raise naming the failed runs, else return the rows."""
    rows = collect(out, title, specs, target, errors)
    if errors:
        raise FedhetError(
            f"{len(errors)} of {len(specs)} runs failed ({', '.join(sorted(errors))}); "
            f"the others are in {out}/results.csv. First error: {next(iter(errors.values()))}"
        )
    return rows
