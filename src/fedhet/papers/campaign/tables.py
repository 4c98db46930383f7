"""The campaign's tables and the order of their runs: each paper's headline claim first.

A table is one paper's preset restricted to the runs of one published table or figure
(`reproduce --only mnist` at `paper` scale). Its runs are ordered in four tiers:

0. seed 0 of every headline cell (the cell that carries the paper's main claim: FedNNNN
   NonIID-UB FedAvg vs FedNNNN; FedSR ξ = 2 FedAvg vs FedSR; FedVeca CNN Case 3; BHerd CNN
   Case 3 FedAvg vs BHerd-FedAvg), in that order;
1. the headline cells' other seeds up to the paper's own count (`Table.paper_seeds`), then the
   runs of another reading beside a headline run (`Table.variants`: BHerd-FedAvg under
   `criterion=grab-stale`), which the headline row reads beside the preset's;
2. the rest of each table, seeds up to the paper's count;
3. extra seeds (the preset's beyond the paper's count), headline cells first, and the cells of
   another reading of the paper's words (`Table.alternatives`, seed 0), each before its table's
   second seed.

Within a tier the tables keep `TABLES`' order and a table its preset's order. A GPU sitting takes
the runs already under way (rounds saved) first, in this order, then the rest
(`Sitting.under_way_first`); a CPU sitting takes the most claim per core-hour first
(`order.cpu_order`). The centralized
reference ignores the partition, so a table whose preset repeats it per case or partition (BHerd,
FedSR) runs it once per seed (`central_runs`), and the export puts that one run in every cell
it serves **[choice]**.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.runs import SCALES, RunSpec


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


def _fednnnn_head(s: RunSpec) -> bool:
    return s.group.endswith("NonIID-UB") and s.label in ("FedAvg", "FedNNNN")


def _fedsr_head(s: RunSpec) -> bool:
    return s.group.endswith("xi=2") and s.label in ("FedAvg", "FedSR")


def _fedveca_head(s: RunSpec) -> bool:
    return s.group.endswith("Case 3")


def _bherd_head(s: RunSpec) -> bool:
    return s.group.endswith("case3") and s.label in ("FedAvg", "BHerd-FedAvg")


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


BHERD_GRAB_SEEDS = 4
"""Seeds of the BHerd CNN Case 3 run under GraB's reference criterion, as many as the greedy
runs first recorded."""


def _bherd_grab_stale(s: RunSpec) -> list[RunSpec]:
    """BHerd-FedAvg at CNN + MNIST Case 3 under `criterion=grab-stale` beside the greedy run:
    "offline herding" in the text points to GraB's reference sorter (docs/bherd.md), and the
    greedy criterion diverges on this CNN."""
    if not (_bherd_head(s) and s.label == "BHerd-FedAvg"
            and int(s.settings.get("seed", 0)) < BHERD_GRAB_SEEDS):
        return []
    return [variant(s, "grabstale", "BHerd-FedAvg[criterion=grab-stale]",
                    {"algorithm.criterion": "grab-stale"})]


FEDVECA_EVAL = {"train_loss": False}
"""FedVeca §IV-B computes "the loss function values and prediction accuracy values" of each
round's model "on the test dataset": no pass over the 60,000 training samples (a third of a
CNN round's time in the preset, which logs the training loss for its SVM figures)."""

