"""Finding the runs a report is drawn from: a run directory, a grid (its manifest and its
runs), or a directory of fedhet runs (`discover`); a directory fedhet did not write is refused
in one line, and the plugins the runs were made with are imported (`import_plugins`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.engine import RECORD_KEYS, config_of, current_record
from fedhet.errors import FedhetError
from fedhet.reports.plots import RunData
from fedhet.reports.settings import component
from fedhet.rundir import (
    CONFIG_FIX,
    DamagedFileError,
    metric_columns,
    read_json,
    read_metrics,
    read_summary,
)
from fedhet.rundir import ownership as rundir
from fedhet.runs import read_manifest


def is_fedhet_run(path: Path, config: dict[str, Any]) -> bool:
    """Whether `path`, whose `config.json` holds `config`, is a run fedhet made: it carries the
    `.fedhet` marker, or (a run made before the marker existed) its config builds as fedhet
    settings, its recorded plugins imported first. Another tool's directory that merely has a
    config.json and a metrics.csv is not one."""
    if rundir.is_ours(path):
        return True
    try:
        plugins.ensure_recorded(config, path / "config.json")
        config_of({k: v for k, v in current_record(config).items() if k not in RECORD_KEYS},
                  "config.json")
    except Exception:  # noqa: BLE001  (whatever stops it building: not fedhet settings)
        return False
    return True


def _not_ours(path: Path, why: str) -> FedhetError:
    return FedhetError(
        f"{path} is not a fedhet run: it has no {rundir.MARKER} marker and its config.json "
        f"{why}; give a directory that `fedhet run`, `compare` or `reproduce` wrote"
    )


def _load_run(path: Path, name: str, group: str, label: str) -> RunData:
    """The run in `path`, its files read whole (`fedhet.rundir.reading`): a missing or damaged
    config.json or metrics.csv, a damaged summary.json, or a directory that is no fedhet run
    is one `FedhetError`. summary.json may be missing (a run before its first round)."""
    try:
        config = read_json(path / "config.json", CONFIG_FIX)
    except DamagedFileError as e:
        if rundir.is_ours(path):
            raise
        raise _not_ours(path, e.problem) from None
    if not is_fedhet_run(path, config):
        raise _not_ours(path, "does not hold fedhet settings")
    summary = read_summary(path, missing_ok=True)
    if not (path / "metrics.csv").exists():
        raise FedhetError(f"{path} has no metrics.csv: the run saved no round yet; report it once "
                          "it has")
    metrics = metric_columns(read_metrics(path / "metrics.csv"))
    return RunData(name, group, label or str(config.get("algorithm", name)), path, config, summary,
                   metrics)


def _started(path: Path) -> bool:
    """A grid's run that has saved a round (the others have not run yet; one that has, but
    lost its config.json, is reported as damaged by `_load_run`)."""
    return (path / "metrics.csv").exists()


def discover(root: Path, warn: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[RunData]]:
    """The manifest (or a made-up one) and the runs of a run, grid or preset directory, or of
    a directory holding fedhet runs; anything else, or a damaged file, is one `FedhetError`.
    Runs of a grid that have not run yet are left out (`warn` names how many)."""
    warn = warn or (lambda m: print(m, file=sys.stderr))
    if (root / "config.json").exists():
        return {"title": root.name, "target_accuracy": None}, [_load_run(root, root.name, "", "")]
    manifest = read_manifest(root)
    if manifest is not None:
        listed = [(root / "runs" / r["name"], r) for r in manifest["runs"]]
        runs = [_load_run(p, r["name"], r["group"], r["label"]) for p, r in listed if _started(p)]
        waiting = [r["name"] for p, r in listed if not _started(p)]
        if waiting and runs:
            more = " …" if len(waiting) > 3 else ""
            warn(f"warning: {len(waiting)} of the grid's {len(listed)} runs have saved no round "
                 f"yet and are not in the report ({', '.join(waiting[:3])}{more})")
        if not runs:
            raise FedhetError(f"none of the {len(listed)} runs of the grid {root} has saved a round "
                              "yet; report it once one has")
        return manifest, runs
    runs, foreign = [], []
    for p in sorted(p.parent for p in root.rglob("config.json")):
        if rundir.REPLACED in p.relative_to(root).parts:  # a run `--force` is replacing
            continue
        try:
            config = read_json(p / "config.json", CONFIG_FIX)
        except DamagedFileError:
            if rundir.is_ours(p):
                raise  # a fedhet run's damaged file
            config = None  # another tool's file
        if config is None or not is_fedhet_run(p, config):
            foreign.append(str(p.relative_to(root)))
            continue
        if not (p / "metrics.csv").exists():
            continue
        run = _load_run(p, str(p.relative_to(root)), "", "")
        c = run.config
        run.group = f"{c.get('dataset')}/{component(c.get('partition'), c.get('partition_params'))}"
        runs.append(run)
    if not runs:
        raise FedhetError(
            f"{root} is not a fedhet run or grid directory: it holds no {rundir.MARKER} marker, "
            "no grid.json and no run that fedhet wrote (config.json and metrics.csv); give a "
            "directory that `fedhet run`, `compare` or `reproduce` wrote"
        )
    if foreign:
        warn(f"warning: left out {len(foreign)} director(ies) that fedhet did not write: "
             f"{', '.join(foreign[:3])}{' …' if len(foreign) > 3 else ''}")
    return {"title": root.name, "target_accuracy": None}, runs


def import_plugins(runs: list[RunData], warn: Callable[[str], None]) -> None:
    """Import the plugins each run recorded (its components rebuild the partition figures);
    one that no longer imports is a warning, once, and the page is written without them."""
    said: set[str] = set()
    for run in runs:
        try:
            plugins.ensure_recorded(run.config, run.dir / "config.json")
        except FedhetError as e:
            if str(e) not in said:
                said.add(str(e))
                warn(f"warning: {e}")
