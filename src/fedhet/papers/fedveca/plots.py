"""FedVeca's figures from run directories (matplotlib, Agg backend).

- `plot_loss_accuracy`: test loss and accuracy vs round for every method in a comparison group,
  centralized SGD as a flat line at its final value (Figs. 3, 5, 7, 8).
- `plot_eta_tau_L`: `η τ_k L` vs round with the line 1 (Theorem 1's premise, Fig. 4); a line per
  run, or per cell of a grid (its seeds' mean, band min–max).
- `plot_client_traces`: per-client `τ_(k,i)`, `β`, `δ`, `A`, and `τ_k`, `L_k` (Fig. 6), for a run
  or a cell's seeds: `τ_k` and `L_k` as the seeds' mean with a band; the per-client panels
  averaged over seeds only when the seeds share one data split (client i is the same client),
  else those of the first seed.
- `plot_fedveca(path, out_dir)`: all of them for a run, a comparison group, or any directory
  holding such groups (a `reproduce fedveca` output, with or without `--protocol fair`); returns
  the PNG paths. This is what `fedhet report` calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.papers.fedveca.runs import CENTRAL, FEDVECA, LABELS
from fedhet.reports import fit_suptitle
from fedhet.rundir import read_config, read_metrics

TRACE_ROUNDS = 50
"""Fig. 6 shows the first 50 rounds."""


def _pyplot():
    # slow import (matplotlib): only when drawing
    import matplotlib

    matplotlib.use("Agg")
    # slow import (matplotlib): only when drawing
    import matplotlib.pyplot as plt

    return plt


def is_run_dir(path: Path) -> bool:
    return (path / "metrics.csv").exists() and (path / "config.json").exists()


def is_fedveca_run(run_dir: Path) -> bool:
    return is_run_dir(run_dir) and read_config(run_dir).get("algorithm") == FEDVECA


def columns(run_dir: Path) -> dict[str, np.ndarray]:
    """`metrics.csv` by column, as float arrays (NaN where a cell is empty)."""
    rows = read_metrics(run_dir)
    names = list(rows[0]) if rows else []
    return {n: np.array([r.get(n, math.nan) for r in rows], dtype=float) for n in names}


def _runs_in(group_dir: Path) -> list[Path]:
    return sorted(p for p in group_dir.iterdir() if p.is_dir() and is_run_dir(p))


def run_labels(runs: list[Path]) -> dict[Path, str]:
    """Method names, plus whatever tells runs of one method apart (α, clients, seed)."""
    configs = {r: read_config(r) for r in runs}

    def facts(cfg: dict[str, Any]) -> dict[str, Any]:
        return {
            "α": cfg.get("algorithm_params", {}).get("alpha") if cfg["algorithm"] == FEDVECA else None,
            "N": cfg.get("clients"), "seed": cfg.get("seed"),
        }

    known = {r: facts(c) for r, c in configs.items()}
    varying = [
        k for k in ("α", "N", "seed")
        if len({str(f[k]) for f in known.values() if f[k] is not None}) > 1
    ]
    labels = {}
    for run, cfg in configs.items():
        extra = ", ".join(f"{k}={known[run][k]}" for k in varying if known[run][k] is not None)
        base = LABELS.get(cfg["algorithm"], cfg["algorithm"])
        labels[run] = f"{base} ({extra})" if extra else base
    return labels


# -- figures ----------------------------------------------------------------------------------
def plot_loss_accuracy(group_dir: Path, out_path: Path, title: str | None = None) -> Path:
    """Figs. 3/5: test loss and accuracy vs round; centralized SGD as a flat line."""
    plt = _pyplot()
    runs = _runs_in(Path(group_dir))
    labels = run_labels(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        c = columns(run)
        ok = np.isfinite(c["test_accuracy"])
        central = read_config(run)["algorithm"] == CENTRAL
        for ax, key, scale in zip(axes, ("test_loss", "test_accuracy"), (1.0, 100.0), strict=True):
            if central:
                ax.axhline(scale * c[key][ok][-1], color="black", ls="--", lw=1.2, label=labels[run])
            else:
                ax.plot(c["round"][ok], scale * c[key][ok], lw=1.4, label=labels[run])
    _log_if_wide(axes[0], np.concatenate([line.get_ydata() for line in axes[0].get_lines()]), 20)
    for ax, name in zip(axes, ("loss", "accuracy (%)"), strict=True):
        ax.set_xlabel("round k")
        ax.set_ylabel(f"test {name}")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title or Path(group_dir).name)
    return _save(fig, out_path)


def _stacked(runs: list[Path], name: str, n: int | None = None) -> np.ndarray:
    """Column `name` of each run, cut to the rounds all of them have: `(runs, rounds)`."""
    cols = [columns(r) for r in runs]
    n = min(len(c["round"]) for c in cols) if n is None else n
    return np.array([c.get(name, np.full(len(c["round"]), math.nan))[:n] for c in cols])


def _band(ax: Any, x: np.ndarray, ys: np.ndarray, **style: Any) -> Any:
    """The mean of `ys` over runs (rows) against `x`, with a min–max band when several."""
    ok = np.isfinite(ys).all(axis=0)
    (line,) = ax.plot(x[ok], ys.mean(axis=0)[ok], **style)
    if len(ys) > 1:
        ax.fill_between(x[ok], ys.min(axis=0)[ok], ys.max(axis=0)[ok], color=line.get_color(),
                        alpha=0.15, lw=0)
    return line


def plot_eta_tau_L(runs: Mapping[str, Path | list[Path]], out_path: Path) -> Path:
    """Fig. 4: `η τ_k L` per round for FedVeca runs; round 0 is blank (L is one round late).
    A value that is a list of runs (a grid cell's seeds) is drawn as their mean with a band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for label, got in runs.items():
        group = [got] if isinstance(got, Path) else list(got)
        k = _stacked(group, "round")[0] - 1
        seeds = f" ({len(group)} seeds)" if len(group) > 1 else ""
        _band(ax, k, _stacked(group, "eta_tau_L"), lw=1.3, label=label + seeds)
    ax.axhline(1.0, color="black", ls="--", lw=1, label="η τ_k L = 1")
    ax.set_xlabel("round k")
    ax.set_ylabel("η τ_k L")
    _log_if_wide(ax, np.concatenate([line.get_ydata() for line in ax.get_lines()] or [[1.0]]), 30)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Theorem 1 premise: η τ_k L ≥ 1")
    return _save(fig, out_path)


def plot_client_traces(run_dir: Path | list[Path], out_path: Path, max_rounds: int = TRACE_ROUNDS,
                       same_split: bool = False, title: str = "") -> Path:
    """Fig. 6: per-client `τ_(k,i)`, `β_(k,i)`, `δ_(k,i)`, `A_(k,i)` and `τ_k`, `L_k`.

    `run_dir` may be a cell's seeds: `τ_k` and `L_k` are then their mean with a band min–max,
    and the per-client panels the mean over seeds when `same_split` (client i holds the same
    samples in every seed), else the first seed's."""
    plt = _pyplot()
    runs = [Path(run_dir)] if isinstance(run_dir, str | Path) else [Path(r) for r in run_dir]
    n = min(len(columns(r)["round"]) for r in runs)
    k = _stacked(runs, "round", n)[0] - 1
    keep = (k >= 0) & (k < max_rounds)
    per_client = runs if same_split else runs[:1]
    c = columns(runs[0])
    clients = sorted(int(n.split("_")[1]) for n in c if n.startswith("tau_") and n[4:].isdigit())
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    panels = [
        ("tau", "τ_(k,i)", False), ("beta", "β_(k,i)", True), ("delta", "δ_(k,i)", True),
        ("A", "A_(k,i)", True),
    ]
    colors = _client_colors(plt, len(clients))
    for ax, (name, ylabel, logy) in zip(axes.flat, panels, strict=False):
        drawn = []
        for i, color in zip(clients, colors, strict=True):
            y = _stacked(per_client, f"{name}_{i}", n).mean(axis=0)[keep]
            drawn.append(y)
            ax.plot(k[keep], y, lw=1.1, marker=".", ms=3, color=color, label=f"client {i + 1}")
        ax.set_ylabel(ylabel)
        if logy:
            _log_if_wide(ax, np.concatenate(drawn or [[1.0]]))
    if len(clients) <= 10:
        axes[0, 0].legend(fontsize=7, ncol=2)
    else:
        axes[0, 0].set_title(f"{len(clients)} clients, colour = client index", fontsize=9)
    _band(axes[1, 1], k[keep], _stacked(runs, "tau_k", n)[:, keep], color="black", lw=1.3)
    axes[1, 1].set_ylabel("τ_k = Σ p_i τ_(k,i)")
    _band(axes[1, 2], k[keep], _stacked(runs, "L_k", n)[:, keep], color="black", lw=1.3, marker=".", ms=3)
    axes[1, 2].set_ylabel("L_k (estimate, one round late)")
    for ax in axes.flat:
        ax.set_xlabel("round k")
        ax.grid(alpha=0.3)
    head = title or f"{runs[0].parent.name}/{runs[0].name}"
    if len(runs) > 1:
        first = read_config(runs[0]).get("seed", runs[0].name)
        clients_from = (f"per-client panels: mean over the {len(runs)} seeds (one data split)"
                        if same_split else
                        f"per-client panels: seed {first} (each seed splits the data anew)")
        head += f"; τ_k, L_k: mean over {len(runs)} seeds, band min–max; {clients_from}"
    top = fit_suptitle(fig, f"FedVeca instantaneous behaviour: {head}", 11)
    return _save(fig, out_path, top)


def _client_colors(plt: Any, n: int) -> list[Any]:
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("viridis")(i / (n - 1)) for i in range(n)]


