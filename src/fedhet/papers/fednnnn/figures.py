"""FedNNNN figures in `fedhet report` (registered for `fednnnn`, `norm-norm`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.reports import paper_figures, slug

if TYPE_CHECKING:
    from fedhet.reports import RunData


@paper_figures("fednnnn", "norm-norm")
def fednnnn_figures(runs: list[RunData], out: Path) -> list[tuple[str, Path]]:
    """FedNNNN Figs. 3, 11–33: N and E per round, whole model and by layer kind."""
    import fedhet.papers.fednnnn.plots as plots_fednnnn  # matplotlib: only when drawn

    figures = []
    groups = list(dict.fromkeys(r.group for r in runs))
    for group in groups:  # one figure per setting: a method's line never mixes two settings
        mine = [r for r in runs if r.group == group]
        for kind in ("all", "conv", "fc"):
            suffix = "" if kind == "all" else f"_{kind}"
            if not any(f"E{suffix}" in r.metrics for r in mine):
                continue
            path = out / f"fig_fednnnn_norms_{kind}_{slug(group)}.png"
            plots_fednnnn.plot_norms([r.dir for r in mine], path, kind=kind, title=group or None)
            where = f"{group}: " if len(groups) > 1 else ""
            figures.append((f"{where}N and E per round ({kind}); a line per method, mean over "
                            "seeds, band min–max", path))
    return figures
