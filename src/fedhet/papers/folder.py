"""What a paper folder declares: `Paper` (its page and its campaign tables) and `Table`.

A paper is one folder under `fedhet.papers` (or under a directory of `$FEDHET_PAPERS`) with a
`paper` module whose `PAPER` is a `Paper`; `fedhet.papers` finds the folders and reads it
(`fedhet.papers.PAPERS`). Besides `paper.py` the folder holds its preset (`preset.py`,
registered in `fedhet.papers.base.PRESETS` with its one-line help, which `fedhet reproduce
--help` lists), its claims, its report figures and whatever else it needs. docs/paper-scale.md,
the campaign (`fedhet campaign`) and the command line read the papers from the registry and
name none of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.runs import RunSpec

Prepare = Callable[[list[RunSpec]], list[RunSpec]]
"""A table's selection of a preset's runs with the campaign's settings applied."""


@dataclass(frozen=True)
class Table:
    """One table of the campaign: a preset restricted to some datasets, with its headline cell."""

    key: str
    paper: str
    experiment: str
    """Result file stem: `RESULTS/<paper>/<experiment>.csv`."""
    title: str
    only: tuple[str, ...]
    """Datasets of the preset's runs at `paper` scale."""
    headline: Callable[[RunSpec], bool]
    """The runs of the cell carrying the paper's headline claim (at any scale)."""
    paper_seeds: int
    """Seeds the paper itself ran (its count comes first; the preset's others are extras)."""
    order: int = 100
    """The table's place among every paper's tables (lower first): the campaign keeps this
    order within a tier, so the MNIST headline tables come first."""
    keep: Callable[[RunSpec], bool] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    """Settings the campaign changes in every run, each a faithful change named on the page."""
    deviations: str = ""
    """The page's line on `overrides` and other ways the runs differ from the preset."""
    extra_columns: tuple[str, ...] = ()
    bf16: bool = False
    """Runs in `precision=bf16` (the precision study found no loss for this table's methods)."""
    data: str = ""
    """Why the table cannot run here when its data cannot be had offline ('' when it can)."""
    variants: Callable[[RunSpec], list[RunSpec]] | None = None
    """Runs the campaign adds beside a preset run: another reading the paper's text allows, each
    named and labelled apart (`variant`), so no recorded run changes."""
    alternatives: Callable[[RunSpec], list[RunSpec]] | None = None
    """Cells of another reading of the paper's words (a partition the text also allows), in a
    group of their own: planned after every cell at the paper's seed count (tier 3)."""
    later: Callable[[str, Path, Prepare], dict[str, list[RunSpec]]] | None = None
    """Runs that can be planned only once another run is recorded: `later(scale, records,
    prepare)` → `{recorded run's name: its followers}`, each list through `prepare` (FedVeca's
    baselines take their budget from its recorded FedVeca run)."""


def variant(spec: RunSpec, tag: str, label: str, change: dict[str, Any], group: str = "") -> RunSpec:
    """`spec` with `change`, named `<name>-<tag>` before its seed suffix (`main-x_s2` →
    `main-x-<tag>_s2`), labelled `label` and in `group` (default: the spec's): a run of its own
    beside the preset's."""
    m = re.fullmatch(r"(.*?)(_s\d+)?", spec.name)
    assert m is not None  # the pattern matches every name
    return RunSpec(f"{m.group(1)}-{tag}{m.group(2) or ''}", group or spec.group, label,
                   {**spec.settings, **change})


LABEL_CUT = {"partition.cut": "label"}
"""The other reading of "only ξ classes" (`cut=label`): under `shards` no shard straddles two
labels; under `unbalanced` (labels in shards) every client holds exactly ξ labels."""


def label_cut(groups: tuple[str, ...], labels: tuple[str, ...]) -> Callable[[RunSpec], list[RunSpec]]:
    """The alternative cells of a table: seed 0 of `labels` in `groups` under `LABEL_CUT`, in
    the group `<group> (cut=label)`."""
    def alternatives(s: RunSpec) -> list[RunSpec]:
        if s.group not in groups or s.label not in labels or int(s.settings.get("seed", 0)) != 0:
            return []
        return [variant(s, "labelcut", s.label, LABEL_CUT, f"{s.group} (cut=label)")]

    return alternatives


def no_sections() -> list[Any]:
    return []


@dataclass(frozen=True)
class Paper:
    """A paper folder's declaration (`PAPER` in its `paper.py`)."""

    title: str
    """The paper's name on the page (`FedVeca`)."""
    page: int
    """Its place on docs/paper-scale.md (lower first)."""
    sections: Callable[[], Sequence[Any]] = no_sections
    """Its tables on the page, each a `fedhet.papers.page_rows.Section` (typed loosely here: the
    page's rows stand above the registry that finds the papers): published numbers and claims."""
    tables: tuple[Table, ...] = ()
    """Its tables in the campaign (`fedhet campaign`)."""
    setup_help: str = ""
    """What its preset's setups mean (`fedhet reproduce --help`; '' without setups)."""
    name: str = ""
    """The folder's name, set when it is found."""
