"""The data of docs/paper-scale.md: the result files at paper scale, their cells and the
statistics the claims are read with.

The page is generated from the result files kept in the repository (`results/<paper>/*.csv` and
their json, the contract of `fedhet.papers.paper_results`); only files whose json says
`"scale": "paper"` count.

How a file's rows are found: a row's `setting` names the case by `case1`/`Case 1` …; its
`algorithm` is a base name (`fedavg`, `fedveca`, `fednova`, `central`, `bherd`, `grab-fedavg`,
`bherd-fednova`, …; `BHerd-FedAvg` and `Centralized SGD` are read as `bherd` and `central`) with
an optional variant in brackets, `bherd[alpha=0.3,criterion=grab-stale]`; `key=value` tokens in
the setting count as variants too (`alpha=0.3`, `clients=50`) (`parse_label`, `cells`).

Definitions used by the claims (also printed on the page):
- the loss is the `train_loss` column (the global model's training loss; `test_loss` when a file
  has none); "early loss" is its mean over rounds 1–10;
- "rounds to X" is the first round ≥ 1 whose value reaches X (loss ≤ X, accuracy ≥ X), a run
  that never does counting as K + 1; a method's figure is the median over seeds;
- A "converges faster" than B when A's early loss is below B's, paired over seeds, outside the
  noise: `|mean Δ| > 2·std(Δ)/√n` (Δ = A − B per seed).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.papers import paper_results as pr

EARLY = 10
"""Rounds 1..EARLY make the "early loss"."""
WITHIN = 2.0
"""Points of accuracy inside which a published number counts as reproduced."""
REACH = 0.05
"""[choice] "Reaches the centralized loss/accuracy" (FedVeca Figs. 3, 5; the paper gives no
threshold): comes within this fraction of the centralized curve's own span of its final value,
loss ≤ c + 0.05·|c₀ − c| and accuracy ≥ c − 0.05·|c₀ − c|, with c centralized SGD's final value
and c₀ its round-0 value (the initial model, the same for every method of a seed). One rule
for every model: on the SVM (loss 0.50 → 0.22) it allows 0.014, on the CNN (2.30 → 0.06)
0.11, where a fixed margin fits one of the two scales only."""
DIVERGED = 10.0
"""[choice] A run whose loss is not finite or above this has diverged (shown, not hidden: its
early loss still counts, as the slowest)."""
SAME_SPEED = 1.2
"""[choice] "Equally fast": Case 3's rounds at most this times the slower of Cases 1 and 2."""


# -- the results -------------------------------------------------------------------------
@dataclass
class Experiment:
    paper: str
    name: str
    curves: pr.Curves
    meta: dict[str, Any]

    def run_info(self) -> str:
        m = self.meta
        if not m:
            return f"`{self.paper}/{self.name}` (no json)"
        minutes = m.get("minutes")
        mins = f"{float(minutes):.1f} min" if isinstance(minutes, int | float) else "? min"
        partial = ("" if m.get("complete", True)
                   else f", partial: {m.get('runs')}/{m.get('runs_planned')} runs")
        return f"`{self.paper}/{self.name}` {m.get('commit', '?')}, {m.get('device', '?')}, {mins}{partial}"


