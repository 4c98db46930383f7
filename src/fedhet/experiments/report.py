"""`fedhet report DIR`: an HTML page with PNGs beside it, for a run or a grid directory.

Plots: test accuracy and loss against the round and against communication (`cum_bytes`),
one figure per setting (group) with a line per method (mean over seeds, band = min..max);
every diagnostic column of metrics.csv, generically (indexed families such as `tau_<i>` or
`herd_dist_<i>` drawn together); a clients × labels heatmap of each partition (recomputed
from the run's config); and the summary tables. Paper-specific figures plug in through
`EXTRA_PLOTTERS`: algorithm name → `"module:function"`, imported only when a run of that
algorithm is in the report; the function gets `(runs: list[RunData], out: Path)` and returns
`[(caption, png_path), ...]`.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.algorithms.base import ALGORITHMS
from fedhet.data.partition import label_counts
from fedhet.engine.config import config_of
from fedhet.engine.federate import federate
from fedhet.engine.store import TIME_COLUMNS, atomic_write_text
from fedhet.errors import FedhetError
from fedhet.experiments import papers  # noqa: F401  (registers the papers' figures)
from fedhet.experiments.figures import EXTRA_PLOTTERS, slug
from fedhet.experiments.grid import read_manifest
from fedhet.experiments.presets import RunSpec
from fedhet.experiments.report_settings import component, group_header, summarize
from fedhet.experiments.results import (
    BOLD_RULE,
    compare_published,
    read_metrics,
    run_result,
    summary_tables,
    tables_html,
    uncovered_published,
)
from fedhet.registry import params_dict

STANDARD = {
    "round", "test_loss", "test_accuracy", "lr", "uplink_bytes", "downlink_bytes", "peer_bytes",
    "cum_bytes", "model_transfers", "cum_model_transfers", "round_time_s", "wall_time_s",
    "train_loss", "train_accuracy", *TIME_COLUMNS,
}
MAX_PANELS = 24
MAX_HEATMAPS = 12


@dataclass
class RunData:
    name: str
    group: str
    label: str
    dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    metrics: dict[str, list[float]]

    @property
    def algorithm(self) -> str:
        return str(self.config.get("algorithm", ""))


# -- finding runs ----------------------------------------------------------------------------
def _load_run(path: Path, name: str, group: str, label: str) -> RunData | None:
    if not (path / "config.json").exists() or not (path / "metrics.csv").exists():
        return None
    config = json.loads((path / "config.json").read_text())
    summary_path = path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return RunData(name, group, label or config.get("algorithm", name), path, config, summary,
                   read_metrics(path / "metrics.csv"))


def discover(root: Path) -> tuple[dict[str, Any], list[RunData]]:
    """The manifest (or a made-up one) and the runs of a run, grid or preset directory."""
    if (root / "config.json").exists():
        run = _load_run(root, root.name, "", "")
        return {"title": root.name, "target_accuracy": None}, [run] if run else []
    manifest = read_manifest(root)
    if manifest is not None:
        runs = [
            _load_run(root / "runs" / r["name"], r["name"], r["group"], r["label"])
            for r in manifest["runs"]
        ]
        return manifest, [r for r in runs if r is not None]
    found = sorted(p.parent for p in root.rglob("config.json"))
    runs = []
    for p in found:
        run = _load_run(p, str(p.relative_to(root)), "", "")
        if run is not None:
            c = run.config
            run.group = f"{c.get('dataset')}/{component(c.get('partition'), c.get('partition_params'))}"
            runs.append(run)
    return {"title": root.name, "target_accuracy": None}, runs


# -- figures -----------------------------------------------------------------------------------
def _plt():
    # slow import (matplotlib): only when drawing
    import matplotlib

    matplotlib.use("Agg")
    # slow import (matplotlib): only when drawing
    import matplotlib.pyplot as plt

    return plt


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")


def _styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """Per method a colour, a dash style and a marker, so that two lines drawn over each
    other (FedAvg under an identical FedProx) both stay visible."""
    cmap = _plt().get_cmap("tab10" if len(labels) <= 10 else "tab20")
    n = max(len(labels) - 1, 1)
    return {
        # earlier methods drawn wider with bigger markers: they show around a later line on top
        label: {"color": cmap(i % cmap.N), "linestyle": LINESTYLES[i % len(LINESTYLES)],
                "marker": MARKERS[i % len(MARKERS)], "lw": 1.4 + 1.6 * (n - i) / n,
                "markersize": 3.5 + 3.5 * (n - i) / n}
        for i, label in enumerate(labels)
    }


def _colors(labels: list[str]) -> dict[str, Any]:
    return {k: v["color"] for k, v in _styles(labels).items()}


ACCURACY_SCALE = 100.0
"""Accuracies are shown in percent everywhere on a page (plots and tables)."""


def _series(runs: list[RunData], x_col: str, y_col: str, scale: float = 1.0):
    """Mean, min and max of `y_col` (times `scale`) over runs (seeds), on the rounds all of
    them reached and all of them logged."""

    n = min(len(r.metrics.get("round", [])) for r in runs)
    if n == 0 or any(y_col not in r.metrics for r in runs):
        return None
    ys = np.array([r.metrics[y_col][:n] for r in runs], dtype=float) * scale
    xs = np.array([r.metrics.get(x_col, [math.nan] * n)[:n] for r in runs], dtype=float)
    if x_col == "cum_bytes":
        xs = np.nan_to_num(xs, nan=0.0) / 1e6
    x = np.nanmean(xs, axis=0)
    ok = np.isfinite(ys).all(axis=0) & np.isfinite(x)
    if not ok.any():
        return None
    return x[ok], ys.mean(axis=0)[ok], ys.min(axis=0)[ok], ys.max(axis=0)[ok]


def _figure_legend(fig: Any, handles: dict[str, Any]) -> float:
    """One legend for the whole figure, below its panels (never over a line); returns the
    share of the figure's height it takes."""
    if not handles:
        return 0.0
    ncol = min(4, len(handles))
    rows = math.ceil(len(handles) / ncol)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8,
               frameon=False)
    return (0.28 * rows + 0.1) / fig.get_figheight()


