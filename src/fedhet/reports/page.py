"""The report's HTML page and its figures, drawn from the runs found (`draw_page`).

The page, top to bottom: what made the runs (fedhet version, commit, libraries, device:
`report_provenance`); the settings the runs share and those that vary, with what decided each
value (`report_settings`); the summary tables (mean ± std over seeds, accuracy in percent, the
best method of a column bold by `results.RANKING_RULE`, which the page prints); the paper's
published numbers beside runs of their setting, or the line saying that the paper has none
(reproduce pages); test accuracy and loss against the round and against communication
(`report_plots`); per-client accuracy (mean, spread, worst and best decile over the clients'
held-out shares) and the runs' own metrics, where they recorded them (`fedhet.reports.clients`);
the diagnostic columns of metrics.csv that change (`report_diagnostics`); a
clients × labels heatmap of each run's partition (recomputed from its config); and
paper-specific figures. Those plug in through `EXTRA_PLOTTERS`: algorithm name → its figure
maker (see `fedhet.reports.figures`), called with `(runs: list[RunData], out: Path)`,
returning `[(caption, png_path), ...]`.

A page of several settings stays short: an overview figure (accuracy per setting) is shown,
each setting's full figures, the runs table, the diagnostics, the partitions and all but the
first paper figure are folded into `<details>` a reader opens. `report_screenshot` renders the
page with headless Chromium (`fedhet report DIR --screenshot PNG`).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.algorithms import ALGORITHMS
from fedhet.data import label_counts
from fedhet.engine import config_of, current_record, federate
from fedhet.registry import params_dict
from fedhet.reports.clients import plot_clients, plot_metrics
from fedhet.reports.diagnostics import MAX_PANELS, MAX_SEEDS, Panel, diagnostic_panels, plot_diagnostics
from fedhet.reports.figures import EXTRA_PLOTTERS, slug
from fedhet.reports.plots import (
    ACCURACY_SCALE,
    RunData,
    coinciding,
    fit_suptitle,
    has_train_loss,
    method_styles,
    plot_curves,
    plot_overview,
    pyplot,
)
from fedhet.reports.provenance import provenance_rows
from fedhet.reports.settings import group_header, summarize
from fedhet.rundir import DamagedFileError
from fedhet.runs import (
    RANKING_RULE,
    RunSpec,
    compare_published,
    run_result,
    summary_tables,
    tables_html,
    uncovered_published,
)
from fedhet.userdocs import topics

MAX_HEATMAPS = 12
DOCS_HINT = "fedhet docs grids"
"""Where the page's rules are explained at length (docs/grids.md, shipped with the package)."""


# -- figures -----------------------------------------------------------------------------------
def partition_counts(config: dict[str, Any]) -> tuple[np.ndarray, str] | None:
    """`(counts[client, class], title)` recomputed from a run's config, or None (centralised)."""

    # the split needs no metrics
    cfg = config_of({k: v for k, v in current_record(config).items() if k != "metrics"})
    if ALGORITHMS.get(cfg.algorithm).factory.centralized:
        return None
    fed = federate(cfg, cache=True)
    data, parts = fed.data, fed.parts
    counts = label_counts(data.split_labels, parts, data.split_classes)
    extra = ", ".join(f"{k}={v}" for k, v in params_dict(cfg.partition_params).items())
    title = f"{cfg.dataset} / {cfg.partition}" + (f" ({extra})" if extra else "") + f", seed {cfg.seed}"
    return counts, title


def plot_partition(counts: np.ndarray, title: str, path: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator  # slow import (matplotlib): only when drawing

    n_clients, n_classes = counts.shape
    height = min(max(2.8, 0.22 * n_clients + 1.5), 14)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, height), width_ratios=[3, 1], sharey=True)
    im = ax.imshow(counts, aspect="auto", cmap="Blues", interpolation="nearest")
    ax.set_xlabel("label")
    ax.set_ylabel("client")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # clients are whole numbers
    ax.set_xticks(range(n_classes) if n_classes <= 20 else np.linspace(0, n_classes - 1, 6).astype(int))
    if n_clients * n_classes <= 400:
        peak = counts.max() or 1
        for (i, j), v in np.ndenumerate(counts):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=6,
                        color="white" if v > 0.6 * peak else "black")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    bx.barh(range(n_clients), counts.sum(axis=1), color="gray")
    bx.set_xlabel("samples (per client)")
    top = fit_suptitle(fig, title, 10)
    fig.tight_layout(rect=(0, 0, 1, 1 - top))
    fig.savefig(path, dpi=80)
    plt.close(fig)


