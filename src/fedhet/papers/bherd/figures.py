"""BHerd figures in `fedhet report` (registered for `bherd`, `bherd-fednova`, `bherd-scaffold`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedhet.reports import paper_figures, slug

if TYPE_CHECKING:
    from fedhet.reports import RunData


@paper_figures("bherd", "bherd-fednova", "bherd-scaffold")
def bherd_figures(runs: list[RunData], out: Path) -> list[tuple[str, Path]]:
    """BHerd Fig. 4: kept local-step indices (first run of each setting) and herding distances."""
    import fedhet.papers.bherd.plots as plots_bherd  # matplotlib: only when drawn

    firsts = list({(r.group, r.label): r for r in reversed(runs)}.values())[::-1][:4]
    figures = []
    for run in firsts:
        if (run.dir / "diagnostics.jsonl").exists():
            path = out / f"fig_bherd_kept_{slug(run.name)}.png"
            plots_bherd.kept_index_map(run.dir, path)
            figures.append((f"kept local gradients per client and round (BHerd Fig. 4a–c): {run.name}", path))
    with_dist = [r for r in firsts if any(c.startswith("herd_dist_") for c in r.metrics)]
    if with_dist:
        path = out / "fig_bherd_herd_distance.png"
        plots_bherd.herd_distance([r.dir for r in with_dist], path, [r.name for r in with_dist])
        figures.append(("‖G_i − mean g‖ per client (BHerd Fig. 4d)", path))
    return figures
