"""Reports: pages, plots and tables drawn from run directories on disk (above the runs, below
the papers).

- `report`: `fedhet report DIR`, an HTML page with PNGs beside it (`write_report`): the runs
  found by `discovery`, the page and its sections drawn by `page`;
- `plots`, `diagnostics`: the curves, and a panel for every diagnostic column of metrics.csv;
- `settings`, `provenance`: what a page's runs compared, and what made them;
- `figures`: where papers register their own figures (`paper_figures`), by algorithm name;
- `partition`: `fedhet partition`, who holds what;
- `seeds`: mean ± std over seeds, and which differences are inside the noise;
- `commcost`: communication cost to a target accuracy;
- `screenshot`: the page as a reader sees it (headless Chromium).

The report does not import the papers: a paper's figures appear once `fedhet.papers` is
imported (the CLI and `fedhet reproduce` do). The names below are this layer's surface;
importing the package imports none of its modules until one of them is first used
(`fedhet.lazy`: `seeds` and the tables read CSVs without torch); mypy and an IDE read them from
the `TYPE_CHECKING` block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhet.lazy import attach

if TYPE_CHECKING:
    from fedhet.reports.diagnostics import split_key
    from fedhet.reports.figures import paper_figures, slug
    from fedhet.reports.partition import data_config, describe_partition
    from fedhet.reports.plots import RunData, fit_suptitle, fit_title
    from fedhet.reports.report import write_report
    from fedhet.reports.screenshot import screenshot as screenshot_page
    from fedhet.reports.seeds import Stat, mean_std, noise_pairs, paired, paired_seeds, stats_markdown

__all__ = [
    "RunData",
    "Stat",
    "data_config",
    "describe_partition",
    "fit_suptitle",
    "fit_title",
    "mean_std",
    "noise_pairs",
    "paired",
    "paired_seeds",
    "paper_figures",
    "screenshot_page",
    "slug",
    "split_key",
    "stats_markdown",
    "write_report",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = attach(__name__, __file__)
