"""Result files of docs/paper-scale.md: finished runs exported to small CSVs kept in the repository.

The contract (shared by every writer of `results/<paper>/`):

- `results/<paper>/<experiment>.csv`, long format, one row per (setting, algorithm, seed, round):
  columns `setting,algorithm,seed,round,test_accuracy,test_loss,train_loss`, then any extra
  per-round columns the experiment needs (e.g. `alpha_k`, `clients`). `test_accuracy` is a
  fraction in [0, 1]; an empty cell was not measured; round 0 is before training.
- `results/<paper>/<experiment>.json`: `{"experiment", "paper", "command", "commit", "device",
  "minutes", "seeds", "scale", "date"}`.

`export_runs` turns run directories (`metrics.csv` + `config.json`, as `fedhet run`, `compare`,
`grid` and `reproduce` write them under `DIR/runs/`) into such a CSV; `export_grid` does it for a
whole preset/grid directory using its `grid.json` (group → setting, label → algorithm by
default); `write_meta` writes the json; `read_results` reads a CSV back for the page generator.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.rundir import damaged, read_csv, read_json, read_metric_text

BASE_COLUMNS = ("setting", "algorithm", "seed", "round", "test_accuracy", "test_loss", "train_loss")
"""The contract's leading columns, in order."""

KEY = ("setting", "algorithm", "seed", "round")


@dataclass(frozen=True)
class Run:
    """A finished run as the exporter sees it: its directory, name, table cell and settings."""

    dir: Path
    name: str
    group: str
    label: str
    config: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    """The preset's `--set` names (from grid.json) when there is one, else `{}`."""

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", self.settings.get("seed", 0)))


Namer = Callable[[Run], str]
ExtraColumn = str | tuple[str, str]
"""An extra column: its metrics.csv name, or `(name in the CSV, name in metrics.csv)`."""


def _fmt(v: Any, digits: int | None = None) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return repr(float(f"{v:.{digits}g}")) if digits else repr(v)
    return str(v)


RUN_FIX = "fedhet writes it as a JSON object: restore it, or run the run again"
RESULTS_FIX = ("fedhet writes a result file as whole CSV rows `setting,algorithm,seed,round,"
               "test_accuracy,...` with a JSON object beside it; restore them (`git checkout "
               "results/` in a checkout) or export the experiment again")


def read_object(path: Path, fix: str = RUN_FIX) -> dict[str, Any]:
    """A JSON object file (`{}` when there is none); a damaged one is one `FedhetError`."""
    if not path.exists():
        return {}
    return read_json(path, fix)


def run_of(run_dir: Path, group: str = "", label: str = "",
           settings: dict[str, Any] | None = None) -> Run:
    """The `Run` in `run_dir` (its config.json; the directory name when no label is given)."""
    run_dir = Path(run_dir)
    config = read_object(run_dir / "config.json")
    return Run(run_dir, run_dir.name, group or run_dir.name, label or str(config.get("algorithm", "")),
               config, dict(settings or {}))


def has_result(run_dir: Path) -> bool:
    """Whether the run is a result to export: its summary.json says it ran all its rounds, or
    that it diverged (a result too; `rundir.is_finished` says only the first)."""
    summary = read_object(Path(run_dir) / "summary.json")
    return bool(summary.get("finished")) or summary.get("status") == "diverged"


def run_rows(run: Run, setting: str, algorithm: str,
             extra_columns: Sequence[ExtraColumn] = ()) -> list[dict[str, str]]:
    """The contract's rows of one run: one per round in its metrics.csv (cells as text)."""
    path = run.dir / "metrics.csv"
    if not path.exists():
        raise FedhetError(f"{run.dir} has no metrics.csv")
    pairs = [(c, c) if isinstance(c, str) else c for c in extra_columns]
    out = []
    for m in read_metric_text(path):
        row = {"setting": setting, "algorithm": algorithm, "seed": str(run.seed),
               "round": str(int(float(m["round"])))}
        for col in BASE_COLUMNS[4:]:
            row[col] = m.get(col, "") or ""
        for name, src in pairs:
            row[name] = m.get(src, "") or ""
        out.append(row)
    return out


