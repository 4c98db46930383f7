"""Comparative claims about a paper's tables, declared in the paper's folder (`<paper>/claims.py`).

A `TableClaim` is one sentence of a paper that compares methods across the cells of one of its
tables: in each of `groups`, the best of `winners` is above each of `others` in final test
accuracy, or (`metric="transfers"`) needs fewer model transfers to a target accuracy, or
(`metric="drop"`) every winner stays within `tolerance` points of its own accuracy in the
group's `beside` cell while every other falls more than `tolerance` below its own. Each
claim quotes the paper and carries the paper's own numbers (`paper`), so the page shows whether
the paper's table itself bears its sentence out. docs/paper-scale.md reads every claim from the
recorded cells (`paper_scale.table_claim_rows`): holds, does not, or not yet (naming the
missing methods).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TableClaim:
    """One comparative sentence of a paper, per table cell (module doc)."""

    quote: str
    """The paper's words."""
    source: str
    """Where they are (section, table)."""
    winners: tuple[str, ...]
    """The labels the claim favours (the best of them is compared)."""
    others: tuple[str, ...]
    """The labels each cell's best winner must beat."""
    groups: tuple[str, ...]
    """The table cells (the presets' group names) the claim is read in."""
    paper: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """The paper's own values, `{group: {label: value}}` (accuracy in %, or transfers)."""
    metric: str = "accuracy"
    """`accuracy` (final test accuracy, higher wins), `transfers` (model transfers up to the
    first round at `target`, fewer win) or `drop` (each method's final test accuracy against its
    own in the `beside` cell)."""
    beside: dict[str, str] = field(default_factory=dict)
    """`drop`: each group's cell of comparison (`{"MNIST xi=4": "MNIST IID"}`)."""
    tolerance: float = 0.0
    """`drop`: the points a winner may lose and an other must lose more than."""
    target: float = 0.0
    """The target accuracy of a `transfers` claim, in [0, 1]."""
    reference: str = ""
    """A label whose difference to the best winner is shown beside the verdict ("by how much
    over FedAvg"); '' for none."""
    most: bool = False
    """The paper says "in most cases": besides a row per cell, one that holds when more than
    half of `groups` hold (does not, once that can no longer happen)."""


__all__ = ["TableClaim"]
