"""FedVeca figures in `fedhet report` (registered for `fedveca`): one of each per grid cell."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.reports import paper_figures, slug, split_key

if TYPE_CHECKING:
    from fedhet.reports import RunData

MAX_CELLS = 8
"""Fig. 6 is drawn for this many cells at most (a page of a large grid stays readable)."""


@paper_figures("fedveca")
def fedveca_figures(runs: list[RunData], out: Path) -> list[tuple[str, Path]]:
    """FedVeca Fig. 4 (`η τ_k L` per round, a line per cell, its seeds as a band) and Fig. 6
    (per-client τ, β, δ, A and τ_k, L_k), one figure per cell (setting × method)."""
    import fedhet.papers.fedveca.plots as plots_fedveca  # matplotlib: only when drawn

    cells: dict[tuple[str, str], list[RunData]] = {}
    for run in runs:
        cells.setdefault((run.group, run.label), []).append(run)
    labels = {r.label for r in runs}

    def name(group: str, label: str, seeds: list[RunData]) -> str:
        parts = [p for p in (group, label if len(labels) > 1 else "") if p]
        return " — ".join(parts) or seeds[0].name

    path = out / "fig_fedveca_eta_tau_L.png"
    plots_fedveca.plot_eta_tau_L({name(g, x, s): [r.dir for r in s] for (g, x), s in cells.items()}, path)
    figures = [("η τ_k L per round, Theorem 1's premise (FedVeca Fig. 4): a line per cell, the "
                "mean over its seeds, band min–max", path)]
    for (group, label), seeds in list(cells.items())[:MAX_CELLS]:
        cell = name(group, label, seeds)
        trace = out / f"fig_fedveca_traces_{slug(cell)}.png"
        same = len({split_key(r) for r in seeds}) == 1
        plots_fedveca.plot_client_traces([r.dir for r in seeds], trace, same_split=same, title=cell)
        n = f" ({len(seeds)} seeds)" if len(seeds) > 1 else ""
        figures.append((f"per-client τ, β, δ, A and τ_k, L_k (FedVeca Fig. 6): {cell}{n}", trace))
    if len(cells) > MAX_CELLS:
        figures[-1] = (figures[-1][0] + f"; Fig. 6 is drawn for the first {MAX_CELLS} of "
                       f"{len(cells)} cells", figures[-1][1])
    return figures
