"""Drawing for `fedhet report`: the runs as read from disk (`RunData`), one style per method,
and the accuracy/loss curves (a line per method, mean over seeds, band min–max)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


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


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (files, no window), imported on first use."""
    # slow import (matplotlib): only when drawing
    import matplotlib

    matplotlib.use("Agg")
    # slow import (matplotlib): only when drawing
    import matplotlib.pyplot as plt

    return plt


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")


def method_styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """Per method a colour, a dash style and a marker, so that two lines drawn over each
    other (FedAvg under an identical FedProx) both stay visible."""
    cmap = pyplot().get_cmap("tab10" if len(labels) <= 10 else "tab20")
    n = max(len(labels) - 1, 1)
    return {
        # earlier methods drawn wider with bigger markers: they show around a later line on top
        label: {"color": cmap(i % cmap.N), "linestyle": LINESTYLES[i % len(LINESTYLES)],
                "marker": MARKERS[i % len(MARKERS)], "lw": 1.4 + 1.6 * (n - i) / n,
                "markersize": 3.5 + 3.5 * (n - i) / n}
        for i, label in enumerate(labels)
    }


ACCURACY_SCALE = 100.0
"""Accuracies are shown in percent everywhere on a page (plots and tables)."""


def seed_band(runs: list[RunData], x_col: str, y_col: str, scale: float = 1.0):
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


def figure_legend(fig: Any, handles: dict[str, Any]) -> float:
    """One legend for the whole figure, below its panels (never over a line); returns the
    share of the figure's height it takes."""
    if not handles:
        return 0.0
    ncol = min(4, len(handles))
    rows = math.ceil(len(handles) / ncol)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8,
               frameon=False)
    return (0.28 * rows + 0.1) / fig.get_figheight()


def fit_suptitle(fig: Any, text: str, fontsize: float = 11) -> float:
    """The figure's title, wrapped until it fits the figure's width (a long setting name is
    never cut at the edges); returns the share of the figure's height it takes."""
    renderer = fig.canvas.get_renderer()
    room = 0.96 * fig.bbox.width
    chars = max(len(text), 1)
    while True:
        title = fig.suptitle(textwrap.fill(text, chars), fontsize=fontsize)
        if title.get_window_extent(renderer).width <= room or chars <= 16:
            break
        chars = max(16, int(chars * 0.85))
    lines = title.get_text().count("\n") + 1
    return (lines * fontsize * 1.3 / 72 + 0.12) / fig.get_figheight()


def fit_title(ax: Any, text: str, fontsize: float = 9) -> None:
    """An axes title wrapped to the axes' width."""
    fig = ax.figure
    width = ax.get_position().width * fig.get_figwidth() * 72
    chars = max(16, int(width / (0.58 * fontsize)))
    ax.set_title(textwrap.fill(text, chars), fontsize=fontsize)


def integer_ticks(ax: Any) -> None:
    """Rounds are whole numbers: no 1.5 on a round axis."""
    from matplotlib.ticker import MaxNLocator  # slow import (matplotlib): only when drawing

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def markevery(n: int) -> int:
    """Every how many of a line's `n` points a marker is drawn (about ten a line)."""
    return max(1, n // 10)


def coinciding(runs: list[RunData], column: str = "test_accuracy", tol: float = 0.5) -> list[list[str]]:
    """Methods whose mean `column` curves lie within `tol` (percentage points for accuracy)
    of each other at every round: drawn over each other, so the caption names them."""
    labels = list(dict.fromkeys(r.label for r in runs))
    curves = {}
    for label in labels:
        s = seed_band([r for r in runs if r.label == label], "round", column, ACCURACY_SCALE)
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
    plt = pyplot()
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
                s = seed_band(mine, x_col, col, scale)
                if s is None:
                    continue
                x, mean, lo, hi = s
                look = {**style, "lw": style.get("lw", 1.6) if alpha == 1.0 else 1.0}
                ax.plot(x, mean, label=f"{label}{suffix}{seeds}", alpha=alpha,
                        markevery=markevery(len(x)), **look)
                if len(mine) > 1 and alpha == 1.0:
                    ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if x_col == "round":
            integer_ticks(ax)
    if has_train_loss(runs):
        axes[1, 0].set_title("loss (thick: test; thin, faded: train)", fontsize=9)
    handles, names = axes[0, 0].get_legend_handles_labels()
    if has_train_loss(runs):
        handles, names = axes[1, 0].get_legend_handles_labels()
    bottom = figure_legend(fig, dict(zip(names, handles, strict=True)))
    top = fit_suptitle(fig, title, 12)
    fig.tight_layout(rect=(0, bottom, 1, 1 - top))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_overview(runs: list[RunData], path: Path, styles: dict[str, Any]) -> None:
    """Test accuracy (%) against the round, a small panel per setting (table column), a line
    per method (mean over seeds, band min–max): a grid page's curves at a glance."""
    plt = pyplot()
    groups = list(dict.fromkeys(r.group for r in runs))
    ncols = min(4, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    labels = list(dict.fromkeys(r.label for r in runs))
    legend_rows = math.ceil(len(labels) / 4)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.9 * ncols + 0.6, 2.5 * nrows + 0.4 + 0.3 * legend_rows),
                             squeeze=False, sharey=True)
    handles: dict[str, Any] = {}
    for ax, group in zip(axes.flat, groups, strict=False):
        for label in labels:
            mine = [r for r in runs if r.group == group and r.label == label]
            s = seed_band(mine, "round", "test_accuracy", ACCURACY_SCALE) if mine else None
            if s is None:
                continue
            x, mean, lo, hi = s
            style = {**styles[label], "lw": 1.4, "markersize": 3.5}
            seeds = f" ({len(mine)} seeds)" if len(mine) > 1 else ""
            (line,) = ax.plot(x, mean, markevery=markevery(len(x)), **style)
            handles.setdefault(f"{label}{seeds}", line)
            if len(mine) > 1:
                ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
        fit_title(ax, group or "all runs", 8)
        ax.set_xlabel("round", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        integer_ticks(ax)
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy (%)", fontsize=8)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    bottom = figure_legend(fig, handles)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
