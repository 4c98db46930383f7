"""What a paper preset is, for `fedhet reproduce PAPER --scale smoke|small|paper`.

The presets themselves live with their papers (`fedhet.papers.<paper>.preset`).

A preset is a function `scale -> Preset`. A `Preset` lists its runs in stages: each stage is a
callable that gets the preset's output directory (so it can read what earlier stages
produced, e.g. FedVeca's `τ_all` for the fair baselines of §IV-A1) and returns `RunSpec`s.
`published` holds the paper's own numbers for the report to put beside ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES = ("smoke", "small", "paper")


@dataclass(frozen=True)
class RunSpec:
    """One run of a preset or grid: a unique directory name, a group label, and settings.

    `settings` uses the names of `fedhet run --set` (`"algorithm": "fedprox"`,
    `"algorithm.mu": 0.01`, `"partition.xi": 2`, `"lr": 0.01`, ...). `group` names the
    setting the run belongs to in tables (e.g. `"MNIST non-IID B"`); `label` the method.
    """

    name: str
    group: str
    label: str
    settings: dict[str, Any]


Stage = Callable[[Path], list[RunSpec]]


@dataclass
class Preset:
    paper: str
    scale: str
    stages: list[Stage]
    published: list[dict[str, Any]] = field(default_factory=list)
    """Rows `{"group", "label", "metric", "value", "source"}` quoted from the paper.

    `group` and `label` must equal those of the preset's `RunSpec`s they compare with;
    `metric` is a results.csv column (`final_accuracy`, `best_accuracy`, `rounds_to_target`,
    `transfers_to_target`, `bytes_to_target`) or an alias (`accuracy`, `rounds`, `transfers`);
    an accuracy `value` above 1 is read as a percentage (see `results.compare_published`)."""
    target_accuracy: float | None = None
    notes: str = ""


PresetFactory = Callable[[str], Preset]
"""A paper's preset: `scale -> Preset`, registered in `fedhet.papers.base.PRESETS`."""


PAPER_SEEDS = (0, 1, 2)
"""[choice] Seeds of a `paper`-scale preset where the paper does not say (the tables in docs/
use at least three); BHerd's paper averages 10 runs and its preset runs 10."""


def with_seeds(specs: list[RunSpec], seeds: tuple[int, ...]) -> list[RunSpec]:
    """Every spec once per seed, in the same table cell (group and label), so the tables show
    mean ± std over the seeds. Seed 0 keeps the spec's own name (so the run directory of the
    same spec without seeds is its seed-0 run); the others get `_s<seed>`."""
    out = []
    for spec in specs:
        for seed in seeds:
            name = spec.name if seed == 0 else f"{spec.name}_s{seed}"
            out.append(RunSpec(name, spec.group, spec.label, {**spec.settings, "seed": seed}))
    return out
