"""`fedhet compare --config GRID.toml --out DIR`: run a grid and tabulate it.

`DIR/grid.toml` (a copy of the grid), `DIR/grid.json` (the expanded runs), `DIR/runs/<name>/`
(one run directory each), `DIR/results.csv` and `DIR/summary.md`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, TextIO

from fedhet.errors import FedhetError
from fedhet.experiments.grid import load_grid, write_manifest
from fedhet.experiments.results import collect
from fedhet.experiments.runner import run_specs


def compare(
    config: str | Path, out: str | Path, jobs: int | None = None, force: bool = False,
    tensorboard: bool = False, stream: TextIO | None = None,
) -> list[dict[str, Any]]:
    """Validate the whole grid, run what is not finished, write results; returns the rows."""
    grid = load_grid(config)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; choose a directory")
    if tensorboard:
        from fedhet.experiments.tensorboard import require_tensorboard

        require_tensorboard()
    from fedhet.experiments.runner import plan_jobs

    plan_jobs(grid.specs, out / "runs", force)  # settings clashes fail before anything runs
    out.mkdir(parents=True, exist_ok=True)
    if Path(config).resolve() != (out / "grid.toml").resolve():
        shutil.copyfile(config, out / "grid.toml")
    write_manifest(out, grid.title, grid.specs, grid.target_accuracy)
    errors = run_specs(grid.specs, out / "runs", jobs, force, tensorboard, stream)
    rows = collect(out, grid.title, grid.specs, grid.target_accuracy, errors)
    if errors:
        raise FedhetError(
            f"{len(errors)} of {len(grid.specs)} runs failed ({', '.join(sorted(errors))}); "
            f"the others are in {out}/results.csv. First error: {next(iter(errors.values()))}"
        )
    return rows
