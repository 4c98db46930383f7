"""The campaign's tables and the order of their runs: each paper's headline claim first.

A table is one paper's preset restricted to the runs of one published table or figure
(`reproduce --only mnist` at `paper` scale); each paper folder declares its own
(`folder.Paper.tables`, a `folder.Table` each: its headline cell, variants and alternatives),
and `TABLES` gathers them. Its runs are ordered in four tiers:

0. seed 0 of every headline cell (the cell that carries the paper's main claim,
   `Table.headline`), in `TABLES`' order;
1. the headline cells' other seeds up to the paper's own count (`Table.paper_seeds`), then the
   runs of another reading beside a headline run (`Table.variants`), which the headline row
   reads beside the preset's;
2. the rest of each table, seeds up to the paper's count;
3. extra seeds (the preset's beyond the paper's count), headline cells first, and the cells of
   another reading of the paper's words (`Table.alternatives`, seed 0), each before its table's
   second seed.

Within a tier the tables keep `TABLES`' order and a table its preset's order; a run that can be
planned only once another is recorded (`Table.later`) follows it. A GPU sitting takes the runs
already under way (rounds saved) first, in this order, then the rest
(`Sitting.under_way_first`); a CPU sitting takes the most claim per core-hour first
(`order.cpu_order`). The centralized reference ignores the partition, so a table whose preset
repeats it per case or partition runs it once per seed (`central_runs`), and the export puts
that one run in every cell it serves **[choice]**.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.papers import PAPERS
from fedhet.papers.folder import LABEL_CUT, Table, label_cut, variant
from fedhet.runs import SCALES, RunSpec

TABLES: tuple[Table, ...] = tuple(sorted((t for p in PAPERS.values() for t in p.tables),
                                         key=lambda t: (t.order, t.key)))
"""The campaign's tables, every paper's (`folder.Paper.tables`) in their `order`: MNIST headline
tables first. CIFAR-10 (FedNNNN Table 2's other half, FedSR's CIFAR rows, the CNN + CIFAR-10
figures) is on no registry these machines reach (`NO_DATA`)."""

NO_DATA = {
    "cifar10": "CIFAR-10 ships in no package on PyPI, Debian or npm (the archive is 170 MB, over "
               "PyPI's file limit); a machine with the internet fetches it with `download=true`",
    "cifar100": "CIFAR-100: as CIFAR-10",
}
"""Datasets no campaign table can have on these offline machines, and why (one line each)."""

FASHION_MNIST = ("Fashion-MNIST comes from Debian's `dataset-fashion-mnist` (the four IDX files, "
                 "Expat licence): `apt-get install dataset-fashion-mnist`, then the campaign reads "
                 "/usr/share/datasets/fashion-mnist (or `--data-dir`)")
DEBIAN_DATASETS = Path("/usr/share/datasets")


def table(key: str) -> Table:
    for t in TABLES:
        if t.key == key:
            return t
    raise FedhetError(f"unknown campaign table {key!r}; choose from: {', '.join(t.key for t in TABLES)}")


@dataclass(frozen=True)
class CampaignRun:
    """One run of the plan: a preset's spec (the campaign's settings applied) and its place."""

    table: str
    spec: RunSpec
    tier: int
    order: int
    """Position in the whole plan (0 runs first)."""
    headline: bool
    serves: tuple[str, ...]
    """The settings (table cells) whose rows this run fills (several for a shared centralized run)."""
    after: str = ""
    """A run that must be recorded before this one can be planned exactly (FedVeca's baselines
    take their budget from the FedVeca run); '' when none."""
    variant: bool = False
    """A run of another reading beside a preset run (`Table.variants`)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def seed(self) -> int:
        return int(self.spec.settings.get("seed", 0))

    @property
    def rounds(self) -> int:
        return int(self.spec.settings.get("rounds", 1))


def _select(specs: list[RunSpec], t: Table, scale: str) -> list[RunSpec]:
    if scale == "paper":  # below paper scale the presets run on the embedded digits
        specs = [s for s in specs if s.settings.get("dataset", "digits") in t.only]
    return [s for s in specs if t.keep is None or t.keep(s)]


def _settings(t: Table, spec: RunSpec, scale: str, data_dir: str | None) -> RunSpec:
    settings = {**spec.settings, **t.overrides}
    if t.bf16:
        settings["precision"] = "bf16"
    if data_dir is not None:
        settings["data_dir"] = data_dir
    elif scale == "paper" and settings.get("dataset") == "fashion-mnist":
        settings["data_dir"] = str(DEBIAN_DATASETS)
    return RunSpec(spec.name, spec.group, spec.label, settings)