def write_rows(out_csv: Path, rows: list[dict[str, Any]], extra: Sequence[str] = (),
               digits: int | None = None) -> None:
    """Write rows in the contract's column order (base columns, then `extra`, then any others),
    sorted by (setting, algorithm, seed, round) in order of first appearance of the names;
    float cells rounded to `digits` significant digits when given (smaller files)."""
    columns = list(BASE_COLUMNS) + [c for c in extra if c not in BASE_COLUMNS]
    for r in rows:
        columns += [k for k in r if k not in columns]
    order: dict[tuple[str, str], int] = {}
    for r in rows:
        order.setdefault((str(r["setting"]), str(r["algorithm"])), len(order))
    rows = sorted(rows, key=lambda r: (order[(str(r["setting"]), str(r["algorithm"]))],
                                       int(r["seed"]), int(r["round"])))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow([_fmt(r.get(c, ""), digits) for c in columns])
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_csv.with_name(f".{out_csv.name}.tmp")
    tmp.write_text(buf.getvalue())
    tmp.replace(out_csv)


def export_runs(
    run_dirs: Iterable[Path | Run], out_csv: Path, setting_of: Namer | None = None,
    algorithm_of: Namer | None = None, extra_columns: Sequence[ExtraColumn] = (),
    merge: bool = False, finished_only: bool = True, digits: int | None = None,
) -> list[Path]:
    """Write the runs' per-round metrics to `out_csv` in the contract's format.

    `run_dirs` are run directories (or `Run`s); `setting_of`/`algorithm_of` name each run's
    setting and algorithm (default: its group and label). With `merge`, rows already in
    `out_csv` whose (setting, algorithm, seed) is not exported now are kept, so tables can be
    added one at a time. Unfinished runs are skipped (unless `finished_only` is False) and
    returned; two runs with the same (setting, algorithm, seed) are an error. `digits`: see
    `write_rows`.
    """
    setting_of = setting_of or (lambda r: r.group)
    algorithm_of = algorithm_of or (lambda r: r.label)
    names = [c if isinstance(c, str) else c[0] for c in extra_columns]
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, str], Path] = {}
    skipped: list[Path] = []
    for item in run_dirs:
        run = item if isinstance(item, Run) else run_of(Path(item))
        if finished_only and not has_result(run.dir):
            skipped.append(run.dir)
            continue
        setting, algorithm = setting_of(run), algorithm_of(run)
        key = (setting, algorithm, str(run.seed))
        if key in seen:
            raise FedhetError(f"runs {seen[key]} and {run.dir} are both {key} (setting, algorithm, "
                              "seed); name them apart with setting_of/algorithm_of")
        seen[key] = run.dir
        rows += run_rows(run, setting, algorithm, extra_columns)
    if merge and Path(out_csv).exists():
        old = read_rows(Path(out_csv))
        rows = [r for r in old if (r["setting"], r["algorithm"], r["seed"]) not in seen] + rows
    write_rows(Path(out_csv), rows, names, digits)
    return skipped


def grid_runs(grid_dir: Path, runs_dir: str = "runs") -> list[Run]:
    """The runs a preset/grid directory lists in its grid.json (group, label, settings)."""
    grid_dir = Path(grid_dir)
    manifest = read_object(grid_dir / "grid.json")
    if not manifest:
        raise FedhetError(f"{grid_dir} has no grid.json (not a finished `reproduce`/`compare`/`grid`)")
    out = []
    for entry in manifest.get("runs", []):
        run = run_of(grid_dir / runs_dir / entry["name"], entry.get("group", ""), entry.get("label", ""),
                     entry.get("settings", {}))
        out.append(Run(run.dir, entry["name"], run.group, run.label, run.config, run.settings))
    return out


def export_grid(
    grid_dir: Path, out_csv: Path, setting_of: Namer | None = None, algorithm_of: Namer | None = None,
    extra_columns: Sequence[ExtraColumn] = (), keep: Callable[[Run], bool] | None = None,
    merge: bool = False,
) -> list[Path]:
    """`export_runs` over the runs of a preset/grid directory (those `keep` accepts)."""
    runs = [r for r in grid_runs(grid_dir) if keep is None or keep(r)]
    return export_runs(runs, out_csv, setting_of, algorithm_of, extra_columns, merge=merge)


def short(cell: str) -> str:
    """A float cell with 6 significant digits (text cells unchanged)."""
    try:
        v = float(cell)
    except ValueError:
        return cell
    return cell if cell.lstrip("-").isdigit() else f"{v:.6g}"


def read_rows(path: Path) -> list[dict[str, str]]:
    """A results CSV as rows of text cells: the contract's columns, a whole last line, whole
    quoted fields, text only, at least one row, and whole-number seeds and rounds; anything
    else is one `FedhetError` naming the file and line."""
    _, rows = read_csv(Path(path), RESULTS_FIX, required=BASE_COLUMNS)
    if not rows:
        raise damaged(path, "holds no rows (only its header)", RESULTS_FIX)
    for line, r in enumerate(rows, 2):
        for key in ("seed", "round"):
            if not _whole(r[key]):
                raise damaged(path, f"row {line} has {key} {r[key]!r}, not a whole number",
                              RESULTS_FIX)
    return rows


