"""Mean ± std over seeds for the tables in docs/, and which differences are inside the noise.

A grid (`fedhet compare`) already writes mean ± std over its seeds in `summary.md`; this module
adds what the docs need beyond that:

- `grid_noise(results_csv, metric)`: from a grid's `results.csv`, the pairs of methods whose
  difference is outside the noise, per setting.

The noise rules (one module for every doc and page): two methods' cells differ **outside the
noise** when their mean ± std ranges (sample std, n − 1) do not overlap (`inside_noise`);
paired over seeds, a difference Δ = A − B is outside the noise when `|mean Δ| > 2·std(Δ)/√n`
(`outside_noise`, `paired`, `paired_seeds`). A "first round to X" value counts only when every
seed reaches X.

    python -m fedhet.reports.seeds grid runs/fednnnn-mnist-noniid-b --metric final_accuracy
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet.rundir import read_csv


@dataclass(frozen=True)
class Stat:
    """Values of one cell over n seeds; None (or NaN) where a seed never reached the target."""

    values: tuple[float | None, ...]

    @property
    def reached(self) -> list[float]:
        return [float(v) for v in self.values if v is not None and math.isfinite(v)]

    @property
    def complete(self) -> bool:
        return len(self.reached) == len(self.values) > 0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.reached) if self.reached else math.nan

    @property
    def std(self) -> float:
        """Sample standard deviation (n − 1); 0 for a single value."""
        r = self.reached
        return statistics.stdev(r) if len(r) > 1 else 0.0

    def text(self, fmt: str = "{:.4f}") -> str:
        """`mean ± std`; `mean ± std (k/n reach)` when only k seeds reached; `— (0/n reach)`."""
        n, k = len(self.values), len(self.reached)
        if k == 0:
            return f"— (0/{n} reach)"
        out = fmt.format(self.mean) + (" ± " + fmt.format(self.std) if k > 1 else "")
        return out if k == n else f"{out} ({k}/{n} reach)"


def inside_noise(a: Stat, b: Stat) -> bool:
    """True when the mean ± std ranges of `a` and `b` overlap (or either is incomplete)."""
    if not (a.complete and b.complete):
        return True
    return abs(a.mean - b.mean) <= a.std + b.std


def stats_markdown(columns: Sequence[str], stats: dict[str, dict[str, Stat]]) -> str:
    """A table: methods as rows; accuracy/loss with 4 decimals, rounds with 1."""
    lines = ["| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label, cells in stats.items():
        shown = [cells[c].text("{:.4f}" if c.startswith("final") else "{:.1f}") for c in columns]
        lines.append(f"| {label} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def noise_pairs(columns: Sequence[str], stats: dict[str, dict[str, Stat]]) -> list[str]:
    """`column: A vs B` for every pair of methods outside the noise (better one first)."""
    labels = list(stats)
    out = []
    for c in columns:
        lower = not _higher_is_better(c)
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                sa, sb = stats[a][c], stats[b][c]
                if not inside_noise(sa, sb):
                    first, second = (a, b) if (sa.mean < sb.mean) == lower else (b, a)
                    out.append(f"{c}: {first} better than {second}")
    return out


def _higher_is_better(column: str) -> bool:
    """Accuracies (`final accuracy`, `final_accuracy`, `best_accuracy`); not losses, rounds
    (`acc ≥ 0.85`, `rounds_to_target`), bytes or time."""
    return "accuracy" in column and "≥" not in column and "target" not in column


# -- grids (results.csv) --------------------------------------------------------------------------
def grid_stats(results_csv: Path, metric: str = "final_accuracy") -> dict[str, dict[str, Stat]]:
    """Per group (setting), per label: `metric` over the grid's seeds (empty cells: not reached)."""
    _, rows = read_csv(Path(results_csv), "fedhet writes it at the end of a grid: run the grid "
                       "again (`fedhet compare` resumes it) to write it anew",
                       required=("group", "label", "status"))
    out: dict[str, dict[str, list[float | None]]] = {}
    for r in rows:
        v = r.get(metric, "")
        val = float(v) if v not in ("", "nan") and r.get("status") == "finished" else None
        out.setdefault(r["group"], {}).setdefault(r["label"], []).append(val)
    return {g: {lab: Stat(tuple(v)) for lab, v in d.items()} for g, d in out.items()}


def grid_noise(results_csv: Path, metric: str = "final_accuracy") -> list[str]:
    """Pairs of methods outside the noise for `metric`, per group of the grid."""
    out = []
    for group, stats in grid_stats(results_csv, metric).items():
        out += [f"{group}: {p}" for p in noise_pairs([metric], {k: {metric: s} for k, s in stats.items()})]
    return out


def mean_std(values: Sequence[float], digits: int = 4, count: bool = False) -> str:
    """Mean ± std (ddof 1) over seeds as text, over the finite values (a seed that never reached
    a target, or diverged, is left out); one value alone, "—" for none. `count`: ` (n=k)`
    after it, k the values it is over."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return "—"
    text = f"{v[0]:.{digits}f}" if len(v) == 1 else f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"
    return text + (f" (n={len(v)})" if count else "")


def outside_noise(diffs: Sequence[float]) -> bool:
    """Whether paired differences Δ (one per seed) are outside the noise: `|mean Δ| > 2·std(Δ)/√n`
    with the sample std (n − 1); never for fewer than two."""
    d = np.asarray(diffs, dtype=float)
    return len(d) > 1 and bool(abs(d.mean()) > 2 * d.std(ddof=1) / np.sqrt(len(d)))


def paired(diffs: Sequence[float], digits: int = 4) -> str:
    """Mean ± std of paired differences; `*` when outside the noise (`outside_noise`)."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return "—"
    mark = " *" if outside_noise(diffs) else ""
    return f"{d.mean():+.{digits}f} ± {d.std(ddof=1):.{digits}f}{mark}"


def paired_seeds(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float, int, bool]:
    """Δ = a − b paired by seed over the seeds where both are finite: its mean, its std (n − 1;
    NaN for one seed), n, and whether it is outside the noise (`outside_noise`); `(nan, nan, 0,
    False)` when no seed pairs."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    d = [a[s] - b[s] for s in seeds]
    if not d:
        return math.nan, math.nan, 0, False
    sd = statistics.stdev(d) if len(d) > 1 else math.nan
    return statistics.fmean(d), sd, len(d), outside_noise(d)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedhet.reports.seeds", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    gr = sub.add_parser("grid", help="a compare directory's results.csv")
    gr.add_argument("dir", type=Path)
    gr.add_argument("--metric", default="final_accuracy")
    args = ap.parse_args(argv)
    pairs = grid_noise(args.dir / "results.csv", args.metric)
    print("outside the noise (mean ± std ranges do not overlap):")
    print("\n".join(f"- {p}" for p in pairs) if pairs else "- none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