def _no_partition(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if not (k == "partition" or k.startswith("partition."))}


def central_runs(specs: list[RunSpec]) -> tuple[list[RunSpec], dict[str, tuple[str, ...]]]:
    """The specs with each centralized run kept once per set of non-partition settings (seed
    included), renamed `central__<first name>`; returns them and `{name: groups served}`."""
    out: list[RunSpec] = []
    serves: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for s in specs:
        if s.settings.get("algorithm") != "central":
            out.append(s)
            serves[s.name] = [s.group]
            continue
        settings = _no_partition(s.settings)
        key = json.dumps(settings, sort_keys=True)
        if key in first:
            serves[first[key]].append(s.group)
            continue
        name = f"central__{s.name}"
        first[key] = name
        out.append(RunSpec(name, s.group, s.label, {**settings, "partition": "iid"}))
        serves[name] = [s.group]
    return out, {k: tuple(v) for k, v in serves.items()}


def first_stage(t: Table, scale: str, data_dir: str | None = None) -> list[RunSpec]:
    """The table's runs that need nothing recorded first (FedVeca: its FedVeca runs)."""
    # lazy: the presets (and the registries behind them) load only when a plan is made
    from fedhet.papers.reproduce import load_preset

    preset = load_preset(t.paper, scale)
    specs = _select(preset.stages[0](Path("/nonexistent-campaign-plan")), t, scale)
    if t.variants is not None:
        specs += [v for s in specs for v in t.variants(s)]
    return [_settings(t, s, scale, data_dir) for s in specs]


def later_runs(t: Table, scale: str, records: Path, data_dir: str | None = None) -> \
        dict[str, list[RunSpec]]:
    """The table's runs that follow a recorded run (`Table.later`), `{recorded run: specs}`."""
    if t.later is None:
        return {}
    return t.later(scale, records, lambda specs: [_settings(t, s, scale, data_dir)
                                                  for s in _select(specs, t, scale)])


def plan_runs(scale: str, tables: tuple[Table, ...], records: Callable[[Table], Path],
              data_dir: str | None = None) -> list[CampaignRun]:
    """Every run of `tables` at `scale` in the campaign's order (module doc). `records(t)`: the
    directory of table `t`'s recorded runs (FedVeca's baselines are planned from it)."""
    if scale not in SCALES:
        raise FedhetError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
    staged: list[tuple[int, Table, RunSpec, tuple[str, ...], str]] = []
    alternative: set[tuple[str, str]] = set()
    beside_head: dict[tuple[str, str], bool] = {}
    for ti, t in enumerate(tables):
        base = first_stage(t, scale, data_dir)
        for s in base:
            beside_head.update({(t.key, v.name): t.headline(s)
                                for v in (t.variants(s) if t.variants else [])})
        specs, serves = central_runs(base)
        for s in specs:
            staged.append((ti, t, s, serves[s.name], ""))
        for parent, followers in later_runs(t, scale, records(t), data_dir).items():
            staged += [(ti, t, b, (b.group,), parent) for b in followers]
        for a in (x for s in base for x in (t.alternatives(s) if t.alternatives else [])):
            staged.append((ti, t, a, (a.group,), ""))
            alternative.add((t.key, a.name))
    seeds: dict[str, list[int]] = {}
    for _, t, s, _, _ in staged:
        seeds.setdefault(t.key, [])
        seed = int(s.settings.get("seed", 0))
        if seed not in seeds[t.key]:
            seeds[t.key].append(seed)
    ranked = []
    for i, (ti, t, s, served, after) in enumerate(staged):
        rank = sorted(seeds[t.key]).index(int(s.settings.get("seed", 0)))
        head = t.headline(s)
        tier = 3 if (t.key, s.name) in alternative else \
            (0 if rank == 0 else 1) if head and rank < t.paper_seeds else \
            1 if beside_head.get((t.key, s.name)) and rank < t.paper_seeds else \
            2 if rank < t.paper_seeds else 3
        ranked.append(((tier, 0 if head else 1, ti, rank, i), t, s, served, after, head))
    ranked.sort(key=lambda r: r[0])
    return [CampaignRun(t.key, s, key[0], n, head, served, after, (t.key, s.name) in beside_head)
            for n, (key, t, s, served, after, head) in enumerate(ranked)]


__all__ = ["DEBIAN_DATASETS", "FASHION_MNIST", "LABEL_CUT", "NO_DATA", "TABLES", "CampaignRun", "Table",
           "central_runs", "first_stage", "label_cut", "later_runs", "plan_runs", "table", "variant"]
