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
from fedhet.experiments.results import (
    compare_published,
    read_metrics,
    run_result,
    summary_tables,
    tables_html,
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
            run.group = f"{run.config.get('dataset')}/{run.config.get('partition')}"
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


def _colors(labels: list[str]) -> dict[str, Any]:
    cmap = _plt().get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _series(runs: list[RunData], x_col: str, y_col: str):
    """Mean, min and max of `y_col` over runs (seeds), on the rounds all of them reached."""

    n = min(len(r.metrics.get("round", [])) for r in runs)
    if n == 0 or any(y_col not in r.metrics for r in runs):
        return None
    ys = np.array([r.metrics[y_col][:n] for r in runs], dtype=float)
    xs = np.array([r.metrics.get(x_col, [math.nan] * n)[:n] for r in runs], dtype=float)
    if x_col == "cum_bytes":
        xs = np.nan_to_num(xs, nan=0.0) / 1e6
    x = np.nanmean(xs, axis=0)
    ok = np.isfinite(ys).all(axis=0) & np.isfinite(x)
    if not ok.any():
        return None
    return x[ok], ys.mean(axis=0)[ok], ys.min(axis=0)[ok], ys.max(axis=0)[ok]


def plot_curves(runs: list[RunData], path: Path, title: str, colors: dict[str, Any]) -> None:
    """2×2: accuracy and loss against the round and against communication (MB)."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [
        (axes[0, 0], "round", "test_accuracy", "round", "test accuracy"),
        (axes[0, 1], "cum_bytes", "test_accuracy", "communication (MB)", "test accuracy"),
        (axes[1, 0], "round", "test_loss", "round", "loss"),
        (axes[1, 1], "cum_bytes", "test_loss", "communication (MB)", "loss"),
    ]
    labels = list(dict.fromkeys(r.label for r in runs))
    for ax, x_col, y_col, xlabel, ylabel in panels:
        for label in labels:
            mine = [r for r in runs if r.label == label]
            seeds = f" ({len(mine)} seeds)" if len(mine) > 1 else ""
            for col, style, suffix in ((y_col, "-", ""), ("train_loss", "--", " train")):
                if col == "train_loss" and y_col != "test_loss":
                    continue
                s = _series(mine, x_col, col)
                if s is None:
                    continue
                x, mean, lo, hi = s
                ax.plot(x, mean, style, color=colors[label], label=f"{label}{suffix}{seeds}", lw=1.6)
                if len(mine) > 1:
                    ax.fill_between(x, lo, hi, color=colors[label], alpha=0.15, lw=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1, 0].set_title("loss (solid: test, dashed: train)", fontsize=9)
    handles, names = axes[0, 0].get_legend_handles_labels()
    if handles:
        axes[0, 0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
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


def plot_diagnostics(run: RunData, path: Path) -> bool:
    """One panel per diagnostic family of one run; False when the run has none."""
    families = diagnostic_families(list(run.metrics))
    families = {
        k: v for k, v in families.items()
        if any(math.isfinite(x) for c in v for x in run.metrics.get(c, []))
    }
    if not families:
        return False
    plt = _plt()
    items = list(families.items())[:MAX_PANELS]
    ncols = min(3, len(items))
    nrows = math.ceil(len(items) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    rounds = run.metrics["round"]
    for ax, (family, cols) in zip(axes.flat, items, strict=False):
        cmap = plt.get_cmap("viridis")
        for j, col in enumerate(cols):
            pts = [(r, v) for r, v in zip(rounds, run.metrics[col], strict=True) if math.isfinite(v)]
            if not pts:
                continue
            color = cmap(j / max(len(cols) - 1, 1)) if len(cols) > 1 else "C0"
            ax.plot(*zip(*pts, strict=True), color=color, lw=1.0 if len(cols) > 1 else 1.6,
                    marker="." if len(pts) < 40 else None, label=col)
        if 1 < len(cols) <= 8:
            ax.legend(fontsize=7)
        elif len(cols) > 8:
            ax.text(0.99, 0.02, f"{len(cols)} clients", transform=ax.transAxes, ha="right", fontsize=7)
        ax.set_title(family, fontsize=10)
        ax.set_xlabel("round", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    fig.suptitle(f"diagnostics: {run.label} [{run.group or run.name}]", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
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
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
tr th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
figure{margin:1em 0}figcaption{font-size:13px;color:#555}.warn{color:#a40}
"""


def _figure(src: str, caption: str) -> str:
    return (f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(_short(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>\n{body}\n</table>"


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
    sections = [_tables_section(manifest, runs)]
    sections.append(_curves_section(runs, out))
    sections.append(_diagnostics_section(runs, out))
    sections.append(_partition_section(runs, out, warn))
    sections.append(_extra_section(runs, out, warn))
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    page = (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n<p>{len(runs)} run(s) in <code>{html.escape(str(root))}</code>; "
        f"generated {stamp} by <code>fedhet report</code>.</p>\n"
        + "\n".join(s for s in sections if s) + "\n</body></html>\n"
    )

    page_path = out / "report.html"
    atomic_write_text(page_path, page)
    return page_path


def _tables_section(manifest: dict[str, Any], runs: list[RunData]) -> str:
    target = manifest.get("target_accuracy")
    specs = [RunSpec(r.name, r.group, r.label, {"algorithm": r.algorithm}) for r in runs]
    rows = [run_result(s, r.dir, target) for s, r in zip(specs, runs, strict=True)]
    parts = ["<h2>Summary</h2>"]
    if len(runs) > 1:
        parts.append("<p>Mean ± std over seeds; best per column in bold.</p>")
        parts.append(tables_html(summary_tables(rows, target)))
    published = manifest.get("published") or []
    if published:
        parts.append("<h2>Published vs ours</h2>")
        cmp = compare_published(rows, published)
        parts.append(_table(["setting", "method", "metric", "paper", "ours", "source"],
                            [[c["group"], c["label"], c["metric"], c["paper"], c["ours"], c["source"]]
                             for c in cmp]))
    keys = ["name", "status", "final_accuracy", "best_accuracy", "best_round", "rounds_done",
            "rounds_to_target", "transfers_to_target", "cum_bytes", "wall_time_s"]
    parts.append("<h3>Runs</h3>")
    parts.append(_table(keys, [[r.get(k, "") for k in keys] for r in rows]))
    if len(runs) == 1:
        cfg = runs[0].config
        flat = [[k, json.dumps(v) if isinstance(v, dict | list) else v] for k, v in cfg.items()]
        parts.append("<h3>Configuration</h3>" + _table(["setting", "value"], flat))
    return "\n".join(parts)


def _curves_section(runs: list[RunData], out: Path) -> str:
    colors = _colors(list(dict.fromkeys(r.label for r in runs)))
    parts = ["<h2>Accuracy and loss</h2>"]
    for group in dict.fromkeys(r.group for r in runs):
        mine = [r for r in runs if r.group == group]
        name = f"fig_curves_{slug(group)}.png"
        plot_curves(mine, out / name, group or mine[0].name, colors)
        parts.append(_figure(name, f"{group or mine[0].name}: test accuracy and loss vs round and "
                                   "vs cumulative communication; band: min–max over seeds"))
    return "\n".join(parts)


def _diagnostics_section(runs: list[RunData], out: Path) -> str:
    parts = []
    seen = set()
    for run in runs:
        if (run.group, run.label) in seen:
            continue
        seen.add((run.group, run.label))
        name = f"fig_diag_{slug(run.name)}.png"
        if plot_diagnostics(run, out / name):
            parts.append(_figure(name, f"{run.label} [{run.group or run.name}], run {run.name}: "
                                       "every diagnostic column of metrics.csv"))
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
