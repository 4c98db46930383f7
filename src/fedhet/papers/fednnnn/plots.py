"""Figures of the FedNNNN study from run directories (matplotlib, Agg backend).

- `plot_accuracy`: test accuracy vs round, one line per method (Figs. 7, 10, 13, …).
- `plot_norms`: `N` and `E` per round for one layer kind, `fc` or `conv` (Figs. 8–9, 11–33).
  Following the appendix (eq. 24) the plotted `N` is the server movement `‖w_(t+1) − w_t‖`
  (metrics column `move_<kind>`), which for FedAvg and FedProx equals `‖Δ̄‖`; `E` is eq. 5.
- `plot_cumulative`: the integrated server movement `𝒩` vs round (Fig. 4).
- `plot_study`: all of the above for every scenario found under a preset's output directory.

Each function takes run directories (holding `config.json` and `metrics.csv`) and returns the
path of the PNG it wrote. Runs without the NWDA columns (FedAvg without `nwda=true`) are left
out of the norm figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedhet.reports import fit_suptitle  # noqa: E402
from fedhet.rundir import metric_columns, read_config, read_metrics

LABELS = {
    "fedavg": "FedAvg", "fedprox": "FedProx", "norm-norm": "Norm-Norm", "fedavgm": "Momentum",
    "fednnnn": "FedNNNN",
}
ORDER = list(LABELS)
COLORS = dict(zip(ORDER, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red"), strict=True))


def label(run: Path) -> str:
    algo = read_config(run)["algorithm"]
    return LABELS.get(algo, algo)


def scenario(run: Path) -> str:
    """`"<dataset> <IID|NonIID>-<B|UB>"` from a run's partition (or the partition's name)."""
    cfg = read_config(run)
    part, pp = cfg["partition"], cfg.get("partition_params", {})
    name = {"iid": "IID-B", "shards": "NonIID-B"}.get(part)
    if part == "unbalanced":
        name = "IID-UB" if pp.get("labels", "iid") == "iid" else "NonIID-UB"
    return f"{cfg['dataset']} {name or part}"


def _sorted(runs: Sequence[Path]) -> list[Path]:
    def key(run: Path) -> tuple[int, str]:
        algo = read_config(run)["algorithm"]
        return (ORDER.index(algo) if algo in ORDER else len(ORDER), str(run))

    return sorted((Path(r) for r in runs), key=key)


def _line(ax, run: Path, x: list[float], y: list[float], **kw) -> None:
    algo = read_config(run)["algorithm"]
    pts = [(a, b) for a, b in zip(x, y, strict=True) if not math.isnan(b)]
    if pts:
        ax.plot(*zip(*pts, strict=True), label=label(run), color=COLORS.get(algo), lw=1.4, **kw)


def _save(fig, out: Path, title: str | None = None) -> Path:
    """Lay out (a `title` wrapped to the figure's width above the panels) and write the PNG."""
    top = fit_suptitle(fig, title, 11) if title else 0.0
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0, 1, 1 - top))
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_accuracy(
    runs: Sequence[Path], out: Path, title: str | None = None, column: str = "test_accuracy"
) -> Path:
    """Test accuracy (the §4.1 evaluation model) vs round, one line per run."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for run in _sorted(runs):
        m = metric_columns(read_metrics(run))
        _line(ax, run, m["round"], [100 * a for a in m.get(column, [])] or [math.nan] * len(m["round"]))
    ax.set_xlabel("communication round t")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title or "accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out)


def _seeds_line(ax, runs: list[Path], column: str) -> None:
    """One method's runs (seeds): their mean per round, with a band min–max when several."""
    cols = [metric_columns(read_metrics(r)) for r in runs]
    n = min(len(c["round"]) for c in cols)
    ys = np.array([c[column][:n] for c in cols], dtype=float)
    x = np.array(cols[0]["round"][:n], dtype=float)
    ok = np.isfinite(ys).all(axis=0)
    if not ok.any():
        return
    algo = read_config(runs[0])["algorithm"]
    seeds = f" ({len(runs)} seeds)" if len(runs) > 1 else ""
    ax.plot(x[ok], ys.mean(axis=0)[ok], label=label(runs[0]) + seeds, color=COLORS.get(algo), lw=1.4)
    if len(runs) > 1:
        ax.fill_between(x[ok], ys.min(axis=0)[ok], ys.max(axis=0)[ok], color=COLORS.get(algo),
                        alpha=0.15, lw=0)


