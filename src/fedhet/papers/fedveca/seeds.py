"""FedVeca's multi-seed table (docs/fedveca.md): one fair-comparison group directory per seed →
final accuracy and loss and the first round each method reaches fixed accuracy/loss thresholds,
mean ± std, and which differences are outside the noise (`fedhet.reports.seeds`' rule).

    python -m fedhet.papers.fedveca.seeds runs/g-s0 runs/g-s1 runs/g-s2 \\
        --acc 0.85,0.86 --loss 0.25,0.23
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from fedhet.papers.fedveca.protocol import first_round
from fedhet.papers.fedveca.runs import CENTRAL, FEDVECA, LABELS
from fedhet.reports import Stat, noise_pairs, stats_markdown
from fedhet.rundir import read_metrics

FEDVECA_METHODS = (FEDVECA, "fednova", "fedavg", CENTRAL)


def fedveca_stats(
    groups: Sequence[Path], methods: Sequence[str] = FEDVECA_METHODS,
    acc: Sequence[float] = (0.85, 0.86), loss: Sequence[float] = (0.25, 0.23),
) -> tuple[list[str], dict[str, dict[str, Stat]]]:
    """Columns and, per method label, one `Stat` per column over the seed groups."""
    columns = ["final accuracy", "final loss"]
    columns += [f"acc ≥ {t:g}" for t in acc] + [f"loss ≤ {t:g}" for t in loss]
    out: dict[str, dict[str, Stat]] = {}
    for method in methods:
        per_seed: list[list[float | None]] = []
        for g in groups:
            rows = read_metrics(Path(g) / method)
            last = [r for r in rows if math.isfinite(r.get("test_accuracy", math.nan))][-1]
            vals: list[float | None] = [last["test_accuracy"], last["test_loss"]]
            vals += [_f(first_round(rows, "test_accuracy", t, True)) for t in acc]
            vals += [_f(first_round(rows, "test_loss", t, False)) for t in loss]
            per_seed.append(vals)
        out[LABELS.get(method, method)] = {
            c: Stat(tuple(s[j] for s in per_seed)) for j, c in enumerate(columns)
        }
    return columns, out


def _f(v: int | None) -> float | None:
    return None if v is None else float(v)


def tau_all(groups: Sequence[Path]) -> Stat:
    """FedVeca's `τ_all` (protocol.json) over the seed groups."""
    return Stat(tuple(float(json.loads((Path(g) / "protocol.json").read_text())["tau_all"]) for g in groups))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedhet.papers.fedveca.seeds",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("groups", nargs="+", type=Path, help="fair-comparison groups, one per seed")
    ap.add_argument("--acc", default="0.85,0.86", help="accuracy thresholds (comma-separated)")
    ap.add_argument("--loss", default="0.25,0.23", help="loss thresholds (comma-separated)")
    args = ap.parse_args(argv)
    acc = [float(x) for x in args.acc.split(",") if x]
    loss = [float(x) for x in args.loss.split(",") if x]
    columns, stats = fedveca_stats(args.groups, acc=acc, loss=loss)
    print(f"n = {len(args.groups)} seeds; τ_all = {tau_all(args.groups).text('{:.0f}')}\n")
    print(stats_markdown(columns, stats))
    pairs = noise_pairs(columns, stats)
    print("outside the noise (mean ± std ranges do not overlap):")
    print("\n".join(f"- {p}" for p in pairs) if pairs else "- none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
