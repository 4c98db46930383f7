"""The diagnostics panels of `fedhet report`: every non-standard column of metrics.csv (but the
per-client and metric columns, `fedhet.reports.clients`), found
generically (indexed families such as `tau_<i>` drawn together), the ones that change only,
averaged over seeds as the accuracy curves are, with titles and y units.

An indexed family holds one column per client (`tau_3` is client 3's τ). Client 3 is the same
client in two runs only when their data splits are the same (`split_key`); per-client panels
are therefore averaged over seeds only where the split is, and drawn per seed otherwise."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.reports.clients import is_evaluation_column
from fedhet.reports.plots import (
    ACCURACY_SCALE,
    RunData,
    figure_legend,
    fit_suptitle,
    fit_title,
    integer_ticks,
    markevery,
    method_styles,
    pyplot,
    seed_band,
)
from fedhet.rundir import TIME_COLUMNS

STANDARD = {
    "round", "test_loss", "test_accuracy", "lr", "uplink_bytes", "downlink_bytes", "peer_bytes",
    "cum_bytes", "model_transfers", "cum_model_transfers", "round_time_s", "wall_time_s",
    "train_loss", "train_accuracy", *TIME_COLUMNS,
}
MAX_PANELS = 24
MAX_SEEDS = 3
"""Per-client panels of runs with different splits: drawn for this many seeds at most."""


def diagnostic_families(columns: list[str]) -> dict[str, list[str]]:
    """Non-standard metrics columns grouped for plotting: `tau_0, tau_1, …` → `tau_*`."""
    families: dict[str, list[str]] = {}
    for col in columns:
        if col in STANDARD or col.endswith(("_transfers", "_bytes")) or is_evaluation_column(col):
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
    "herd_cos": ("herd drift: cos(G_i, μ_i), mean over clients", "cosine (unitless)"),
    "herd_norm_ratio": ("herd drift: ‖G_i‖ / ‖μ_i‖, mean over clients", "ratio (unitless)"),
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


SPLIT_KEYS = ("dataset", "dataset_params", "partition", "partition_params", "clients", "seed",
              "validation_fraction", "data_dir")
"""The settings that decide which samples each client holds (`federate`)."""


def split_key(run: RunData) -> str:
    """Runs with equal keys hold the same data split, so client i is the same client in them."""
    return json.dumps([run.config.get(k) for k in SPLIT_KEYS], sort_keys=True, default=str)


@dataclass
class Panel:
    """One diagnostic panel: a family's columns; `label` set when the panel shows one method's
    per-client columns, None when it has a line per method."""

    family: str
    label: str | None
    lines: list[tuple[str, str, list[RunData]]]
    """(legend, column, the runs (seeds) averaged)."""
    per_method: bool
    """True: a line per method (legend shared by the figure); False: a line per column."""
    seed: Any = None
    """Per-client panels of runs whose splits differ: the one seed drawn (None: all seeds)."""


def diagnostic_panels(runs: list[RunData]) -> tuple[list[Panel], dict[str, list[float | None]]]:
    """The panels of one setting's diagnostics, and the columns left out as constant.

    A one-column family (`clients_dropped`, `tau_eff`) is one panel with a line per method; an
    indexed family (`tau_<i>`, one column per client) is a panel per method with a line per
    column, averaged over the method's seeds when they share one data split (`split_key`), else
    a panel per seed (the first `MAX_SEEDS`); they follow the one-column panels. A method's
    column whose seeds never change it is left out; the second value maps each such column to
    the constant values it had (None: never logged).
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
    panels, per_client = [], []
    for family, cols in diagnostic_families(columns).items():
        if len(cols) == 1 and not family.endswith("(extra models)"):
            lines = [(label, cols[0], by_label[label]) for label in labels if cols[0] in changing[label]]
            if lines:
                panels.append(Panel(family, None, lines, True))
            continue
        for label in labels:
            mine = by_label[label]
            same = len({split_key(r) for r in mine}) == 1
            for runs_drawn in [mine] if same else [[r] for r in mine[:MAX_SEEDS]]:
                lines = [(col, col, runs_drawn) for col in cols
                         if col in changing[label] and col in runs_drawn[0].metrics]
                if lines:
                    seed = None if same else runs_drawn[0].config.get("seed", runs_drawn[0].name)
                    per_client.append(Panel(family, label if len(labels) > 1 else None, lines, False, seed))
    return panels + per_client, flat


def plot_diagnostics(runs: RunData | list[RunData], path: Path, title: str = "",
                     styles: dict[str, Any] | None = None) -> bool:
    """The diagnostic panels of one setting (see `diagnostic_panels`): each line the mean over
    seeds with a band min–max, as the accuracy curves; y axes labelled with units. False when
    nothing changes, so there is nothing to draw."""
    runs = [runs] if isinstance(runs, RunData) else list(runs)
    panels, _ = diagnostic_panels(runs)
    if not panels:
        return False
    plt = pyplot()
    styles = styles or method_styles(list(dict.fromkeys(r.label for r in runs)))
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
        _draw_panel(ax, panel, styles, cmap, shared_legend)
    for ax in list(axes.flat)[len(items):]:
        ax.set_visible(False)
    seeds = max(sum(1 for r in runs if r.label == label) for label in {r.label for r in runs})
    head = title or (runs[0].group or runs[0].name)
    top = fit_suptitle(fig, f"diagnostics: {head}" + (f", mean over {seeds} seeds" if seeds > 1 else ""), 10)
    bottom = figure_legend(fig, shared_legend)
    fig.tight_layout(rect=(0, bottom, 1, 1 - top))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def _draw_panel(ax: Any, panel: Panel, styles: dict[str, Any], cmap: Any,
                shared_legend: dict[str, Any]) -> None:
    """One panel on `ax`: each line the mean over seeds with a band min–max, coloured by method
    (`styles`, and its handles kept in `shared_legend` for the figure's legend) or along
    `cmap` (one line per client, with a legend of its own when there are few), then its title,
    axis labels and grid."""
    name, ylabel = diagnostic_axes(panel.family)
    scale = ACCURACY_SCALE if "accuracy" in panel.family else 1.0
    per_method = panel.per_method
    n = len(panel.lines)
    for j, (legend, col, mine) in enumerate(panel.lines):
        got = seed_band(mine, "round", col, scale)
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
        ax.plot(x, mean, markevery=markevery(len(x)), label=legend, **style)
        if len(mine) > 1 and (per_method or n <= 2):
            ax.fill_between(x, lo, hi, color=style["color"], alpha=0.15, lw=0)
    if per_method:
        for handle, legend_name in zip(*ax.get_legend_handles_labels(), strict=True):
            shared_legend.setdefault(legend_name, handle)
    elif 1 < n <= 8:
        ax.legend(fontsize=7)
    elif n > 8:
        ax.text(0.99, 0.02, f"{n} clients", transform=ax.transAxes, ha="right", fontsize=7)
    where = ", ".join(str(x) for x in (panel.label, None if panel.seed is None else f"seed {panel.seed}")
                      if x is not None)
    fit_title(ax, name + (f" — {where}" if where else ""), 9)
    ax.set_xlabel("round", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    integer_ticks(ax)
    ax.grid(alpha=0.3)
