"""FedNNNN figures in `fedhet report` (registered for `fednnnn`, `norm-norm`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.experiments.figures import paper_figures

if TYPE_CHECKING:
    from fedhet.experiments.report import RunData


@paper_figures("fednnnn", "norm-norm")
def fednnnn_figures(runs: list[RunData], out: Path) -> list[tuple[str, Path]]:
    """FedNNNN Figs. 3, 11–33: N and E per round, whole model and by layer kind."""
    import fedhet.experiments.papers.fednnnn.plots as plots_fednnnn  # matplotlib: only when drawn

    figures = []
    for kind in ("all", "conv", "fc"):
        suffix = "" if kind == "all" else f"_{kind}"
        if not any(f"E{suffix}" in r.metrics for r in runs):
            continue
        path = out / f"fig_fednnnn_norms_{kind}.png"
        plots_fednnnn.plot_norms([r.dir for r in runs], path, kind=kind)
        figures.append((f"N and E per round ({kind})", path))
    return figures