@dataclass
class Results:
    experiments: list[Experiment] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Files left out (not paper scale), as `paper/name (scale)`."""
    root: Path = Path("results")
    """The directory read (the campaign's records and prices come from it too)."""

    def of(self, paper: str) -> list[Experiment]:
        return [e for e in self.experiments if e.paper == paper]


def _paper_dir(path: Path) -> bool:
    """A paper's result file, not the campaign's own files (`results/campaign*/`) nor the
    partitions' drawings (`results/partitions/`, `partition_readings`)."""
    return not path.parent.name.startswith("campaign") and path.parent.name != "partitions"


def load(results: Path) -> Results:
    """Every `results/<paper>/<experiment>.csv` at paper scale."""
    out = Results(root=Path(results))
    for meta_path in sorted(p for p in Path(results).glob("*/*.json") if _paper_dir(p)):
        if not meta_path.with_suffix(".csv").exists():
            raise FedhetError(f"{meta_path} has no {meta_path.stem}.csv beside it (the results it "
                              "describes); restore the CSV (`git checkout results/` in a checkout) "
                              "or remove the json")
    for csv_path in sorted(p for p in Path(results).glob("*/*.csv") if _paper_dir(p)):
        meta = pr.read_meta(csv_path.with_suffix(".json"))
        scale = meta.get("scale", "paper")
        if scale != "paper":
            out.skipped.append(f"{csv_path.parent.name}/{csv_path.stem} ({scale})")
            continue
        out.experiments.append(Experiment(csv_path.parent.name, csv_path.stem,
                                          pr.read_results(csv_path), meta))
    return out


# -- reading labels ------------------------------------------------------------------------
ALIASES = {"bherd-fedavg": "bherd", "centralized": "central", "centralized-sgd": "central",
           "centralised": "central", "momentum": "momentum"}


def parse_label(algorithm: str) -> tuple[str, dict[str, str]]:
    """`"bherd[alpha=0.3, criterion=grab-stale]"` → `("bherd", {"alpha": "0.3", ...})`; the
    presets' labels too: `"FedVeca (α=0.5)"` → `("fedveca", {"alpha": "0.5"})`, `N=` is `clients`."""
    base = re.split(r"[\[(]", algorithm, maxsplit=1)[0]
    rest = algorithm[len(base):]
    base = re.sub(r"[\s_]+", "-", base.strip().lower()).strip("-")
    return ALIASES.get(base, base), dict(_tokens(rest))


def _tokens(text: str) -> Iterable[tuple[str, str]]:
    """`key=value` pairs of a label's variant part; a bare word is a flag (`ref40` → "true")."""
    for part in re.split(r"[,;\s\[\]()]+", text):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower().replace("α", "alpha")
        if not key:
            continue
        yield ("clients" if key == "n" else key), (value if eq else "true")


def case_of(setting: str) -> int | None:
    m = re.search(r"case\s*([1-3])", setting, re.IGNORECASE)
    return int(m.group(1)) if m else None


def same_value(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b))
    except ValueError:
        return a.lower() == b.lower()


@dataclass(frozen=True)
class Cell:
    """One (setting, algorithm) of one experiment: its curves by seed."""

    exp: Experiment
    setting: str
    algorithm: str
    base: str
    variants: dict[str, str]
    case: int | None
    by_seed: dict[int, dict[str, list[float]]]


def cells(exps: Iterable[Experiment]) -> list[Cell]:
    out = []
    for e in exps:
        for (setting, algorithm), by_seed in e.curves.items():
            base, variants = parse_label(algorithm)
            # only the setting's `key=value` tokens are variants (module doc): its words name the
            # problem ("CNN MNIST Case 3"), and the case is `Cell.case`
            variants = {**{k: v for k, v in _tokens(setting) if v != "true"},
                        **variants}
            out.append(Cell(e, setting, algorithm, base, variants, case_of(setting), by_seed))
    return out


def pick(cs: list[Cell], base: str, case: int | None = None, **variants: str) -> list[Cell]:
    """Cells of algorithm `base` (in case `case`) whose variants include `variants`."""
    return [c for c in cs if c.base == base and (case is None or c.case == case)
            and all(k in c.variants and same_value(c.variants[k], v) for k, v in variants.items())]


def plain(cs: list[Cell], ignore: tuple[str, ...] = ()) -> list[Cell]:
    """The cells without a variant (other than those in `ignore`)."""
    return [c for c in cs if not set(c.variants) - set(ignore)]


def by_setup(cs: list[Cell], vary: tuple[str, ...] = ()) -> dict[str, list[Cell]]:
    """Cells grouped by their variants other than `vary`: the setup they ran in (`ref40`,
    `B=10`, …; "" is fedhet's own). A claim compares methods of one setup only, so a file
    that holds the reference [40] setup's runs gets rows of its own."""
    out: dict[str, list[Cell]] = {}
    for c in cs:
        key = ",".join(k if v == "true" else f"{k}={v}"
                       for k, v in sorted(c.variants.items()) if k not in vary)
        out.setdefault(key, []).append(c)
    return out