def _integer_ticks(ax: Any) -> None:
    """Rounds are whole numbers: no 1.5 on a round axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _markevery(n: int) -> int:
    return max(1, n // 10)


def coinciding(runs: list[RunData], column: str = "test_accuracy", tol: float = 0.5) -> list[list[str]]:
    """Methods whose mean `column` curves lie within `tol` (percentage points for accuracy)
    of each other at every round: drawn over each other, so the caption names them."""
    labels = list(dict.fromkeys(r.label for r in runs))
    curves = {}
    for label in labels:
        s = _series([r for r in runs if r.label == label], "round", column, ACCURACY_SCALE)
        if s is not None:
            curves[label] = s
    sets: list[list[str]] = []
    for label, (x, mean, _, _) in curves.items():
        for group in sets:
            gx, gmean, _, _ = curves[group[0]]
            if len(gx) == len(x) and np.array_equal(gx, x) and np.all(np.abs(gmean - mean) <= tol):
                group.append(label)
                break
        else:
            sets.append([label])
    return [g for g in sets if len(g) > 1]


def has_train_loss(runs: list[RunData]) -> bool:
    return any(math.isfinite(v) for r in runs for v in r.metrics.get("train_loss", []))


def plot_curves(runs: list[RunData], path: Path, title: str, styles: dict[str, Any]) -> None:
    """2×2: accuracy (%) and loss against the round and against communication (MB); a line per
    method (mean over seeds), band min–max over seeds; train loss thin and faded where logged."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [
        (axes[0, 0], "round", "test_accuracy", "round", "test accuracy (%)"),
        (axes[0, 1], "cum_bytes", "test_accuracy", "communication (MB)", "test accuracy (%)"),
        (axes[1, 0], "round", "test_loss", "round", "loss (cross-entropy)"),
        (axes[1, 1], "cum_bytes", "test_loss", "communication (MB)", "loss (cross-entropy)"),
    ]
    labels = list(dict.fromkeys(r.label for r in runs))
    for ax, x_col, y_col, xlabel, ylabel in panels:
        for label in labels:
            mine = [r for r in runs if r.label == label]
            seeds = f" ({len(mine)} seeds)" if len(mine) > 1 else ""
            style = styles[label] if isinstance(styles[label], dict) else {"color": styles[label]}
            columns = [(y_col, "", 1.0)]
            if y_col == "test_loss":
                columns.append(("train_loss", " train", 0.45))
            for col, suffix, alpha in columns:
                scale = ACCURACY_SCALE if "accuracy" in col else 1.0
                s = _series(mine, x_col, col, scale)
                if s is None:
                    continue
                x, mean, lo, hi = s
                look = {**style, "lw": style.get("lw", 1.6) if alpha == 1.0 else 1.0}
                ax.plot(x, mean, label=f"{label}{suffix}{seeds}", alpha=alpha,
                        markevery=_markevery(len(x)), **look)
                if len(mine) > 1 and alpha == 1.0:
                    ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if x_col == "round":
            _integer_ticks(ax)
    if has_train_loss(runs):
        axes[1, 0].set_title("loss (thick: test; thin, faded: train)", fontsize=9)
    handles, names = axes[0, 0].get_legend_handles_labels()
    if has_train_loss(runs):
        handles, names = axes[1, 0].get_legend_handles_labels()
    bottom = _figure_legend(fig, dict(zip(names, handles, strict=True)))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def diagnostic_families(columns: list[str]) -> dict[str, list[str]]:
    """Non-standard metrics columns grouped for plotting: `tau_0, tau_1, …` → `tau_*`."""
    families: dict[str, list[str]] = {}
    for col in columns:
        if col in STANDARD or col.endswith(("_transfers", "_bytes")):
            continue
        m = re.fullmatch(r"(.*?)_?(\d+)", col)
        if col.startswith(("test_accuracy", "test_loss")):
            key = col.split("_")[0] + "_" + col.split("_")[1] + " (extra models)"
        else:
            key = f"{m.group(1)}_*" if m and m.group(1) else col
        families.setdefault(key, []).append(col)
    for key, cols in families.items():
        if key.endswith("(extra models)"):
            cols.insert(0, key.split(" ")[0])
    return families


