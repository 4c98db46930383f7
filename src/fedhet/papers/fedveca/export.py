"""FedVeca's SVM rows (`fedveca.study`) as result files of docs/paper-scale.md.

- `results/fedveca/svm-cases.csv` (Figs. 3, 5): `setting` = `case1`…`case3`, `algorithm` =
  `fedveca`, `central`, `fedavg`, `fednova` (the fair protocol of §IV-A1), extra column `tau_k`
  (`Σ_i p_i τ_(k,i)`, FedVeca only).
- `results/fedveca/svm-alpha-clients.csv` (Figs. 7, 8; Case 3): `algorithm` =
  `fedveca[alpha=…]`, `fedveca[N=…]`, `fedavg[N=50]`, `fednova[N=50]`; extra columns `alpha_k`
  (the run's constant `α_k`, FedVeca only), `clients`, `tau_k`.

Floats are written with 6 significant digits.

    python -m fedhet.papers.fedveca.export --out-dir DIR/runs --part cases \\
        --command "..." --minutes 40
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fedhet.papers.fedveca.study import PARTS, part_groups
from fedhet.papers.paper_results import has_result, run_of, run_rows, short, write_meta, write_rows

NAMES = {"cases": "svm-cases", "figs78": "svm-alpha-clients"}


def part_rows(runs: Path, part: str, seeds: Sequence[int],
              setup: str = "default") -> tuple[list[dict[str, str]], int]:
    rows, missing = [], 0
    for g in part_groups(part, seeds, setup):
        case = f"case{g.key.split('-case', 1)[1][0]}"
        methods = list(g.fedveca_runs) + [f"{b}{g.suffix}" for b in g.baselines]
        for method in methods:
            d = Path(runs) / g.key / method
            if not has_result(d):
                missing += 1
                continue
            run = run_of(d)
            algo = run.config["algorithm"]
            params = run.config.get("algorithm_params") or {}
            extra = {"clients": str(run.config.get("clients", ""))}
            if algo == "fedveca":
                extra["alpha_k"] = str(params.get("alpha", ""))
            label = algo if setup == "default" else f"{algo}[{setup}]"
            if part == "figs78":
                if algo == "fedveca" and method.startswith("fedveca-a"):
                    label = f"fedveca[alpha={params.get('alpha')}]"
                else:
                    label = f"{algo}[N={run.config.get('clients')}]"
                if setup != "default":
                    label = label[:-1] + f",{setup}]"
            for r in run_rows(run, case, label, ("tau_k",)):
                r = {k: short(v) for k, v in r.items()}
                rows.append(r | (extra if part == "figs78" else {}))
    return rows, missing


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedhet.papers.fedveca.export",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="the study's DIR/runs")
    ap.add_argument("--part", choices=PARTS, required=True)
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--out", type=Path, default=Path("results/fedveca"))
    ap.add_argument("--command", required=True)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--device", default="cpu: 2-core VM shared with 6 other jobs")
    ap.add_argument("--setup", default="default")
    args = ap.parse_args(argv)
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    rows, missing = part_rows(args.runs, args.part, seeds, args.setup)
    name = NAMES[args.part] + (f"-{args.setup}" if args.setup != "default" else "")
    extra = ("tau_k",) if args.part == "cases" else ("alpha_k", "clients", "tau_k")
    write_rows(args.out / f"{name}.csv", rows, extra)
    write_meta(args.out / f"{name}.json", name, "fedveca", args.command, args.device, args.minutes,
               seeds, commit=args.commit, missing_runs=missing)
    print(f"{args.out / name}.csv: {len(rows)} rows; {missing} run(s) missing")


if __name__ == "__main__":
    main()
