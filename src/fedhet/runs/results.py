"""Results of a set of runs: `results.csv` (one row per run) and `summary.md` (papers' tables).

Each row holds the run's settings, its final and best test accuracy, the rounds it took to
reach the target accuracy, the communication spent up to then (bytes and model transfers) and
its wall time. The summary gives mean ± std over seeds per method (rows) and setting (columns)
(the median and `k/n seeds reached` for the to-target metrics), the best method of each column
in bold by one rule, `RANKING_RULE` (`rank`): reference lines never, every method on the same
seeds, more seeds reaching the target first.
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from fedhet.rundir import atomic_write_text, format_value, metric_columns, read_metrics, read_summary
from fedhet.runs.presets import RunSpec

RESULT_COLUMNS = (
    "status", "final_accuracy", "best_accuracy", "best_round", "rounds_done", "rounds_to_target",
    "bytes_to_target", "transfers_to_target", "cum_bytes", "cum_model_transfers", "wall_time_s",
)


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
    summary = read_summary(run_dir, missing_ok=True)
    if summary.get("status") == "diverged":
        status = "diverged"  # its accuracies are those of the last finite round: not reported
        summary = {k: v for k, v in summary.items() if not k.endswith(("_accuracy", "_round"))}
    elif error or summary.get("status") == "failed":
        status = "failed"  # no result: its accuracies (if an older summary has them) are not one
        summary = {k: v for k, v in summary.items() if not k.endswith(("_accuracy", "_round"))}
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
        columns = metric_columns(read_metrics(run_dir / "metrics.csv", missing_ok=True))
        row.update(to_target(columns, target))
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
    notes: list[str] = field(default_factory=list)
    """Lines under the table: the seeds a column was ranked on, where not all of them."""


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

RANKING_RULE = (
    "Bold: the best method of each column of the quality tables (accuracy; rounds, model "
    "transfers and communication to the target). Reference lines (centralized training and "
    "other non-federated baselines, marked \"reference\") are shown but never ranked. Every "
    "method is judged on the same seeds: those that all methods of the column ran to the end "
    "(finished or diverged). On them, a method that reached the target (for accuracy: did not "
    "diverge) in more seeds ranks above one that did in fewer; among those with the most, the "
    "best mean accuracy, or the lowest median to the target, over the seeds where all of them "
    "have a value, wins as printed. Ties are all bold; a column where every method ties has "
    "none. Wall time is never bold. To-target cells show the median over the seeds that reached "
    "the target, [min–max], and how many of the column's seeds reached it."
)
"""The ranking rule, written once: `rank` implements it, report pages and summary.md print it,
and docs/grids.md ("Which cell is bold") explains it."""
BOLD_RULE = RANKING_RULE  # the name earlier callers use

RAN = ("finished", "diverged")
"""Run statuses that count as a seed the method ran; a missing, failed or partial run does not."""


def is_reference(algorithm: str | None) -> bool:
    """A reference line (centralized training, any non-federated baseline): shown beside the
    methods, never ranked. An algorithm says so when it registers (`reference=True`), else by
    its `centralized` flag; an unknown name is a method."""
    if not algorithm:
        return False
    # lazy: the registry imports torch; summaries of hand-made rows need no algorithm
    from fedhet.algorithms import ALGORITHMS
    from fedhet.errors import FedhetError

    try:
        entry = ALGORITHMS.get(str(algorithm))
    except FedhetError:
        return False
    return bool(entry.trait("reference", getattr(entry.factory, "centralized", False)))


@dataclass
class Ranking:
    """The outcome of `rank` for one column: the best methods and, when the column's seeds
    were not all used, which ones were."""

    best: set[str]
    seeds: list[Any]
    """The seeds every competing method ran (the ones compared)."""
    note: str = ""


def rank(outcomes: dict[str, dict[Any, float | None]], higher: bool, fmt: str,
         center: Callable[[list[float]], float] = statistics.fmean) -> Ranking:
    """`RANKING_RULE` for one column: `outcomes[method][seed]` is the method's value on a seed
    it ran, None where it ran but has none (did not reach the target, diverged). Reference
    lines are left out by the caller. `center` is the mean for accuracies, the median for the
    to-target metrics; values are compared as printed with `fmt`."""
    if len(outcomes) < 2:
        return Ranking(set(), [])
    every = set().union(*(set(s) for s in outcomes.values()))
    common = set.intersection(*(set(s) for s in outcomes.values()))
    seeds = sorted(common, key=str)
    note = "" if common == every else (
        f"ranked on seed(s) {', '.join(map(str, seeds)) or 'none'}: the ones every method ran")
    reached = {m: {s: x for s, x in v.items() if s in common and x is not None}
               for m, v in outcomes.items()}
    most = max(len(r) for r in reached.values())
    if most == 0:
        return Ranking(set(), seeds, note)
    top = [m for m, r in reached.items() if len(r) == most]
    if len(top) == 1:
        return Ranking(set(top), seeds, note)
    shared = sorted(set.intersection(*(set(reached[m]) for m in top)), key=str)
    if not shared:
        return Ranking(set(), seeds, (note + "; " if note else "") + "no seed where the leaders "
                       "all have a value: none bold")
    score = {m: float(fmt.format(center([float(reached[m][s]) for s in shared]))) for m in top}
    pick = max(score.values()) if higher else min(score.values())
    best = {m for m, v in score.items() if v == pick}
    if best == set(outcomes):
        best = set()  # every method ties: bold would single out nothing
    if shared != seeds and best:
        note = (note + "; " if note else "") + (
            f"the leaders compared on seed(s) {', '.join(map(str, shared))}, where all reached it")
    return Ranking(best, seeds, note)


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


def _target_cell(values: list[float], n: int, fmt: str) -> str:
    """Median [min–max] over the seeds that reached the target, and how many did."""
    text = "—" if not values else fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" [{fmt.format(min(values))}–{fmt.format(max(values))}]"
    return text + (f" · {len(values)}/{n} seeds reached" if n > 1 else "")


def _seeds(runs: list[dict[str, Any]]) -> list[Any]:
    """Each run's seed (its position among the cell's runs where a row has none)."""
    return [r.get("seed", f"#{i}") for i, r in enumerate(runs)]


def summary_tables(rows: list[dict[str, Any]], target: float | None) -> list[Table]:
    """Mean ± std over seeds (median and `k/n seeds reached` for the to-target metrics): one
    table per metric, methods × settings, the best per column bold by `rank`
    (`RANKING_RULE`)."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    reference = {label: all(is_reference(r.get("algorithm")) for r in rows if r["label"] == label)
                 for label in labels}
    tables = []
    for key, title, scale, higher, fmt in METRICS:
        if "target" in key and target is None:
            continue
        to_target = "target" in key
        columns: list[dict[str, dict[Any, float | None]]] = [{} for _ in groups]
        cells = []
        for label in labels:
            line = []
            for j, group in enumerate(groups):
                runs = [r for r in rows if r["label"] == label and r["group"] == group]
                vals = [float(r[key]) * scale for r in runs if _finite(r.get(key))]
                show = _target_cell if to_target else _cell
                failed = bool(runs) and all(r.get("status") == "failed" for r in runs)
                line.append("failed" if failed and not vals else show(vals, len(runs), fmt)
                            if runs else "")
                if runs and not reference[label]:
                    columns[j][label] = {
                        seed: float(r[key]) * scale if _finite(r.get(key)) else None
                        for seed, r in zip(_seeds(runs), runs, strict=True)
                        if r.get("status", "finished") in RAN
                    }
            shown = f"{label} (reference)" if reference[label] else label
            cells.append((shown, line))
        best: set[tuple[int, int]] = set()
        notes = []
        if higher is not None:
            center = statistics.median if to_target else statistics.fmean
            for j, outcomes in enumerate(columns):
                ranking = rank({m: v for m, v in outcomes.items() if v}, higher, fmt, center)
                best |= {(labels.index(m), j) for m in ranking.best}
                if ranking.note:
                    notes.append(f"{groups[j] or 'all'}: {ranking.note}.")
        name = title.format(target=f"{100 * target:g}%" if target else "")
        tables.append(Table(name, groups, cells, best, notes))
    return tables