DIAGNOSTIC_AXES: dict[str, tuple[str, str]] = {
    # family → (panel title, y-axis label with its unit)
    "local_steps_mean": ("local SGD steps per client (mean)", "steps"),
    "local_train_loss": ("local training loss (mean over clients)", "loss (cross-entropy)"),
    "clients_sampled": ("clients sampled", "clients"),
    "clients_returned": ("clients returned", "clients"),
    "clients_dropped": ("clients dropped", "clients"),
    "clients_late": ("clients late (stragglers)", "clients"),
    "clients_failed": ("clients failed", "clients"),
    "tau_*": ("local steps τ_i per client", "steps"),
    "tau_k": ("local steps τ_k", "steps"),
    "tau_sum": ("local steps, sum over clients", "steps"),
    "tau_eff": ("effective local steps τ_eff", "steps"),
    "kept_*": ("local gradients kept per client", "gradients"),
    "herd_dist_*": ("herding distance ‖G_i − mean g‖ per client", "L2 norm"),
    "herd_fallbacks": ("herding fallbacks", "clients"),
    "c_norm": ("control variate ‖c‖", "L2 norm"),
    "edges": ("edge servers aggregated", "edges"),
    "ring_hops": ("ring hops", "hops"),
    "beta_*": ("β_i per client", "β (unitless)"),
    "delta_*": ("δ_i per client", "δ (unitless)"),
    "A_*": ("A_i per client", "A (unitless)"),
    "L_k": ("smoothness estimate L_k", "L (gradient Lipschitz estimate)"),
    "L_max": ("smoothness estimate L_max", "L (gradient Lipschitz estimate)"),
    "eta_tau_L": ("η τ_k L", "η τ L (unitless)"),
    "test_accuracy (extra models)": ("test accuracy of each model", "test accuracy (%)"),
    "test_loss (extra models)": ("test loss of each model", "loss (cross-entropy)"),
    "N": ("N = ‖Σ p_i Δ_i‖ (norm of the mean update)", "L2 norm"),
    "E": ("E = Σ p_i ‖Δ_i‖ (mean norm of the updates)", "L2 norm"),
    "N_fc": ("N, fully connected layers", "L2 norm"),
    "E_fc": ("E, fully connected layers", "L2 norm"),
    "N_conv": ("N, convolutional layers", "L2 norm"),
    "E_conv": ("E, convolutional layers", "L2 norm"),
    "move": ("distance the global model moved", "L2 norm"),
    "move_fc": ("distance moved, fully connected layers", "L2 norm"),
    "move_conv": ("distance moved, convolutional layers", "L2 norm"),
    "cum_move": ("cumulative distance moved", "L2 norm"),
    "scale": ("server step scale β E / N", "factor (unitless)"),
    "skipped": ("round skipped (N < ε E)", "1 = skipped, 0 = not"),
}
"""Titles and y labels of the known diagnostic families; others are titled by their column
and labelled `value as logged`."""


