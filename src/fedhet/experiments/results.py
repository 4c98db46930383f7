"""Results of a set of runs: `results.csv` (one row per run) and `summary.md` (papers' tables).

Each row holds the run's settings, its final and best test accuracy, the rounds it took to
reach the target accuracy, the communication spent up to then (bytes and model transfers) and
its wall time. The summary gives mean ± std over seeds per method (rows) and setting (columns),
the best cell of each column in bold.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.engine.store import atomic_write_text, format_value, read_metric_columns
from fedhet.experiments.presets import RunSpec

RESULT_COLUMNS = (
    "status", "final_accuracy", "best_accuracy", "best_round", "rounds_done", "rounds_to_target",
    "bytes_to_target", "transfers_to_target", "cum_bytes", "cum_model_transfers", "wall_time_s",
)


def read_metrics(path: Path) -> dict[str, list[float]]:
    """metrics.csv as columns of floats (empty cells are NaN); `{}` when there is none yet."""
    return read_metric_columns(path) if path.exists() else {}


def to_target(metrics: dict[str, list[float]], target: float | None) -> dict[str, float]:
    """First round with test accuracy ≥ target, and cumulative bytes/transfers at that round."""
    out = {"rounds_to_target": math.nan, "bytes_to_target": math.nan, "transfers_to_target": math.nan}
    if target is None:
        return out
    acc = metrics.get("test_accuracy", [])
    for j, a in enumerate(acc):
        if a >= target:
            out["rounds_to_target"] = metrics["round"][j]
            pairs = (("bytes_to_target", "cum_bytes"), ("transfers_to_target", "cum_model_transfers"))
            for key, col in pairs:
                v = metrics.get(col, [math.nan] * len(acc))[j]
                out[key] = 0.0 if math.isnan(v) else v
            break
    return out


def run_result(spec: RunSpec, run_dir: Path, target: float | None, error: str = "") -> dict[str, Any]:
    """One results.csv row for the run in `run_dir` (missing runs give status `missing`)."""
    row: dict[str, Any] = {"name": spec.name, "group": spec.group, "label": spec.label}
    row.update(spec.settings)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if summary.get("status") == "diverged":
        status = "diverged"  # its accuracies are those of the last finite round: not reported
        summary = {k: v for k, v in summary.items() if not k.endswith(("_accuracy", "_round"))}
    elif error:
        status = "failed"
    elif not summary:
        status = "missing"
    else:
        status = "finished" if summary.get("finished") else "partial"
    row["status"] = status
    for key in ("final_accuracy", "best_accuracy", "best_round", "rounds_done", "cum_bytes",
                "cum_model_transfers"):
        row[key] = summary.get(key, math.nan)
    row["wall_time_s"] = summary.get("total_time_s", math.nan)
    if status != "diverged":
        row.update(to_target(read_metrics(run_dir / "metrics.csv"), target))
    if error:
        row["error"] = error
    return row


def write_results_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns: list[str] = ["name", "group", "label"]
    settings = [k for r in rows for k in r if k not in columns and k not in RESULT_COLUMNS and k != "error"]
    columns += list(dict.fromkeys(settings)) + list(RESULT_COLUMNS)
    if any("error" in r for r in rows):
        columns.append("error")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow([format_value(r.get(c, "")) for c in columns])
    atomic_write_text(path, buf.getvalue())


# -- tables ------------------------------------------------------------------------------------
@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[tuple[str, list[str]]]
    best: set[tuple[int, int]]
    """(row, column) cells to mark bold."""


METRICS = (
    # (results key, title, scale, higher is better (None: never bold), format)
    ("final_accuracy", "Final test accuracy (%)", 100.0, True, "{:.2f}"),
    ("best_accuracy", "Best test accuracy (%)", 100.0, True, "{:.2f}"),
    ("rounds_to_target", "Rounds to {target}", 1.0, False, "{:.1f}"),
    ("transfers_to_target", "Model transfers to {target}", 1.0, False, "{:.0f}"),
    ("bytes_to_target", "Communication to {target} (MB)", 1e-6, False, "{:.2f}"),
    ("wall_time_s", "Wall time (s)", 1.0, None, "{:.1f}"),
)
"""Wall time is no quality of a method (it depends on the machine and its load): never bold."""

BOLD_RULE = (
    "Bold: the best mean per column in the quality tables (accuracy, and rounds, transfers and "
    "communication to the target), compared as printed; cells that tie are all bold, and a "
    "column where every method ties has none. Wall time is never bold."
)


def _cell(values: list[float], n: int, fmt: str) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    text = fmt.format(mean)
    if len(values) > 1:
        text += " ± " + fmt.format(statistics.stdev(values))
    if len(values) < n:
        text += f" ({len(values)}/{n})"
    return text


def summary_tables(rows: list[dict[str, Any]], target: float | None) -> list[Table]:
    """Mean ± std over seeds: one table per metric, methods × settings, best per column bold.

    For the to-target metrics a cell averages the seeds that reached the target and says how
    many did (`(2/3)`); only cells where every seed reached it compete for bold.
    """
    labels = list(dict.fromkeys(r["label"] for r in rows))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    tables = []
    for key, title, scale, higher, fmt in METRICS:
        if "target" in key and target is None:
            continue
        cells, means = [], {}
        for i, label in enumerate(labels):
            line = []
            for j, group in enumerate(groups):
                runs = [r for r in rows if r["label"] == label and r["group"] == group]
                vals = [float(r[key]) * scale for r in runs if _finite(r.get(key))]
                line.append(_cell(vals, len(runs), fmt) if runs else "")
                if runs and len(vals) == len(runs):
                    means[(i, j)] = statistics.fmean(vals)
            cells.append((label, line))
        best = set() if higher is None else _best_cells(means, len(groups), higher, fmt)
        name = title.format(target=f"{100 * target:g}%" if target else "")
        tables.append(Table(name, groups, cells, best))
    return tables


def _best_cells(means: dict[tuple[int, int], float], n_groups: int, higher: bool,
                fmt: str) -> set[tuple[int, int]]:
    """The bold cells: per column the best mean as printed (ties all bold); none where every
    competing cell ties, since bold would then single out nothing."""
    best: set[tuple[int, int]] = set()
    for j in range(n_groups):
        col = {i: float(fmt.format(m)) for (i, jj), m in means.items() if jj == j}
        if len(col) < 2 or len(set(col.values())) == 1:
            continue
        pick = max(col.values()) if higher else min(col.values())
        best |= {(i, j) for i, m in col.items() if m == pick}
    return best


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def tables_markdown(tables: list[Table]) -> str:
    parts = []
    for t in tables:
        lines = [f"### {t.title}", "", "| method | " + " | ".join(t.columns) + " |",
                 "|---|" + "---|" * len(t.columns)]
        for i, (label, cells) in enumerate(t.rows):
            shown = [f"**{c}**" if (i, j) in t.best else c for j, c in enumerate(cells)]
            lines.append(f"| {label} | " + " | ".join(shown) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def tables_html(tables: list[Table]) -> str:
    parts = []
    for t in tables:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
        body = []
        for i, (label, cells) in enumerate(t.rows):
            tds = "".join(
                f"<td><b>{html.escape(c)}</b></td>" if (i, j) in t.best else f"<td>{html.escape(c)}</td>"
                for j, c in enumerate(cells)
            )
            body.append(f"<tr><th>{html.escape(label)}</th>{tds}</tr>")
        parts.append(
            f'<h3>{html.escape(t.title)}</h3>\n<div class="scroll"><table><tr><th>method</th>{head}</tr>\n'
            + "\n".join(body) + "\n</table></div>"
        )
    return "\n".join(parts)


def write_summary_md(path: Path, title: str, rows: list[dict[str, Any]], target: float | None) -> None:
    n_seeds = max((sum(1 for r in rows if r["label"] == x["label"] and r["group"] == x["group"])
                   for x in rows), default=0)
    intro = f"# {title}\n\nMean ± std over up to {n_seeds} seed(s) per cell. {BOLD_RULE}"
    if target is not None:
        intro += f" Target accuracy {100 * target:g}%; `(k/n)`: k of n seeds reached it."
    failed = [f"{r['name']} ({r['status']})" for r in rows if r["status"] != "finished"]
    if failed:
        intro += f"\n\nNot finished ({len(failed)}): " + ", ".join(failed)
    atomic_write_text(path, intro + "\n\n" + tables_markdown(summary_tables(rows, target)))


def collect(
    out: Path, title: str, specs: list[RunSpec], target: float | None,
    errors: dict[str, str] | None = None, runs_dir: str = "runs",
) -> list[dict[str, Any]]:
    """Write `out/results.csv` and `out/summary.md` for `specs` (run dirs under `out/runs`)."""
    errors = errors or {}
    rows = [run_result(s, out / runs_dir / s.name, target, errors.get(s.name, "")) for s in specs]
    write_results_csv(out / "results.csv", rows)
    write_summary_md(out / "summary.md", title, rows, target)
    return rows


METRIC_ALIASES = {
    "accuracy": "final_accuracy", "test_accuracy": "final_accuracy",
    "rounds": "rounds_to_target", "transfers": "transfers_to_target",
    "communication": "transfers_to_target", "bytes": "bytes_to_target",
}


def compare_published(rows: list[dict[str, Any]], published: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's numbers beside ours: one entry per published row that has runs here.

    A published row whose setting (group) and method (label) no run has is left out; say so
    with `uncovered_published`.

    A published row is `{"group", "label", "metric", "value", "source"}`; `metric` is a
    results.csv column (`final_accuracy`, `best_accuracy`, `rounds_to_target`,
    `transfers_to_target`, ...) or an alias (`accuracy`, `rounds`, `transfers`). Accuracies
    above 1 are taken as percentages and ours is shown in percent too.
    """
    out = []
    for p in published:
        metric = METRIC_ALIASES.get(str(p.get("metric", "")), str(p.get("metric", "")))
        runs = [r for r in rows if r["group"] == p.get("group") and r["label"] == p.get("label")]
        value = p.get("value")
        percent = "accuracy" in metric and _finite(value) and abs(float(value)) > 1
        scale = 100.0 if percent else 1.0
        vals = [float(r[metric]) * scale for r in runs if _finite(r.get(metric))]
        fmt = "{:.2f}" if "accuracy" in metric else "{:.4g}"
        if not runs:
            continue
        ours = _cell(vals, len(runs), fmt)
        out.append({
            "group": p.get("group", ""), "label": p.get("label", ""), "metric": metric,
            "paper": value, "ours": ours, "source": p.get("source", ""),
        })
    return out