def plot_norms(runs: Sequence[Path], out: Path, kind: str = "fc", title: str | None = None) -> Path:
    """`N = ‖w_(t+1) − w_t‖` (left) and `E = Σ p_k ‖Δw_k‖` (right) of the `kind` layers; a
    line per method, the mean over its runs (seeds) with a band min–max."""
    fig, (ax_n, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    suffix = "" if kind == "all" else f"_{kind}"
    by_method: dict[str, list[Path]] = {}
    for run in _sorted(runs):
        if f"E{suffix}" in metric_columns(read_metrics(run)):
            by_method.setdefault(read_config(run)["algorithm"], []).append(run)
    for method_runs in by_method.values():
        _seeds_line(ax_n, method_runs, f"move{suffix}")
        _seeds_line(ax_e, method_runs, f"E{suffix}")
    what = "whole model" if kind == "all" else f"{kind} layers"
    for ax, name in ((ax_n, "N = ‖w(t+1) − w(t)‖"), (ax_e, "E = Σ p_k ‖Δw_k‖")):
        ax.set_xlabel("communication round t")
        ax.set_ylabel(name)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.set_title(f"{name.split(' ')[0]} of the {what}")
        if ax.lines:
            ax.legend()
    return _save(fig, out, title)


def plot_cumulative(runs: Sequence[Path], out: Path, title: str | None = None) -> Path:
    """The integrated server movement `𝒩 = Σ_t ‖w_(t+1) − w_t‖` vs round (Fig. 4)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for run in _sorted(runs):
        m = metric_columns(read_metrics(run))
        if "cum_move" in m:
            _line(ax, run, m["round"], m["cum_move"])
    ax.set_xlabel("communication round t")
    ax.set_ylabel(r"integrated norm $\mathcal{N}$")
    ax.set_title(title or "integrated server movement")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    return _save(fig, out)


def find_runs(root: Path) -> list[Path]:
    """Run directories (with `config.json` and `metrics.csv`) at or below `root`."""
    return sorted(p.parent for p in Path(root).rglob("metrics.csv") if (p.parent / "config.json").exists())


def plot_study(root: Path, out_dir: Path | None = None) -> list[Path]:
    """Accuracy, fc/conv norms and `𝒩` figures for each scenario of the runs under `root`."""
    out_dir = Path(out_dir or Path(root) / "plots")
    groups: dict[str, list[Path]] = {}
    for run in find_runs(root):
        groups.setdefault(scenario(run), []).append(run)
    made = []
    for name, runs in sorted(groups.items()):
        slug = name.lower().replace(" ", "_")
        made.append(plot_accuracy(runs, out_dir / f"{slug}_accuracy.png", f"accuracy, {name}"))
        columns = set().union(*(metric_columns(read_metrics(r)).keys() for r in runs))
        for kind in ("fc", "conv"):
            if f"E_{kind}" in columns:
                made.append(plot_norms(runs, out_dir / f"{slug}_norms_{kind}.png", kind, name))
        if "cum_move" in columns:
            title = rf"$\mathcal{{N}}$, {name}"
            made.append(plot_cumulative(runs, out_dir / f"{slug}_cumulative.png", title))
    return made


__all__ = ["find_runs", "plot_accuracy", "plot_cumulative", "plot_norms", "plot_study", "scenario"]