def diagnostic_axes(family: str) -> tuple[str, str]:
    """`(title, y label)` of a diagnostic panel."""
    return DIAGNOSTIC_AXES.get(family, (family, f"{family} (as logged)"))


def constant_columns(runs: list[RunData], columns: list[str]) -> dict[str, float | None]:
    """The columns whose finite values are one number in every run (→ that number), or that
    have no finite value at all (→ None): flat lines that say nothing, left out of the plots."""
    out: dict[str, float | None] = {}
    for col in columns:
        values = {v for r in runs for v in r.metrics.get(col, []) if math.isfinite(v)}
        if len(values) <= 1:
            out[col] = next(iter(values), None)
    return out


@dataclass
class Panel:
    """One diagnostic panel: a family's columns; `label` set when the panel shows one method's
    per-client columns, None when it has a line per method."""

    family: str
    label: str | None
    lines: list[tuple[str, str, list[RunData]]]
    per_method: bool
    """True: a line per method (legend shared by the figure); False: a line per column."""
    """(legend, column, the runs (seeds) averaged)."""


def diagnostic_panels(runs: list[RunData]) -> tuple[list[Panel], dict[str, list[float | None]]]:
    """The panels of one setting's diagnostics, and the columns left out as constant.

    A one-column family (`clients_dropped`, `tau_eff`) is one panel with a line per method; an
    indexed family (`tau_<i>`, one column per client) is a panel per method with a line per
    column. A method's column whose seeds never change it is left out; the second value maps
    each such column to the constant values it had (None: never logged).
    """
    labels = list(dict.fromkeys(r.label for r in runs))
    by_label = {label: [r for r in runs if r.label == label] for label in labels}
    columns = list(dict.fromkeys(c for r in runs for c in r.metrics))
    flat: dict[str, list[float | None]] = {}
    changing: dict[str, list[str]] = {}
    for label, mine in by_label.items():
        have = [c for fam in diagnostic_families(columns).values() for c in fam
                if any(c in r.metrics for r in mine)]
        const = constant_columns(mine, have)
        for col, value in const.items():
            flat.setdefault(col, []).append(value)
        changing[label] = [c for c in have if c not in const]
    panels = []
    for family, cols in diagnostic_families(columns).items():
        if len(cols) == 1 and not family.endswith("(extra models)"):
            lines = [(label, cols[0], by_label[label]) for label in labels if cols[0] in changing[label]]
            if lines:
                panels.append(Panel(family, None, lines, True))
            continue
        for label in labels:
            lines = [(col, col, by_label[label]) for col in cols if col in changing[label]]
            if lines:
                panels.append(Panel(family, label if len(labels) > 1 else None, lines, False))
    return panels, flat


