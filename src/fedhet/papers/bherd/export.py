"""BHerd's SVM studies (`readings`) as result files of docs/paper-scale.md.

`results/bherd/svm-<study>.csv`: one row per (case, method, seed, round) in the contract of
`fedhet.papers.paper_results` (`setting` = `case1`…`case3`; `algorithm` = `fedavg` or
`bherd` with its non-default options in brackets, e.g. `bherd[criterion=grab-stale]`,
`fedavg[ref40]`, `bherd[alpha=0.3]`, `bherd[B=10]`), plus `kept_steps` (the kept local steps
summed over the clients; BHerd only). Floats are written with 6 significant digits.

    python -m fedhet.papers.bherd.export --root runs/bherd-study --study criterion \\
        --out results/bherd --minutes 30 --command "..."
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhet.papers.bherd.preset import BEST_BATCH, CASES, common
from fedhet.papers.bherd.readings import methods, parse_seeds, run_dir
from fedhet.papers.paper_results import has_result, run_of, run_rows, short, write_meta, write_rows
from fedhet.rundir import read_metrics

DEFAULTS = {"alpha": 0.5, "reading": "mean-tau"}
"""BHerd's option values left out of the bracket."""


def algorithm_label(method: dict[str, Any], case: str) -> str:
    """`bherd[alpha=0.3,criterion=grab-stale,ref40]`-style label of a study method."""
    parts = []
    for key, value in sorted(method.items()):
        if key.startswith("algorithm."):
            name = key.split(".", 1)[1]
            if DEFAULTS.get(name) != value:
                parts.append(f"{name}={value}")
    if method.get("_setup", "default") != "default":
        parts.append(method["_setup"])
    if method.get("_batch") == "best" and BEST_BATCH[case] != common("paper")["batch_size"]:
        parts.append(f"B={BEST_BATCH[case]}")
    return method["algorithm"] + (f"[{','.join(parts)}]" if parts else "")


def study_rows(root: Path, study: str, reading: str, seeds: Sequence[int],
               setup: str = "default") -> tuple[list[dict[str, str]], list[Path]]:
    """The contract rows of every finished run of the study; and the runs still missing."""
    rows, missing = [], []
    for case in CASES:
        for method in methods(study, reading, setup).values():
            for seed in seeds:
                d = run_dir(root, case, method, seed)
                if not has_result(d):
                    missing.append(d)
                    continue
                run = run_of(d)
                clients = int(run.config.get("clients", 5))
                for r, m in zip(run_rows(run, case, algorithm_label(method, case)),
                                _kept(d, clients), strict=True):
                    rows.append({k: short(v) for k, v in r.items()} | {"kept_steps": m})
    return rows, missing


def _kept(run: Path, clients: int) -> list[str]:
    """Per round, `Σ_i kept_i` (BHerd's kept local steps) or empty."""
    out = []
    for m in read_metrics(run):
        vals = [v for i in range(clients) if not math.isnan(v := m.get(f"kept_{i}", math.nan))]
        out.append(str(int(sum(vals))) if vals else "")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedhet.papers.bherd.export",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--study", required=True)
    ap.add_argument("--reading", default="mean-tau")
    ap.add_argument("--setup", default="default")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-9"))
    ap.add_argument("--out", type=Path, default=Path("results/bherd"))
    ap.add_argument("--name", default=None, help="experiment name (default svm-<study>)")
    ap.add_argument("--command", required=True, help="the command that made the runs")
    ap.add_argument("--minutes", type=float, required=True, help="wall minutes of the runs")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--device", default="cpu: 2-core VM shared with 6 other jobs")
    args = ap.parse_args(argv)
    name = args.name or f"svm-{args.study}" + (f"-{args.setup}" if args.setup != "default" else "")
    rows, missing = study_rows(args.root, args.study, args.reading, args.seeds, args.setup)
    write_rows(args.out / f"{name}.csv", rows, ("kept_steps",))
    write_meta(args.out / f"{name}.json", name, "bherd", args.command, args.device, args.minutes,
               list(args.seeds), commit=args.commit, missing_runs=len(missing))
    print(f"{args.out / name}.csv: {len(rows)} rows; {len(missing)} run(s) missing")


if __name__ == "__main__":
    main()
