"""Figures of the BHerd paper from run directories (matplotlib, Agg backend).

- `kept_index_map`: which local steps each client kept in each round (Fig. 4a–c).
- `herd_distance`: `‖G_i − mean_λ g^λ‖` per client vs round, one panel per run (Fig. 4d).
- `curves`: test loss and accuracy vs round for several labelled runs (Figs. 2, 3, 4e).
Each of these writes one PNG and returns its path. `main_report` turns a finished `bherd`
preset directory into the Fig. 2 table (markdown) and figures for one model/dataset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedhet.errors import FedhetError  # noqa: E402
from fedhet.papers.bherd.preset import CASES, main_runs
from fedhet.reports import fit_suptitle, fit_title
from fedhet.rundir import damaged, metric_columns, read_json_lines, read_metrics


def arrays(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    """A run's metrics (`fedhet.rundir.read_metrics`' rows) as one NumPy array per column."""
    return {k: np.array(v) for k, v in metric_columns(rows).items()}


def read_kept(run_dir: Path) -> list[dict[int, list[int]]]:
    """Per round (in order) the kept step indices of each client, from `diagnostics.jsonl`."""
    path = Path(run_dir) / "diagnostics.jsonl"
    if not path.exists():
        raise FedhetError(f"{run_dir} has no diagnostics.jsonl: was it a BHerd run?")
    records = read_json_lines(path, "fedhet writes one JSON object a line, a line per round: "
                              "restore it, or run the run again with --force")
    try:
        out = [{int(c): [int(i) for i in v] for c, v in r.get("kept_indices", {}).items()}
               for r in records]
    except (AttributeError, TypeError, ValueError):
        raise damaged(path, "holds kept_indices that are not {client: [step, ...]}",
                      "restore it, or run the run again with --force") from None
    if not any(out):
        raise FedhetError(f"{run_dir} logged no kept indices: was it a BHerd run?")
    return out


def kept_matrix(kept: list[dict[int, list[int]]], client: int) -> np.ndarray:
    """`(max τ) × rounds` array, 1 where the client kept local step λ in that round."""
    tau = 1 + max((max(r[client]) for r in kept if r.get(client)), default=0)
    grid = np.zeros((tau, len(kept)))
    for k, r in enumerate(kept):
        for lam in r.get(client, []):
            grid[lam, k] = 1.0
    return grid


def kept_index_map(run_dir: Path, out: Path | None = None, title: str = "") -> Path:
    """Fig. 4a–c: one panel per client, local step index λ vs round, dark where kept."""
    kept = read_kept(run_dir)
    clients = sorted({c for r in kept for c in r})
    fig, axes = plt.subplots(1, len(clients), figsize=(2.4 * len(clients), 3.2), squeeze=False,
                             sharey=True)
    for ax, c in zip(axes[0], clients, strict=True):
        grid = kept_matrix(kept, c)
        ax.imshow(grid, aspect="auto", origin="lower", cmap="Greys", interpolation="nearest",
                  extent=(0.5, len(kept) + 0.5, -0.5, grid.shape[0] - 0.5))
        ax.set_title(f"client {c + 1}")
        ax.set_xlabel("round")
    axes[0][0].set_ylabel("local step index λ (kept = dark)")
    top = fit_suptitle(fig, title or f"kept local gradients: {Path(run_dir).name}", 11)
    fig.tight_layout(rect=(0, 0, 1, 1 - top))
    return _save(fig, out or Path(run_dir) / "kept_indices.png")


def herd_distance(
    run_dirs: Sequence[Path], out: Path, titles: Sequence[str] | None = None
) -> Path:
    """Fig. 4d: `‖G_i − mean_λ g^λ‖` per client vs round, one panel per run (e.g. Cases 1–3)."""
    fig, axes = plt.subplots(1, len(run_dirs), figsize=(4.2 * len(run_dirs), 3.4), squeeze=False)
    for j, (ax, run) in enumerate(zip(axes[0], run_dirs, strict=True)):
        m = arrays(read_metrics(run))
        cols = sorted((k for k in m if k.startswith("herd_dist_")), key=lambda k: int(k[10:]))
        if not cols:
            raise FedhetError(f"{run} has no herd_dist_<i> columns: was it a BHerd run?")
        for col in cols:
            ax.plot(m["round"], m[col], label=f"client {int(col[10:]) + 1}")
        fit_title(ax, titles[j] if titles else Path(run).name, 10)
        ax.set_xlabel("round")
        ax.set_yscale("log")
    axes[0][0].set_ylabel("‖G_i − mean g‖")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out)


def curves(runs: Mapping[str, Path], out: Path, title: str = "") -> Path:
    """Test loss and accuracy vs round for labelled runs (a centralized run drawn dashed)."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, run in runs.items():
        m = arrays(read_metrics(run))
        ok = ~np.isnan(m["test_accuracy"])
        style = "--" if label.lower().startswith("central") else "-"
        loss_ax.plot(m["round"][ok], m["test_loss"][ok], style, label=label)
        acc_ax.plot(m["round"][ok], 100 * m["test_accuracy"][ok], style, label=label)
    loss_ax.set(xlabel="round", ylabel="test loss")
    acc_ax.set(xlabel="round", ylabel="test accuracy (%)")
    acc_ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out)