def plot_diagnostics(runs: RunData | list[RunData], path: Path, title: str = "",
                     styles: dict[str, Any] | None = None) -> bool:
    """The diagnostic panels of one setting (see `diagnostic_panels`): each line the mean over
    seeds with a band min–max, as the accuracy curves; y axes labelled with units. False when
    nothing changes, so there is nothing to draw."""
    runs = [runs] if isinstance(runs, RunData) else list(runs)
    panels, _ = diagnostic_panels(runs)
    if not panels:
        return False
    plt = _plt()
    styles = styles or _styles(list(dict.fromkeys(r.label for r in runs)))
    items = panels[:MAX_PANELS]
    ncols = min(3, len(items))
    nrows = math.ceil(len(items) / ncols)
    width = max(4.2 * ncols, 8.0)
    n_methods = len({r.label for r in runs})
    extra = 0.6 + 0.3 * math.ceil(n_methods / 4)  # the title and the legend below the panels
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.0 * nrows + extra), squeeze=False)
    cmap = plt.get_cmap("viridis")
    shared_legend: dict[str, Any] = {}
    for ax, panel in zip(axes.flat, items, strict=False):
        name, ylabel = diagnostic_axes(panel.family)
        scale = ACCURACY_SCALE if "accuracy" in panel.family else 1.0
        per_method = panel.per_method
        n = len(panel.lines)
        for j, (legend, col, mine) in enumerate(panel.lines):
            got = _series(mine, "round", col, scale)
            if got is None:
                continue
            x, mean, lo, hi = got
            if per_method:
                style = dict(styles[legend]) if isinstance(styles.get(legend), dict) else {"color": f"C{j}"}
                style.setdefault("marker", ".")
            else:
                style = {"color": cmap(j / max(n - 1, 1)) if n > 1 else "C0",
                         "marker": "." if len(x) < 40 else None}
            style.setdefault("lw", 1.0 if n > 8 else 1.5)
            ax.plot(x, mean, markevery=_markevery(len(x)), label=legend, **style)
            if len(mine) > 1 and (per_method or n <= 2):
                ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
        if per_method:
            for handle, legend_name in zip(*ax.get_legend_handles_labels(), strict=True):
                shared_legend.setdefault(legend_name, handle)
        elif 1 < n <= 8:
            ax.legend(fontsize=7)
        elif n > 8:
            ax.text(0.99, 0.02, f"{n} clients", transform=ax.transAxes, ha="right", fontsize=7)
        ax.set_title(name + (f" — {panel.label}" if panel.label else ""), fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        _integer_ticks(ax)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    seeds = max(sum(1 for r in runs if r.label == label) for label in {r.label for r in runs})
    head = title or (runs[0].group or runs[0].name)
    fig.suptitle(textwrap.fill(f"diagnostics: {head}" + (f", mean over {seeds} seeds" if seeds > 1 else ""),
                               int(width * 11)), fontsize=10)
    bottom = _figure_legend(fig, shared_legend)
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def partition_counts(config: dict[str, Any]):
    """`(counts[client, class], title)` recomputed from a run's config, or None (centralised)."""

    cfg = config_of(dict(config))
    if ALGORITHMS.get(cfg.algorithm).factory.centralized:
        return None
    fed = federate(cfg, cache=True)
    data, parts = fed.data, fed.parts
    counts = label_counts(data.split_labels, parts, data.split_classes)
    extra = ", ".join(f"{k}={v}" for k, v in params_dict(cfg.partition_params).items())
    title = f"{cfg.dataset} / {cfg.partition}" + (f" ({extra})" if extra else "") + f", seed {cfg.seed}"
    return counts, title


def plot_partition(counts, title: str, path: Path) -> None:
    plt = _plt()
    n_clients, n_classes = counts.shape
    height = min(max(2.5, 0.22 * n_clients + 1.2), 14)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, height), width_ratios=[3, 1], sharey=True)
    im = ax.imshow(counts, aspect="auto", cmap="Blues", interpolation="nearest")
    ax.set_xlabel("label")
    ax.set_ylabel("client")
    ax.set_xticks(range(n_classes) if n_classes <= 20 else np.linspace(0, n_classes - 1, 6).astype(int))
    if n_clients * n_classes <= 400:
        peak = counts.max() or 1
        for (i, j), v in np.ndenumerate(counts):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=6,
                        color="white" if v > 0.6 * peak else "black")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    bx.barh(range(n_clients), counts.sum(axis=1), color="gray")
    bx.set_xlabel("samples")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
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
"""


def _figure(src: str, caption: str) -> str:
    return (f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _table(header: list[str], rows: list[list[Any]], cls: str = "") -> str:
    """A table inside a horizontally scrolling box, so a wide one is never cut off."""
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


def write_report(root: Path, out: Path | None = None, warn: Callable[[str], None] | None = None) -> Path:
    """Write `report.html` and its PNGs into `out` (default `root`); returns the page's path."""
    warn = warn or (lambda m: print(m, file=sys.stderr))
    if not root.is_dir():
        raise FedhetError(f"{root} is not a directory; give a run or grid directory")
    manifest, runs = discover(root)
    if not runs:
        raise FedhetError(f"no runs found in {root} (a run directory has config.json and metrics.csv)")
    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("fig_*.png"):
        old.unlink()
    title = str(manifest.get("title") or root.name)
    sections = [_settings_section(runs), _tables_section(manifest, runs)]
    sections.append(_curves_section(runs, out))
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

    page_path = out / "report.html"
    atomic_write_text(page_path, page)
    return page_path


