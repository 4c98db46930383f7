"""Reports: pages, plots and tables drawn from run directories on disk (above the runs, below
the papers).

- `report`: `fedhet report DIR`, an HTML page with PNGs beside it (`write_report`, `RunData`);
- `plots`, `diagnostics`: the curves, and a panel for every diagnostic column of metrics.csv;
- `settings`, `provenance`: what a page's runs compared, and what made them;
- `figures`: where papers register their own figures (`paper_figures`), by algorithm name;
- `partition`: `fedhet partition`, who holds what;
- `seeds`: mean ± std over seeds, and which differences are inside the noise;
- `commcost`: communication cost to a target accuracy;
- `screenshot`: the page as a reader sees it (headless Chromium).

The report does not import the papers: a paper's figures appear once `fedhet.papers` is
imported (the CLI and `fedhet reproduce` do). The names below are this layer's surface;
importing the package imports none of its modules until one of them is first used.
"""

from __future__ import annotations

from fedhet.surface import offered

_SURFACE = {
    "write_report": "report",
    "RunData": "report",
    "paper_figures": "figures",
    "describe_partition": "partition",
    "mean_std": "seeds",
    "paired": "seeds",
    "Stat": "seeds",
}

__all__ = sorted(_SURFACE)

__getattr__ = offered(__name__, _SURFACE)