def _finite(v: Any) -> TypeGuard[int | float]:
    """Whether `v` is a finite number (not a bool, not text)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def tables_markdown(tables: list[Table]) -> str:
    parts = []
    for t in tables:
        lines = [f"### {t.title}", "", "| method | " + " | ".join(t.columns) + " |",
                 "|---|" + "---|" * len(t.columns)]
        for i, (label, cells) in enumerate(t.rows):
            shown = [f"**{c}**" if (i, j) in t.best else c for j, c in enumerate(cells)]
            lines.append(f"| {label} | " + " | ".join(shown) + " |")
        lines += ["", *t.notes] if t.notes else []
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
            + "".join(f'<p class="note">{html.escape(n)}</p>' for n in t.notes)
        )
    return "\n".join(parts)


def write_summary_md(path: Path, title: str, rows: list[dict[str, Any]], target: float | None) -> None:
    n_seeds = max((sum(1 for r in rows if r["label"] == x["label"] and r["group"] == x["group"])
                   for x in rows), default=0)
    intro = f"# {title}\n\nMean ± std over up to {n_seeds} seed(s) per cell. {BOLD_RULE}"
    if target is not None:
        intro += f" Target accuracy {100 * target:g}%."
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
    """The short hash of the checkout's HEAD, recorded beside measured figures (outside a git
    checkout, a copy sent to another machine, `$FEDHET_COMMIT`, else "unknown")."""
    if os.environ.get("FEDHET_COMMIT"):
        return os.environ["FEDHET_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
