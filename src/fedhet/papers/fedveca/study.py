"""FedVeca's SVM rows at the paper's scale, in priority order.

`fedhet reproduce fedveca --scale paper --only mnist-even-odd` runs the same runs, but it runs
every FedVeca run (stage 1, all seeds and figures) before any baseline (stage 2), and a FedVeca
run that diverges (Fig. 7's `α = 0.995` does, with standardised pixels) stops it before stage 2.
This driver runs the preset's SVM groups (`preset.groups("paper")`, the same run names,
settings and directory layout, so the two share finished runs) in this order: Figs. 3 and 5
(Cases 1–3: FedVeca, then centralized SGD, FedAvg and FedNova under the fair protocol), then
Figs. 7 and 8 (Case 3: the `α` and client-count groups); within a part, stage 1 of every seed,
then stage 2, stepped as cohorts of `--stack-runs` runs on the stacked executor. A diverged
FedVeca run is a result, not a failure: its group's baselines still run when they do not
depend on it.

    python -m fedhet.papers.fedveca.study --out runs/fedveca-paper --parts cases figs78
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from fedhet.engine import OldFlag
from fedhet.papers.base import SVM_SETUPS
from fedhet.papers.fedveca.preset import Group, baseline_specs, fedveca_specs, groups
from fedhet.runs import run_specs

PARTS = ("cases", "figs78")


def part_groups(part: str, seeds: Sequence[int] | None = None, setup: str = "default") -> list[Group]:
    """The paper-scale SVM groups of one part: `cases` (Figs. 3, 5) or `figs78` (Figs. 7, 8);
    `setup="ref40"`: in reference [40]'s setup (`base.REF40`: pixels in [0, 1], no bias,
    zero initial weights, `λ = 0.1`, `B = 100`, `η = 0.01`)."""
    out = []
    for g in groups("paper", "fedhet" if setup == "default" else setup):
        if g.settings["model"] != "svm" or (seeds is not None and g.settings["seed"] not in seeds):
            continue
        is_case = not g.key.endswith(("-alpha", "-clients")) and "-alpha-" not in g.key \
            and "-clients-" not in g.key
        if (part == "cases") == is_case:
            out.append(g)
    return out


def run_part(out: Path, part: str, stack_runs: int, seeds: Sequence[int] | None = None,
             setup: str = "default") -> None:
    runs = Path(out) / "runs"
    todo = part_groups(part, seeds, setup)
    t0 = time.perf_counter()
    run_specs([s for g in todo for s in fedveca_specs(g)], runs, jobs=1, stack_runs=stack_runs)
    stage2 = []
    for g in todo:
        source = runs / g.key / g.fair_from / "summary.json"
        if g.baselines and source.exists():
            stage2 += baseline_specs(g, runs)
    run_specs(stage2, runs, jobs=1, stack_runs=stack_runs)
    print(f"{part}: {(time.perf_counter() - t0) / 60:.1f} min", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedhet.papers.fedveca.study",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/fedveca-paper"))
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,1")
    ap.add_argument("--stack-runs", type=int, default=30)
    ap.add_argument("--batch-runs", type=int, dest="stack_runs", default=argparse.SUPPRESS,
                    action=OldFlag, new="--stack-runs", help=argparse.SUPPRESS)
    ap.add_argument("--setup", choices=list(SVM_SETUPS), default="default",
                    help="ref40: reference [40]'s SVM setup (use another --out)")
    args = ap.parse_args(argv)
    lo_hi = [p.partition("-") for p in args.seeds.split(",")]
    seeds = [s for lo, _, hi in lo_hi for s in range(int(lo), int(hi or lo) + 1)]
    for part in args.parts:
        run_part(args.out, part, args.stack_runs, seeds, args.setup)


if __name__ == "__main__":
    main()