def rounds_to_reach(m: dict[str, np.ndarray], target: float) -> int | None:
    """The first round whose test accuracy is ≥ `target` (None if never)."""
    hit = np.flatnonzero(m["test_accuracy"] >= target)
    return int(m["round"][hit[0]]) if len(hit) else None


def main_report(root: Path, scale: str = "paper", setup: str = "svm-mnist",
                out: Path | None = None) -> tuple[str, list[Path]]:
    """Fig. 2 for one setup from a finished `bherd` preset run in `root` (runs in
    `root/<spec name>`): a markdown table per case (final and best accuracy, final loss, rounds
    to reach FedAvg's final accuracy) and loss/accuracy curves, kept-index maps and herding
    distances for Cases 1–3."""

    out = Path(out or root / "report")
    specs = [s for s in main_runs(scale) if s.name.startswith(f"main-{setup}-")]
    lines = ["| case | method | final acc (%) | best acc (%) | final loss | rounds to FedAvg's final acc |",
             "|---|---|---|---|---|---|"]
    pngs: list[Path] = []
    for case in CASES:
        runs = {s.label: Path(root) / s.name for s in specs if f"-{case}-" in s.name}
        metrics = {label: arrays(read_metrics(run)) for label, run in runs.items()}
        target = _last(metrics["FedAvg"], "test_accuracy")
        for label, m in metrics.items():
            reach = rounds_to_reach(m, target) if not label.startswith("Central") else None
            lines.append(
                f"| {case} | {label} | {100 * _last(m, 'test_accuracy'):.2f} | "
                f"{100 * np.nanmax(m['test_accuracy']):.2f} | {_last(m, 'test_loss'):.4f} | "
                f"{'—' if reach is None else reach} |"
            )
        pngs.append(curves(runs, out / f"{setup}-{case}-curves.png", f"{setup} {case}"))
        pngs.append(kept_index_map(runs["BHerd-FedAvg"], out / f"{setup}-{case}-kept.png",
                                   f"BHerd-FedAvg kept steps, {setup} {case}"))
    herd_runs = [Path(root) / s.name for s in specs if s.label == "BHerd-FedAvg"]
    pngs.append(herd_distance(herd_runs, out / f"{setup}-herd-distance.png", list(CASES)))
    return "\n".join(lines) + "\n", pngs


def _last(m: dict[str, np.ndarray], key: str) -> float:
    values = m[key][~np.isnan(m[key])]
    return float(values[-1])


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