# -- the page ----------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
.scroll{overflow-x:auto;max-width:100%;margin:.5em 0 1.5em}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
tr th:first-child,tr td:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
table.settings td,table.settings th{text-align:left}
figure{margin:1em 0}figcaption{font-size:13px;color:#555}.warn{color:#a40}.note{color:#555;font-size:13px}
details{margin:.5em 0}summary{cursor:pointer;color:#236}table.provenance{font-size:12px}
"""


def _figure(src: str, caption: str) -> str:
    return (f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _fold(summary: str, body: str, open_: bool = False) -> str:
    """`body` behind a `<details>` the reader opens (open from the start with `open_`)."""
    return (f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>\n"
            f"{body}\n</details>")


def _table(header: list[str], rows: list[list[Any]], cls: str = "") -> str:
    """A table inside a horizontally scrolling box, so a wide one is never cut off; a column
    empty in every row is left out (it would say nothing)."""
    keep = [j for j in range(len(header)) if any(_short(row[j]) != "" for row in rows)] if rows \
        else list(range(len(header)))
    header = [header[j] for j in keep]
    rows = [[row[j] for j in keep] for row in rows]
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(_short(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    klass = f' class="{cls}"' if cls else ""
    return f'<div class="scroll"><table{klass}><tr>{head}</tr>\n{body}\n</table></div>'


def _short(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def draw_page(root: Path, manifest: dict[str, Any], runs: list[RunData], out: Path,
          warn: Callable[[str], None]) -> None:
    """Draw the page and its figures into the (empty, private) directory `out`."""
    title = str(manifest.get("title") or root.name)
    sections = [_provenance_section(runs), _settings_section(runs), _tables_section(manifest, runs)]
    sections.append(_curves_section(runs, out))
    sections.append(_clients_section(runs, out))
    sections.append(_diagnostics_section(runs, out))
    sections.append(_partition_section(runs, out, warn))
    sections.append(_extra_section(runs, out, warn))
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    page = (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n<p>{len(runs)} run(s) in <code>{html.escape(str(root))}</code>; "
        f"generated {stamp} by <code>fedhet report</code>. Accuracies are in percent throughout.</p>\n"
        + "\n".join(s for s in sections if s) + "\n</body></html>\n"
    )
    (out / "report.html").write_text(page)


def _provenance_section(runs: list[RunData]) -> str:
    """What made the runs (fedhet, commit, libraries, device, plugins); nothing for runs made
    before fedhet recorded it."""
    rows, note = provenance_rows([r.config for r in runs])
    if not rows:
        return ""
    parts = ['<h2>Made with</h2>', _table(["", "value"], rows, "settings provenance")]
    if note:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    return "\n".join(parts)


def _settings_section(runs: list[RunData]) -> str:
    """What was compared: the settings every run shares, those that vary (with their values),
    each algorithm's parameters, and what sets each table column apart; beside a value, what
    decided it where that is not the setting alone (`report_settings.setting_notes`)."""
    configs = [r.config for r in runs]
    summary = summarize(configs)
    notes = summary.notes
    parts = ["<h2>Settings</h2>"]
    if len(runs) > 1:
        parts.append(f"<p>Shared by all {len(runs)} runs:</p>")
    parts.append(_table(["setting", "value", "decided by"],
                        [[k, v, notes.get(k, "")] for k, v in summary.shared.items()], "settings"))
    if summary.varying:
        parts.append("<p>Varying between runs:</p>")
        parts.append(_table(["setting", "values", "decided by"],
                            [[k, ", ".join(v), notes.get(k, "")] for k, v in summary.varying.items()],
                            "settings"))
    parts.append("<p>Algorithm parameters:</p>")
    parts.append(_table(["algorithm", "parameters"],
                        [[a, p] for a, p in summary.algorithms.items()], "settings"))
    groups = list(dict.fromkeys(r.group for r in runs))
    if len(groups) > 1:
        rows = [[g or "(none)", group_header([r.config for r in runs if r.group == g], configs)]
                for g in groups]
        parts.append("<p>Table columns: the varying settings that all runs of a column share:</p>")
        parts.append(_table(["column", "settings"],
                            rows, "settings"))
    return "\n".join(parts)


RUN_KEYS = (
    # (results key, header, scale)
    ("name", "name", None), ("status", "status", None),
    ("final_accuracy", "final accuracy (%)", ACCURACY_SCALE),
    ("best_accuracy", "best accuracy (%)", ACCURACY_SCALE), ("best_round", "best round", None),
    ("rounds_done", "rounds done", None), ("rounds_to_target", "rounds to target", None),
    ("transfers_to_target", "transfers to target", None), ("cum_bytes", "communication (MB)", 1e-6),
    ("wall_time_s", "wall time (s)", None),
)


def _paper_doc(paper: str) -> str:
    """The shipped doc about `paper`: its own page, else the paper-scale page's section."""
    return paper if paper in topics() else "paper-scale"


def _run_cell(row: dict[str, Any], key: str, scale: float | None) -> Any:
    v = row.get(key, "")
    if scale is not None and isinstance(v, int | float) and not isinstance(v, bool):
        v = float(v) * scale
        return "" if math.isnan(v) else f"{v:.2f}"
    return v


def _tables_section(manifest: dict[str, Any], runs: list[RunData]) -> str:
    target = manifest.get("target_accuracy")
    specs = [RunSpec(r.name, r.group, r.label,
                     {"algorithm": r.algorithm, "seed": r.config.get("seed", 0)}) for r in runs]
    rows = [run_result(s, r.dir, target) for s, r in zip(specs, runs, strict=True)]
    parts = ["<h2>Summary</h2>"]
    if len(runs) > 1:
        parts.append(f'<p>Mean ± std over seeds. <span class="rule">{html.escape(RANKING_RULE)}</span> '
                     f"(<code>{DOCS_HINT}</code>, \"Which cell is bold\").</p>")
        tables = summary_tables(rows, target)
        quality = [x for x in tables if not x.title.startswith("Wall time")]
        parts.append(tables_html(quality))
        rest = [x for x in tables if x not in quality]
        if rest:  # wall time measures the machine, not the method: a click away
            parts.append(_fold("wall time (s) per method and setting", tables_html(rest)))
    published = manifest.get("published") or []
    paper = manifest.get("paper")
    if paper and not published:
        parts.append("<h2>Published vs ours</h2>")
        parts.append(f'<p class="note">The paper gives no numbers to compare with (its results are '
                     f"figures and curves): compare the shapes of the figures below with the paper's; "
                     f"<code>fedhet docs {_paper_doc(str(paper))}</code> says what each one "
                     "should show.</p>")
    if paper and manifest.get("notes"):
        parts.append(f'<p class="note">{html.escape(str(manifest["notes"]).strip())}</p>')
    if published:
        parts.append("<h2>Published vs ours</h2>")
        cmp = compare_published(rows, published)
        if cmp:
            parts.append(_table(["setting", "method", "metric", "paper", "ours", "source"],
                                [[c["group"], c["label"], c["metric"], c["paper"], c["ours"],
                                  c["source"]] for c in cmp]))
        else:
            parts.append("<p>No published number has a run of its setting here.</p>")
        missing = uncovered_published(rows, published)
        if missing:
            parts.append(f'<p class="note">{html.escape(missing)}</p>')
    runs_table = _table([h for _, h, _ in RUN_KEYS],
                        [[_run_cell(r, k, sc) for k, _, sc in RUN_KEYS] for r in rows])
    if len(runs) > 4:
        parts.append("<h3>Runs</h3>" + _fold(f"every run ({len(runs)}): status, accuracy, rounds, "
                                            "communication, wall time", runs_table))
    else:
        parts.append("<h3>Runs</h3>")
        parts.append(runs_table)
    if len(runs) == 1:
        cfg = runs[0].config
        flat = [[k, json.dumps(v) if isinstance(v, dict | list) else v] for k, v in cfg.items()]
        parts.append("<details><summary>Configuration: every key of config.json</summary>"
                     + _table(["setting", "value"], flat, "settings") + "</details>")
    return "\n".join(parts)


def _curves_section(runs: list[RunData], out: Path) -> str:
    """Accuracy and loss; with several settings an overview (accuracy per setting) is shown
    and each setting's full figure is folded away."""
    styles = method_styles(list(dict.fromkeys(r.label for r in runs)))
    groups = list(dict.fromkeys(r.group for r in runs))
    parts = ["<h2>Accuracy and loss</h2>"]
    if len(groups) > 1:
        plot_overview(runs, out / "fig_overview.png", styles)
        n = max(sum(1 for r in runs if r.group == g and r.label == x.label) for g in groups for x in runs)
        parts.append(_figure("fig_overview.png", "test accuracy (%) vs round, a panel per setting "
                             f"(table column), a line per method (mean over up to {n} seeds, band: "
                             "min–max over seeds); each setting's loss and communication curves are "
                             "below"))
    for group in groups:
        mine = [r for r in runs if r.group == group]
        name = f"fig_curves_{slug(group)}.png"
        plot_curves(mine, out / name, group or mine[0].name, styles)
        caption = (f"{group or mine[0].name}: test accuracy (%) and test loss vs round and vs "
                   "cumulative communication; a line per method (mean over seeds), band: min–max "
                   "over seeds")
        if has_train_loss(mine):
            caption += "; thin faded lines: train loss"
        same = coinciding(mine)
        if same:
            caption += ". Drawn over each other (accuracy within 0.5 points every round): " + "; ".join(
                " and ".join(g) for g in same) + " (told apart by dash style and marker)"
        parts.append(_figure(name, caption))
    if len(groups) > 1:
        parts[2:] = [_fold(f"each setting's accuracy and loss vs round and communication "
                           f"({len(groups)} figures)", "\n".join(parts[2:]))]
    return "\n".join(parts)


def _clients_section(runs: list[RunData], out: Path) -> str:
    """Per-client accuracy and the runs' own metrics, a figure of each per setting (where any
    run of it recorded them); folded away when the page has several settings."""
    styles = method_styles(list(dict.fromkeys(r.label for r in runs)))
    groups = list(dict.fromkeys(r.group for r in runs))
    parts = []
    for group in groups:
        mine = [r for r in runs if r.group == group]
        head = group or mine[0].name
        name = f"fig_clients_{slug(head)}.png"
        if plot_clients(mine, out / name, head, styles):
            parts.append(_figure(name, (
                f"{head}: the global model's accuracy (%) on each client's held-out share "
                "(client_eval_fraction), over the clients: mean, worst-decile (thin, ▽) and best-decile mean "
                "(the mean of the lowest and highest ⌈10 %⌉ of clients) and std, and where scored the "
                "mean accuracy after client_eval_finetune_steps local steps (dotted); a line per "
                "method, mean over seeds")))
        name = f"fig_metrics_{slug(head)}.png"
        if plot_metrics(mine, out / name, head, styles):
            parts.append(_figure(name, f"{head}: the runs' own metrics (metrics) on the test set "
                                       "against the round; a line per method (mean over seeds, "
                                       "band: min–max over seeds)"))
    if not parts:
        return ""
    if len(groups) > 1:
        parts = [_fold(f"each setting's per-client accuracy and metrics ({len(parts)} figures)",
                       "\n".join(parts))]
    return "<h2>Per-client accuracy and metrics</h2>\n" + "\n".join(parts)


def _diagnostics_section(runs: list[RunData], out: Path) -> str:
    """A figure per setting (table column): the diagnostics that change, a line per method;
    folded away when the page has several settings."""
    styles = method_styles(list(dict.fromkeys(r.label for r in runs)))
    groups = list(dict.fromkeys(r.group for r in runs))
    parts = []
    flat_all: dict[str, list[float | None]] = {}
    logged: dict[str, int] = {}  # column → method × setting cells that log it
    for group in groups:
        mine = [r for r in runs if r.group == group]
        for label in dict.fromkeys(r.label for r in mine):
            for col in dict.fromkeys(c for r in mine if r.label == label for c in r.metrics):
                logged[col] = logged.get(col, 0) + 1
        panels, flat = diagnostic_panels(mine)
        for col, values in flat.items():
            flat_all.setdefault(col, []).extend(values)
        name = f"fig_diag_{slug(group or mine[0].name)}.png"
        if plot_diagnostics(mine, out / name, group or mine[0].name, styles):
            parts.append(_figure(name, _diagnostics_caption(group or mine[0].name, mine, panels)))
    if len(groups) > 1 and parts:
        parts = [_fold(f"each setting's diagnostics ({len(parts)} figures)", "\n".join(parts))]
    if flat_all:
        described = []
        for col, values in flat_all.items():
            numbers = sorted({v for v in values if v is not None})
            shown = [_short(v) for v in numbers] + (["empty"] if None in values else [])
            where = ("" if len(values) == logged.get(col, 0) else
                     f" (in {len(values)} of the {logged[col]} method × setting cells that log it)")
            described.append(f"{col} = {' or '.join(shown)}{where}")
        parts.append('<p class="note">Not drawn, never changing: ' + html.escape("; ".join(described))
                     + ".</p>")
    return "<h2>Diagnostics</h2>\n" + "\n".join(parts) if parts else ""


def _diagnostics_caption(head: str, runs: list[RunData], panels: list[Panel]) -> str:
    n = max(sum(1 for r in runs if r.label == label) for label in {r.label for r in runs})
    seeds = f"mean over {n} seeds, band min–max" if n > 1 else "one seed"
    caption = f"{head}: diagnostic columns of metrics.csv that change ({seeds})"
    if any(p.seed is not None for p in panels):
        caption += ("; per-client panels are drawn per seed, since client i holds other samples in "
                    "each seed's split")
        if n > MAX_SEEDS:
            caption += f" (the first {MAX_SEEDS} of {n} seeds)"
    if len(panels) > MAX_PANELS:
        caption += f"; the first {MAX_PANELS} of {len(panels)} panels"
    return caption


def _partition_section(runs: list[RunData], out: Path, warn: Callable[[str], None]) -> str:
    """A heatmap per data split (so per seed: each seed splits the data anew), those of a
    setting together; folded away when the page has more than one split."""
    drawn: dict[str, list[str]] = {}  # setting → its figures
    seen: set[str] = set()
    problems = []
    for run in runs:
        c = run.config
        key = json.dumps([c.get(k) for k in ("dataset", "dataset_params", "partition",
                                              "partition_params", "clients", "seed",
                                              "validation_fraction")], sort_keys=True)
        if key in seen or len(seen) >= MAX_HEATMAPS:
            continue
        try:
            got = partition_counts(c)
        except Exception as e:  # noqa: BLE001  (missing data files: say so, draw the rest)
            seen.add(key)
            msg = f"partition of {run.name} not drawn: {e}"
            warn(f"warning: {msg}")
            problems.append(f'<p class="warn">{html.escape(msg)}</p>')
            continue
        if got is None:  # centralised: no partition, but a federated run may share the key
            continue
        seen.add(key)
        name = f"fig_partition_{len(seen)}.png"
        plot_partition(*got, out / name)
        setting = got[1].rsplit(", seed", 1)[0]
        drawn.setdefault(setting, []).append(
            _figure(name, f"{got[1]}: samples per client and label (run {run.name})"))
    if not drawn and not problems:
        return ""
    parts = ["<h2>Partitions</h2>", *problems]
    figures = [f for fs in drawn.values() for f in fs]
    if len(figures) == 1:
        parts += figures
    elif figures:
        parts.append(_fold(f"the data splits: a heatmap per setting and seed ({len(figures)} "
                           f"figures, {len(drawn)} setting(s))", "\n".join(figures)))
    if len(seen) >= MAX_HEATMAPS:
        parts.append(f'<p class="note">The first {MAX_HEATMAPS} splits are drawn.</p>')
    return "\n".join(parts)


def _extra_section(runs: list[RunData], out: Path, warn: Callable[[str], None]) -> str:
    parts = []
    for algorithm in dict.fromkeys(r.algorithm for r in runs):
        try:
            plotter = EXTRA_PLOTTERS.get(algorithm)
            if plotter is None:
                continue
            figures = plotter([r for r in runs if r.algorithm == algorithm], out)
        except DamagedFileError:
            raise  # a damaged run file is the input's fault, not a broken plot: one error line
        except Exception as e:  # noqa: BLE001  (a broken paper plot must not lose the report)
            msg = f"{algorithm} plots failed: {type(e).__name__}: {e}"
            warn(f"warning: {msg}")
            parts.append(f'<p class="warn">{html.escape(msg)}</p>')
            continue
        for caption, path in figures:
            parts.append(_figure(str(Path(path).relative_to(out)), caption))
    if len(parts) > 1:  # the first one shown, the others a click away
        parts[1:] = [_fold(f"{len(parts) - 1} more paper figure(s)", "\n".join(parts[1:]))]
    return "<h2>Paper figures</h2>\n" + "\n".join(parts) if parts else ""
