"""FedVeca figures in `fedhet report` (registered for `fedveca`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.experiments.figures import paper_figures, slug

if TYPE_CHECKING:
    from fedhet.experiments.report import RunData


@paper_figures("fedveca")
def fedveca_figures(runs: list[RunData], out: Path) -> list[tuple[str, Path]]:
    """FedVeca Fig. 4 (`η τ_k L` per round) and Fig. 6 (per-client τ, β, δ, A; first 4 runs)."""
    import fedhet.experiments.papers.fedveca.plots as plots_fedveca  # matplotlib: only when drawn

    path = out / "fig_fedveca_eta_tau_L.png"
    plots_fedveca.plot_eta_tau_L({r.name: r.dir for r in runs}, path)
    figures = [("η τ_k L per round, Theorem 1's premise (FedVeca Fig. 4)", path)]
    for run in runs[:4]:
        trace = out / f"fig_fedveca_traces_{slug(run.name)}.png"
        plots_fedveca.plot_client_traces(run.dir, trace)
        figures.append((f"per-client τ, β, δ, A and τ_k, L_k (FedVeca Fig. 6): {run.name}", trace))
    return figures
