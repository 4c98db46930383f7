"""The order in which a CPU sitting takes the campaign's runs: the most claim per core-hour first.

On a CPU (one core a run) a sitting takes the runs left in this order **[choice]**:

1. runs whose CPU price is at most `HEAVY_CORE_HOURS` core-hours left before the heavier ones:
   a run that costs a CPU core many hours (FedSR's Fashion-MNIST CNN runs, 6–13 core-hours
   each) waits for a GPU unless nothing cheaper is left, even when it is under way (its
   checkpoint keeps, on this machine or travelling);
2. the lower tier first (`tables`: headline cells, their seeds, the rest of each table at the
   paper's own seed count, then the extra seeds);
3. among runs of one tier, the cell nearest to completing its comparison first: the fewest
   core-hours left in the runs of its cell (the table's setting, at the paper's seed count or
   among the extra seeds) still to run, a cell with an unpriced run after every priced one (two
   cells of the same hours by name, so a cell's runs stay together);
4. within a cell, the runs under way first (the least time left first), then the plan's order.

A GPU keeps its own order (`Sitting.under_way_first`): the runs under way, then the plan's.
`fedhet campaign plan --device cpu` lists the cells in the order of this one
(`plan.cells`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from fedhet.papers.campaign.pricing import Pricer
from fedhet.papers.campaign.tables import CampaignRun

HEAVY_CORE_HOURS = 4.0
"""A run with more core-hours than this left waits for a GPU on a CPU sitting **[choice]**: the
campaign's MNIST runs cost at most 2.5 core-hours each, its Fashion-MNIST CNN runs at least 6."""

CellKey = tuple[str, str, bool]


def core_hours(run: CampaignRun, pricer: Pricer, saved: int) -> float:
    """Core-hours `run` has left on one CPU core (`saved` rounds done); inf when unpriced."""
    price = pricer.price(run, "cpu")
    if price is None:
        return math.inf
    return price.seconds_per_round * max(0, run.rounds - saved) / 3600


def cell_of(run: CampaignRun) -> CellKey:
    """A run's cell: its table and setting, at the paper's seed count or among the extras."""
    return run.table, run.spec.group, run.tier < 3


def cell_hours(runs: Iterable[CampaignRun], hours: dict[str, float]) -> dict[CellKey, float]:
    """Core-hours left in each cell of `runs` (`hours`: each run's, by name)."""
    out: dict[CellKey, float] = {}
    for r in runs:
        out[cell_of(r)] = out.get(cell_of(r), 0.0) + hours[r.name]
    return out


def cpu_order(todo: list[CampaignRun], pricer: Pricer,
              saved: Callable[[CampaignRun], int]) -> list[CampaignRun]:
    """`todo` in a CPU sitting's order (module doc); `saved(r)`: the rounds `r` already holds."""
    done = {r.name: saved(r) for r in todo}
    hours = {r.name: core_hours(r, pricer, done[r.name]) for r in todo}
    cells = cell_hours(todo, hours)

    def key(r: CampaignRun) -> tuple[bool, int, float, CellKey, bool, float, int]:
        heavy = math.isfinite(hours[r.name]) and hours[r.name] > HEAVY_CORE_HOURS
        return (heavy, r.tier, cells[cell_of(r)], cell_of(r), not done[r.name],
                hours[r.name] if done[r.name] else 0.0, r.order)

    return sorted(todo, key=key)