TABLES: tuple[Table, ...] = (
    Table("fednnnn-mnist", "fednnnn", "table2-mnist", "FedNNNN Table 2, MNIST", ("mnist",),
          _fednnnn_head, paper_seeds=1, bf16=True,
          alternatives=label_cut(("MNIST NonIID-B", "MNIST NonIID-UB"), ("FedAvg", "FedNNNN")),
          deviations="bf16 autocast (benchmarks/RESULTS.md: FedAvg and FedNova within 0.01 "
                     "points of fp32 on this CNN); seeds 1-2 are extras (the paper ran once)"),
    Table("fedsr-mnist", "fedsr", "table2-mnist", "FedSR Tables II-III, MNIST", ("mnist",),
          _fedsr_head, paper_seeds=1, extra_columns=("cum_model_transfers",),
          alternatives=label_cut(("MNIST xi=2",), ("FedAvg", "FedSR")),
          deviations="the centralized reference runs once per seed and serves every partition; "
                     "seeds 1-2 are extras (Table II gives one value per cell, no spread)"),
    Table("fedveca-cnn-mnist", "fedveca", "cnn-mnist", "FedVeca Fig. 3, CNN + MNIST Case 3",
          ("mnist",), _fedveca_head, paper_seeds=10, extra_columns=("tau_k",),
          keep=lambda s: s.group.endswith("Case 3") and not s.group.startswith("SVM"),
          overrides=FEDVECA_EVAL,
          deviations="loss and accuracy on the test set only, as §IV-B says (the preset also "
                     "logs the training loss)"),
    Table("bherd-cnn-mnist", "bherd", "cnn-mnist", "BHerd Fig. 2, CNN + MNIST Cases 1-3",
          ("mnist",), _bherd_head, paper_seeds=10,
          keep=lambda s: s.name.startswith("main-") and "svm" not in s.name,
          variants=_bherd_grab_stale,
          deviations="the centralized reference runs once per seed and serves Cases 1-3; Case 3's "
                     f"BHerd-FedAvg also runs under criterion=grab-stale (seeds 0-{BHERD_GRAB_SEEDS - 1}), "
                     "beside the greedy criterion"),
    Table("fedsr-fashion-mnist", "fedsr", "table2-fashion-mnist", "FedSR Tables II-III, Fashion-MNIST",
          ("fashion-mnist",), _fedsr_head, paper_seeds=1, extra_columns=("cum_model_transfers",),
          deviations="the centralized reference runs once per seed and serves every partition"),
)
"""The campaign's tables, MNIST headline tables first. CIFAR-10 (FedNNNN Table 2's other half,
FedSR's CIFAR rows, the CNN + CIFAR-10 figures) is on no registry these machines reach
(`NO_DATA`)."""

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


def fedveca_baselines(t: Table, scale: str, records: Path, data_dir: str | None = None) -> \
        dict[str, list[RunSpec]]:
    """FedVeca's baselines of each group whose FedVeca run is recorded under `records`
    (`{fedveca run name: specs}`); they take their fair budget from that run (§IV-A1)."""
    # lazy: the presets load only when a plan is made
    from fedhet.papers.fedveca import preset as fv

    out: dict[str, list[RunSpec]] = {}
    for g in fv.groups(scale):
        specs = _select(fv.fedveca_specs(g), t, scale)
        if not specs or not (records / specs[0].name / "summary.json").exists():
            continue
        out[specs[0].name] = [_settings(t, s, scale, data_dir)
                              for s in _select(fv.baseline_specs(g, records, write=False), t, scale)]
    return out


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
        if t.paper == "fedveca":
            for parent, baselines in fedveca_baselines(t, scale, records(t), data_dir).items():
                staged += [(ti, t, b, (b.group,), parent) for b in baselines]
            # a group whose FedVeca run is not recorded yet: its baselines follow it, priced alike
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
    for i, (ti, t, s, serves, after) in enumerate(staged):
        rank = sorted(seeds[t.key]).index(int(s.settings.get("seed", 0)))
        head = t.headline(s)
        tier = 3 if (t.key, s.name) in alternative else \
            (0 if rank == 0 else 1) if head and rank < t.paper_seeds else \
            1 if beside_head.get((t.key, s.name)) and rank < t.paper_seeds else \
            2 if rank < t.paper_seeds else 3
        ranked.append(((tier, 0 if head else 1, ti, rank, i), t, s, serves, after, head))
    ranked.sort(key=lambda r: r[0])
    return [CampaignRun(t.key, s, key[0], n, head, serves, after, (t.key, s.name) in beside_head)
            for n, (key, t, s, serves, after, head) in enumerate(ranked)]