def _whole(cell: str) -> bool:
    try:
        int(cell)
    except ValueError:
        return False
    return True


Curves = dict[tuple[str, str], dict[int, dict[str, list[float]]]]
"""(setting, algorithm) → seed → column → values by round (index i is the i-th row's round)."""


def _float(cell: str) -> float:
    try:
        return float(cell) if cell != "" else math.nan
    except ValueError:
        return math.nan


def read_results(path: Path) -> Curves:
    """A results CSV as curves: `curves[(setting, algorithm)][seed][column]`, `"round"` included."""
    curves: Curves = {}
    for r in read_rows(path):
        by_seed = curves.setdefault((r["setting"], r["algorithm"]), {})
        cols = by_seed.setdefault(int(r["seed"]), {})
        for k, v in r.items():
            if k in ("setting", "algorithm", "seed") or k is None:
                continue
            cols.setdefault(k, []).append(_float(v))
    for by_seed in curves.values():
        for cols in by_seed.values():
            order = sorted(range(len(cols["round"])), key=lambda i: cols["round"][i])
            for k in cols:
                cols[k] = [cols[k][i] for i in order]
    return curves


def write_meta(
    out_json: Path, experiment: str, paper: str, command: str, device: str, minutes: float,
    seeds: Sequence[int] | int, scale: str = "paper", commit: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Write the experiment's json beside its CSV (commit: the checkout's HEAD when not given)."""
    if commit is None:
        # lazy: results imports engine.store (torch); this module runs on the standard library
        from fedhet.runs import git_commit

        commit = git_commit()
    meta = {
        "experiment": experiment, "paper": paper, "command": command, "commit": commit,
        "device": device, "minutes": round(float(minutes), 2),
        "seeds": list(seeds) if not isinstance(seeds, int) else seeds, "scale": scale,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), **extra,
    }
    out_json = Path(out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """An experiment's json (`{}` when there is none; a damaged one is one `FedhetError`)."""
    return read_object(Path(path), RESULTS_FIX)


def grid_minutes(grid_dir: Path) -> float:
    """Wall minutes the runs of a preset/grid directory took (sum of their `total_time_s`)."""
    total = 0.0
    for run in grid_runs(grid_dir):
        t = read_object(run.dir / "summary.json").get("total_time_s")
        if isinstance(t, int | float) and math.isfinite(t):
            total += float(t)
    return total / 60.0


def main(argv: list[str] | None = None) -> None:
    """`python -m fedhet.papers.paper_results DIR --paper P --experiment E`: export a
    finished preset/grid directory to `RESULTS/P/E.csv` and its json."""
    # lazy: only the command line parses arguments
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__ else None)
    ap.add_argument("dir", type=Path, help="a finished reproduce/compare/grid directory")
    ap.add_argument("--paper", required=True)
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--algorithm-from", choices=("label", "config"), default="label",
                    help="the algorithm column: the preset's label or the run's algorithm name")
    ap.add_argument("--command", default="", help="the command that made the runs")
    ap.add_argument("--device", default="cpu: 2-core VM")
    ap.add_argument("--scale", default="paper")
    ap.add_argument("--minutes", type=float, default=None,
                    help="wall minutes of the runs (default: the sum of their times, which counts "
                         "runs that stepped together as a stack once each)")
    ap.add_argument("--commit", default=None, help="the commit the runs were made at (default HEAD)")
    a = ap.parse_args(argv)
    algorithm_of = (lambda r: str(r.config.get("algorithm", r.label))) if a.algorithm_from == "config" \
        else None
    out_csv = a.results / a.paper / f"{a.experiment}.csv"
    skipped = export_grid(a.dir, out_csv, algorithm_of=algorithm_of)
    runs = grid_runs(a.dir)
    minutes = grid_minutes(a.dir) if a.minutes is None else a.minutes
    write_meta(out_csv.with_suffix(".json"), a.experiment, a.paper, a.command, a.device,
               minutes, sorted({r.seed for r in runs}), a.scale, commit=a.commit,
               complete=not skipped, runs=len(runs) - len(skipped), runs_planned=len(runs))
    print(str(out_csv) + (f" ({len(skipped)} unfinished runs left out)" if skipped else ""))


if __name__ == "__main__":
    main()