def uncovered_published(rows: list[dict[str, Any]], published: list[dict[str, Any]]) -> str:
    """One line naming the published columns (settings) that no run here covers, and the
    published methods missing from columns that are covered; empty when everything is."""
    have = {(r["group"], r["label"]) for r in rows}
    groups = {r["group"] for r in rows}
    columns = list(dict.fromkeys(str(p.get("group", "")) for p in published))
    missing = [c for c in columns if c not in groups]
    methods = list(dict.fromkeys(
        f"{p.get('label')} in {p.get('group')}" for p in published
        if p.get("group") in groups and (p.get("group"), p.get("label")) not in have
    ))
    n = sum(1 for p in published if (p.get("group"), p.get("label")) not in have)
    if not n:
        return ""
    parts = []
    if missing:
        parts.append(f"{len(missing)} of {len(columns)} published columns have no run at this "
                     f"scale ({'; '.join(missing)})")
    if methods:
        parts.append(f"no run of {'; '.join(methods)}")
    return f"Not compared: {n} published number(s); " + "; ".join(parts) + "."


def published_markdown(comparison: list[dict[str, Any]]) -> str:
    if not comparison:
        return "No published number has a run of its setting here.\n"
    lines = ["| setting | method | metric | paper | ours | source |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {c['group']} | {c['label']} | {c['metric']} | {c['paper']} | {c['ours']} | {c['source']} |"
        for c in comparison
    ]
    return "\n".join(lines) + "\n"


def git_commit() -> str:
    """The short hash of the checkout's HEAD, recorded beside measured figures ("unknown"
    outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