def where(case: int | None, setup: str, name: str) -> str:
    """A row's setting detail: `Case 3 (ref40) [svm-cases-ref40]`."""
    return " ".join(p for p in (f"Case {case}" if case else "", f"({setup})" if setup else "",
                                f"[{name}]") if p)


# -- statistics over curves ----------------------------------------------------------------
def loss_column(cols: dict[str, list[float]]) -> list[float]:
    train = cols.get("train_loss", [])
    return train if any(math.isfinite(v) for v in train) else cols.get("test_loss", [])


def early_loss(cols: dict[str, list[float]], k: int = EARLY) -> float:
    loss = loss_column(cols)
    vals = [v for r, v in zip(cols["round"], loss, strict=False) if 1 <= r <= k and math.isfinite(v)]
    return statistics.fmean(vals) if vals else math.nan


def final(cols: dict[str, list[float]], column: str) -> float:
    vals = [v for v in cols.get(column, []) if math.isfinite(v)]
    return vals[-1] if vals else math.nan


def rounds_to(cols: dict[str, list[float]], values: list[float], target: float, above: bool) -> float:
    """First round ≥ 1 reaching `target`; K + 1 when none does."""
    for r, v in zip(cols["round"], values, strict=False):
        if r >= 1 and math.isfinite(v) and (v >= target if above else v <= target):
            return r
    return max(cols["round"], default=0) + 1


def by_exp(cs: list[Cell]) -> dict[str, list[Cell]]:
    """Cells grouped by the experiment (result file) they come from."""
    out: dict[str, list[Cell]] = {}
    for c in cs:
        out.setdefault(c.exp.name, []).append(c)
    return out


def median(values: Iterable[float]) -> float:
    vals = list(values)
    return statistics.median(vals) if vals else math.nan


def pm(mean: float, sd: float, fmt: str = "{:+.4f}") -> str:
    """`mean ± sd` (the mean alone when `sd` is not a number)."""
    return fmt.format(mean) + ("" if math.isnan(sd) else " ± " + fmt.format(sd).lstrip("+"))


def central_target(ref: dict[str, list[float]], accuracy: bool, reach: float = 0.0) -> float:
    """The value a curve must reach to reach centralized SGD's run `ref`: its final value c,
    less (accuracy) or plus (loss) `reach` × its span |c₀ − c| from round 0 (`REACH`)."""
    values = ref.get("test_accuracy", []) if accuracy else loss_column(ref)
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return math.nan
    c, span = vals[-1], abs(vals[0] - vals[-1])
    return c - reach * span if accuracy else c + reach * span


def rounds_to_central(c: Cell, central: Cell, accuracy: bool, reach: float = 0.0) -> dict[int, float]:
    """Per seed, the rounds `c` needs to reach `central_target` of central's run of the same
    seed (accuracy ≥ it, loss ≤ it; never: K + 1)."""
    out = {}
    for seed, cols in c.by_seed.items():
        ref = central.by_seed.get(seed)
        if ref is None:
            continue
        values = cols.get("test_accuracy", []) if accuracy else loss_column(cols)
        out[seed] = rounds_to(cols, values, central_target(ref, accuracy, reach), accuracy)
    return out


def to_central(c: Cell, central: Cell, accuracy: bool, reach: float = 0.0) -> float:
    """Median over seeds of `rounds_to_central`."""
    return median(rounds_to_central(c, central, accuracy, reach).values())


def diverged(c: Cell) -> str:
    """` (diverged in k/n seeds)` when some seed's loss leaves `DIVERGED`, else ``."""
    bad = sum(1 for cols in c.by_seed.values()
              if not all(math.isfinite(x) and x <= DIVERGED for x in loss_column(cols)))
    return f" (diverged in {bad}/{len(c.by_seed)} seeds)" if bad else ""
