"""`fedhet partition`: who holds what — per-client sizes and label counts, a heatmap, and the
client → sample indices as JSON (what `--partition file` reads back).

Settings resolve exactly as for `fedhet run`, so the partition shown is the one a run with the
same settings trains on (same dataset, partitioner, parameters, clients and seed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.data import label_counts, write_index_map
from fedhet.engine import RunConfig, build, federate
from fedhet.errors import FedhetError
from fedhet.registry import params_dict
from fedhet.reports.plots import fit_suptitle

FULL_TABLE_MAX_LABELS = 20
"""Above this many labels the table lists each client's largest labels instead of every column."""


def describe_partition(
    values: dict[str, Any], heatmap: str | Path | None = None, out: Callable[[str], None] = print,
    indices: str | Path | None = None,
) -> np.ndarray:
    """Print the partition that `values` (run settings) describe; returns `counts[client, label]`.

    `indices`: also write each client's training-sample indices there (`write_index_map`)."""
    cfg = data_config(values)
    fed = federate(cfg)
    data, parts = fed.data, fed.parts
    counts = label_counts(data.split_labels, parts, data.split_classes)
    settings = ", ".join(f"{k}={v}" for k, v in params_dict(cfg.partition_params).items())
    out(
        f"{data.name}: {len(data.train_labels)} train samples, {data.split_classes} labels; partition "
        f"{cfg.partition}({settings}), {cfg.clients} clients, seed {cfg.seed}"
    )
    for line in format_table(counts):
        out(line)
    out(summary_line(counts))
    if heatmap:
        save_heatmap(counts, Path(heatmap), f"{data.name} · {cfg.partition}({settings})")
        out(f"heatmap saved to {heatmap}")
    if indices:
        write_index_map(parts, indices)
        out(f"indices saved to {indices} (read back with --partition file --set partition.path={indices})")
    return counts


def data_config(values: dict[str, Any]) -> RunConfig:
    """The run config with its dataset and partition built, as `fedhet run` builds them.

    Only the data side is resolved: the model and algorithm (and their parameters) play no part
    in a partition, so a dataset whose models are not installed can still be inspected.
    """
    return build(values, only=("dataset", "partition"))


def format_table(counts: np.ndarray) -> list[str]:
    """One row per client: size, then every label's count (or the largest labels when many)."""
    n_clients, n_labels = counts.shape
    sizes = counts.sum(axis=1)
    w = max(4, len(str(int(sizes.max(initial=0)))))
    if n_labels <= FULL_TABLE_MAX_LABELS:
        cw = max(3, len(str(int(counts.max(initial=0)))))
        head = f"{'client':>6} {'size':>{w}} | " + " ".join(f"{c:>{cw}}" for c in range(n_labels))
        rows = [
            f"{i:>6} {sizes[i]:>{w}} | " + " ".join(f"{v:>{cw}}" for v in counts[i])
            for i in range(n_clients)
        ]
        return [head, "-" * len(head), *rows]
    head = f"{'client':>6} {'size':>{w}} {'labels':>6} | largest labels (label:count)"
    rows = []
    for i in range(n_clients):
        top = [c for c in np.argsort(-counts[i], kind="stable")[:8] if counts[i, c] > 0]
        held = int((counts[i] > 0).sum())
        rows.append(f"{i:>6} {sizes[i]:>{w}} {held:>6} | " + " ".join(f"{c}:{counts[i, c]}" for c in top))
    return [head, "-" * len(head), *rows]


def summary_line(counts: np.ndarray) -> str:
    sizes = counts.sum(axis=1)
    held = (counts > 0).sum(axis=1)
    return (
        f"sizes: min {sizes.min()}, median {np.median(sizes):g}, max {sizes.max()}; "
        f"labels per client: min {held.min()}, mean {held.mean():.2f}, max {held.max()}"
    )


def save_heatmap(counts: np.ndarray, path: Path, title: str) -> None:
    """Clients (x) × labels (y), colour = samples, like FedSR Fig. 8; small maps show the counts."""
    # slow import (matplotlib): only when drawing
    import matplotlib

    matplotlib.use("Agg")
    # slow import (matplotlib): only when drawing
    from matplotlib import pyplot as plt

    n_clients, n_labels = counts.shape
    fig_w = min(14.0, max(5.0, 2.5 + 0.45 * n_clients))
    fig_h = min(14.0, max(4.0, 1.8 + 0.35 * n_labels))
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    image = ax.imshow(counts.T, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("client")
    ax.set_ylabel("label")
    ax.set_xticks(_ticks(n_clients))
    ax.set_yticks(_ticks(n_labels))
    if n_clients <= 30 and n_labels <= 20:
        threshold = counts.max(initial=0) / 2
        for i in range(n_clients):
            for c in np.flatnonzero(counts[i]).tolist():
                colour = "black" if counts[i, c] > threshold else "white"
                ax.text(i, c, str(counts[i, c]), ha="center", va="center", fontsize=7, color=colour)
    top = fit_suptitle(fig, title, 10)  # wrapped to the figure: a long partition is never cut
    fig.tight_layout(rect=(0, 0, 1, 1 - top))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as e:
        raise FedhetError(f"cannot save the heatmap to {path}: {e}") from None
    finally:
        plt.close(fig)


def _ticks(n: int) -> list[int]:
    step = max(1, int(np.ceil(n / 25)))
    return list(range(0, n, step))