def _settings_section(runs: list[RunData]) -> str:
    """What was compared: the settings every run shares, those that vary (with their values),
    each algorithm's parameters, and what sets each table column apart."""
    configs = [r.config for r in runs]
    summary = summarize(configs)
    parts = ["<h2>Settings</h2>"]
    if len(runs) > 1:
        parts.append(f"<p>Shared by all {len(runs)} runs:</p>")
    parts.append(_table(["setting", "value"], [[k, v] for k, v in summary.shared.items()], "settings"))
    if summary.varying:
        parts.append("<p>Varying between runs:</p>")
        parts.append(_table(["setting", "values"],
                            [[k, ", ".join(v)] for k, v in summary.varying.items()], "settings"))
    parts.append("<p>Algorithm parameters:</p>")
    parts.append(_table(["algorithm", "parameters"],
                        [[a, p] for a, p in summary.algorithms.items()], "settings"))
    groups = list(dict.fromkeys(r.group for r in runs))
    if len(groups) > 1:
        rows = [[g or "(none)", group_header([r.config for r in runs if r.group == g], configs)]
                for g in groups]
        parts.append("<p>Table columns (settings), and what sets each apart:</p>")
        parts.append(_table(["column", "settings of its runs that differ from other columns'"],
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


def _run_cell(row: dict[str, Any], key: str, scale: float | None) -> Any:
    v = row.get(key, "")
    if scale is not None and isinstance(v, int | float) and not isinstance(v, bool):
        v = float(v) * scale
        return "" if math.isnan(v) else f"{v:.2f}"
    return v


def _tables_section(manifest: dict[str, Any], runs: list[RunData]) -> str:
    target = manifest.get("target_accuracy")
    specs = [RunSpec(r.name, r.group, r.label, {"algorithm": r.algorithm}) for r in runs]
    rows = [run_result(s, r.dir, target) for s, r in zip(specs, runs, strict=True)]
    parts = ["<h2>Summary</h2>"]
    if len(runs) > 1:
        parts.append(f"<p>Mean ± std over seeds. {html.escape(BOLD_RULE)}</p>")
        parts.append(tables_html(summary_tables(rows, target)))
    published = manifest.get("published") or []
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
    parts.append("<h3>Runs</h3>")
    parts.append(_table([h for _, h, _ in RUN_KEYS],
                        [[_run_cell(r, k, sc) for k, _, sc in RUN_KEYS] for r in rows]))
    if len(runs) == 1:
        cfg = runs[0].config
        flat = [[k, json.dumps(v) if isinstance(v, dict | list) else v] for k, v in cfg.items()]
        parts.append("<details><summary>Configuration: every key of config.json</summary>"
                     + _table(["setting", "value"], flat, "settings") + "</details>")
    return "\n".join(parts)


def _curves_section(runs: list[RunData], out: Path) -> str:
    styles = _styles(list(dict.fromkeys(r.label for r in runs)))
    parts = ["<h2>Accuracy and loss</h2>"]
    for group in dict.fromkeys(r.group for r in runs):
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
    return "\n".join(parts)


def _diagnostics_section(runs: list[RunData], out: Path) -> str:
    """A figure per setting (table column): the diagnostics that change, a line per method."""
    styles = _styles(list(dict.fromkeys(r.label for r in runs)))
    parts = []
    flat_all: dict[str, list[float | None]] = {}
    logged: dict[str, int] = {}  # column → method × setting cells that log it
    for group in dict.fromkeys(r.group for r in runs):
        mine = [r for r in runs if r.group == group]
        for label in dict.fromkeys(r.label for r in mine):
            for col in dict.fromkeys(c for r in mine if r.label == label for c in r.metrics):
                logged[col] = logged.get(col, 0) + 1
        _, flat = diagnostic_panels(mine)
        for col, values in flat.items():
            flat_all.setdefault(col, []).extend(values)
        name = f"fig_diag_{slug(group or mine[0].name)}.png"
        if plot_diagnostics(mine, out / name, group or mine[0].name, styles):
            n = max(sum(1 for r in mine if r.label == label) for label in {r.label for r in mine})
            seeds = f"mean over {n} seeds, band min–max" if n > 1 else "one seed"
            parts.append(_figure(name, f"{group or mine[0].name}: diagnostic columns of metrics.csv "
                                       f"that change ({seeds})"))
    if flat_all:
        described = []
        for col, values in flat_all.items():
            shown = sorted({_short(v) if v is not None else "empty" for v in values})
            where = ("" if len(values) == logged.get(col, 0) else
                     f" (in {len(values)} of the {logged[col]} method × setting cells that log it)")
            described.append(f"{col} = {' or '.join(shown)}{where}")
        parts.append('<p class="note">Not drawn, never changing: ' + html.escape("; ".join(described))
                     + ".</p>")
    return "<h2>Diagnostics</h2>\n" + "\n".join(parts) if parts else ""


def _partition_section(runs: list[RunData], out: Path, warn: Callable[[str], None]) -> str:
    parts, seen = [], set()
    for run in runs:
        c = run.config
        key = json.dumps([c.get(k) for k in ("dataset", "dataset_params", "partition",
                                              "partition_params", "clients")], sort_keys=True)
        if key in seen or len(seen) >= MAX_HEATMAPS:
            continue
        try:
            got = partition_counts(c)
        except Exception as e:  # noqa: BLE001  (missing data files: say so, draw the rest)
            seen.add(key)
            msg = f"partition of {run.name} not drawn: {e}"
            warn(f"warning: {msg}")
            parts.append(f'<p class="warn">{html.escape(msg)}</p>')
            continue
        if got is None:  # centralised: no partition, but a federated run may share the key
            continue
        seen.add(key)
        name = f"fig_partition_{len(seen)}.png"
        plot_partition(*got, out / name)
        parts.append(_figure(name, f"{got[1]}: samples per client and label (run {run.name})"))
    return "<h2>Partitions</h2>\n" + "\n".join(parts) if parts else ""


def _extra_section(runs: list[RunData], out: Path, warn: Callable[[str], None]) -> str:
    parts = []
    for algorithm in dict.fromkeys(r.algorithm for r in runs):
        try:
            plotter = EXTRA_PLOTTERS.get(algorithm)
            if plotter is None:
                continue
            figures = plotter([r for r in runs if r.algorithm == algorithm], out)
        except Exception as e:  # noqa: BLE001  (a broken paper plot must not lose the report)
            msg = f"{algorithm} plots failed: {type(e).__name__}: {e}"
            warn(f"warning: {msg}")
            parts.append(f'<p class="warn">{html.escape(msg)}</p>')
            continue
        for caption, path in figures:
            parts.append(_figure(str(Path(path).relative_to(out)), caption))
    return "<h2>Paper figures</h2>\n" + "\n".join(parts) if parts else ""
