"""The per-client and metrics figures of `fedhet report`.

Per-client evaluation (`client_eval_fraction`) writes, every evaluated round, the statistics of
the global model's accuracy over the clients' held-out shares (`client_acc_mean`, `_std`,
`_worst10`, `_best10`: the mean of the lowest and highest decile of clients). Per setting
(table column) a figure draws them:

- over rounds: a line per method for the mean client accuracy, its band from the worst-decile
  to the best-decile mean, the worst decile thin (▽), and where the runs scored it the mean
  personalised accuracy after `client_eval_finetune_steps` local steps dotted (each a mean over
  seeds);
- per method, at the last round evaluated: the mean (dot), mean ± std (thick bar) and the
  worst-to-best decile range (thin bar), averaged over seeds.

The run's own metrics (`metrics`, recorded as `test_<name>`) get a panel each against the
round, a line per method (mean over seeds, band min–max).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.reports.plots import (
    ACCURACY_SCALE,
    RunData,
    figure_legend,
    fit_suptitle,
    fit_title,
    integer_ticks,
    markevery,
    pyplot,
    seed_band,
)

CLIENT_COLUMNS = ("client_acc_mean", "client_acc_std", "client_acc_worst10", "client_acc_best10")


def is_evaluation_column(column: str) -> bool:
    """Whether `column` is one of per-client evaluation's (`client_*`) or a metric's on the test
    set (`test_<name>` other than the loss and accuracy of the evaluated models): drawn here,
    not among the diagnostics."""
    return column.startswith("client_") or (
        column.startswith("test_") and not column.startswith(("test_accuracy", "test_loss")))


def has_client_evaluation(runs: list[RunData]) -> bool:
    return any(_finite(r.metrics.get("client_acc_mean", [])) for r in runs)


def metric_names(runs: list[RunData]) -> list[str]:
    """The metrics the runs recorded (their `metrics` setting), in order of first mention."""
    names: list[str] = []
    for r in runs:
        for name in r.config.get("metrics") or []:
            if f"test_{name}" in r.metrics and name not in names:
                names.append(name)
    return names


def _finite(values: list[float]) -> bool:
    return any(isinstance(v, float | int) and math.isfinite(v) for v in values)


def _last_evaluated(run: RunData) -> dict[str, float] | None:
    """The per-client statistics of the run's last round that has them."""
    mean = run.metrics.get("client_acc_mean", [])
    for i in range(len(mean) - 1, -1, -1):
        if math.isfinite(mean[i]):
            return {c: run.metrics[c][i] for c in CLIENT_COLUMNS if c in run.metrics}
    return None


def plot_clients(runs: list[RunData], path: Path, title: str, styles: dict[str, Any]) -> bool:
    """The per-client accuracy figure of one setting (module docstring); False when no run of
    it evaluated its clients."""
    labels = [lb for lb in dict.fromkeys(r.label for r in runs)
              if has_client_evaluation([r for r in runs if r.label == lb])]
    if not labels:
        return False
    plt = pyplot()
    fig, (over, final) = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=(2, 1))
    handles: dict[str, Any] = {}
    for i, label in enumerate(labels):
        mine = [r for r in runs if r.label == label]
        style = styles[label]
        seeds = f" ({len(mine)} seeds)" if len(mine) > 1 else ""
        mean = seed_band(mine, "round", "client_acc_mean", ACCURACY_SCALE)
        worst = seed_band(mine, "round", "client_acc_worst10", ACCURACY_SCALE)
        best = seed_band(mine, "round", "client_acc_best10", ACCURACY_SCALE)
        if mean is None:
            continue
        x, m, _, _ = mean
        (line,) = over.plot(x, m, markevery=markevery(len(x)), **style)
        handles[f"{label}{seeds}"] = line
        if worst is not None and best is not None and len(worst[0]) == len(best[0]) == len(x):
            over.fill_between(x, worst[1], best[1], color=style["color"], alpha=0.12, lw=0)
            over.plot(x, worst[1], color=style["color"], lw=0.9, linestyle="-", marker="v",
                      markersize=3, alpha=0.7, markevery=markevery(len(x)))
        tuned = seed_band(mine, "round", "client_pacc_mean", ACCURACY_SCALE)
        if tuned is not None:
            (dotted,) = over.plot(tuned[0], tuned[1], color=style["color"], lw=1.2, linestyle=":",
                                  marker="x", markevery=markevery(len(tuned[0])))
            handles[f"{label} after local fine-tuning{seeds}"] = dotted
        ends = [e for e in (_last_evaluated(r) for r in mine) if e]
        if ends:
            at = {c: float(np.mean([e[c] for e in ends])) * ACCURACY_SCALE for c in ends[0]}
            final.vlines(i, at["client_acc_worst10"], at["client_acc_best10"], color=style["color"], lw=1.2)
            final.vlines(i, at["client_acc_mean"] - at["client_acc_std"],
                         at["client_acc_mean"] + at["client_acc_std"], color=style["color"], lw=5, alpha=0.5)
            final.plot([i], [at["client_acc_mean"]], marker="o", color=style["color"], markersize=6)
    over.set_xlabel("round")
    over.set_ylabel("client accuracy (%)")
    fit_title(over, "mean over clients (line), worst- to best-decile mean (band), worst decile "
                    "(thin, ▽), after local fine-tuning (dotted, ×)")
    over.grid(alpha=0.3)
    integer_ticks(over)
    final.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    final.set_ylabel("client accuracy (%)")
    fit_title(final, "last evaluated round: mean (dot), ± std (thick), worst to best decile (thin)")
    final.grid(alpha=0.3, axis="y")
    _save(plt, fig, handles, title, path)
    return True


def _save(plt: Any, fig: Any, handles: dict[str, Any], title: str, path: Path) -> None:
    """The figure's legend below, its title above, saved to `path` and closed."""
    bottom = figure_legend(fig, handles)
    top = fit_suptitle(fig, title, 12)
    fig.tight_layout(rect=(0, bottom, 1, 1 - top))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_metrics(runs: list[RunData], path: Path, title: str, styles: dict[str, Any]) -> bool:
    """A panel per metric the runs recorded (`test_<name>` against the round); False when
    none did."""
    names = metric_names(runs)
    if not names:
        return False
    plt = pyplot()
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows + 0.6), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, name in zip(axes.flat, names, strict=False):
        for label in dict.fromkeys(r.label for r in runs):
            mine = [r for r in runs if r.label == label]
            s = seed_band(mine, "round", f"test_{name}")
            if s is None:
                continue
            x, mean, lo, hi = s
            (line,) = ax.plot(x, mean, markevery=markevery(len(x)), **styles[label])
            handles.setdefault(f"{label}" + (f" ({len(mine)} seeds)" if len(mine) > 1 else ""), line)
            if len(mine) > 1:
                ax.fill_between(x, lo, hi, color=styles[label]["color"], alpha=0.15, lw=0)
        fit_title(ax, f"{name} on the test set")
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        integer_ticks(ax)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    _save(plt, fig, handles, title, path)
    return True


__all__ = ["CLIENT_COLUMNS", "has_client_evaluation", "is_evaluation_column", "metric_names",
           "plot_clients", "plot_metrics"]