def _log_if_wide(ax: Any, values: np.ndarray, ratio: float = 50) -> None:
    values = np.asarray(values, dtype=float)
    pos = values[np.isfinite(values) & (values > 0)]
    if len(pos) and pos.max() / pos.min() > ratio:
        ax.set_yscale("log")


def _save(fig: Any, out_path: Path, top: float = 0.0) -> Path:
    # slow import (matplotlib): only when drawing
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0, 1, 1 - top))
    fig.savefig(out_path, dpi=110)
    _pyplot().close(fig)
    return out_path


# -- the report's entry point -----------------------------------------------------------------
def find_groups(path: Path) -> list[Path]:
    """`path` and every directory below it that directly holds run directories."""
    path = Path(path)
    candidates = [path, *sorted(p for p in path.rglob("*") if p.is_dir())]
    return [d for d in candidates if not is_run_dir(d) and _runs_in(d)]


def plot_fedveca(path: Path, out_dir: Path) -> list[Path]:
    """Every FedVeca figure for a run directory or a directory of comparison groups."""
    path, out_dir = Path(path), Path(out_dir)
    made: list[Path] = []
    if is_run_dir(path):
        if is_fedveca_run(path):
            made.append(plot_client_traces(path, out_dir / f"{path.name}_traces.png"))
            made.append(plot_eta_tau_L({path.name: path}, out_dir / f"{path.name}_eta_tau_L.png"))
        return made
    fedveca_runs: dict[str, Path] = {}
    for group in find_groups(path):
        stem = "_".join(group.relative_to(path).parts) or group.name
        made.append(plot_loss_accuracy(group, out_dir / f"{stem}_loss_accuracy.png", stem))
        for run in _runs_in(group):
            if is_fedveca_run(run):
                if run.name == FEDVECA:  # the comparison groups' runs, not the α/N studies
                    fedveca_runs[stem] = run
                made.append(plot_client_traces(run, out_dir / f"{stem}_{run.name}_traces.png"))
    if fedveca_runs:
        made.append(plot_eta_tau_L(fedveca_runs, out_dir / "eta_tau_L.png"))
    return made


__all__ = [
    "find_groups",
    "plot_client_traces",
    "plot_eta_tau_L",
    "plot_fedveca",
    "plot_loss_accuracy",
]
