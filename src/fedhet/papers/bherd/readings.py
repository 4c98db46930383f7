"""BHerd's multi-seed study on SVM + MNIST even/odd (docs/bherd.md "Multi-seed study").

The paper's protocol (seed bherd.txt §2, preset `bherd` at `paper` scale): 5 clients, Cases 1–3
(`iid`, `label-per-client`, `half-iid`), `E = 1`, `K = 100`, `B = 50`, `η = 0.01`; FedAvg
with random reshuffling (§1.3), the BHerd family and GraB their own orders (§4.1). Studies:

- `readings`: FedAvg against BHerd-FedAvg under each reading of eqs. 6–7 (`mean-tau`, `sum`,
  `fixed-point` with `η_g = 1` and with a stable `η_g`), `α = 0.5`;
- `alpha`: BHerd-FedAvg, one reading, `α ∈ {0.1, 0.3, 0.5, 1.0}` (Fig. 3a);
- `grab`: GraB-FedAvg without and with cropping (`α = 0.5`, one reading);
- `control`: `fixed-point` with `α = 1` and half the `η_g`, the same step size as the
  `α = 0.5` runs (`m_i ≈ τ_i / 2`): herding or just gradient descent without client drift?
- `scaffold`: BHerd-SCAFFOLD (`α = 0.5`, one reading, the herd-error guard at its default
  `ρ = max_herd_error = 1`) against SCAFFOLD (random reshuffling, as the other baselines) and
  FedAvg; `report` adds a table of how often the guard replaced a client's herd
  (`herd_fallbacks`).
- three hypotheses for the gap to the paper, each against FedAvg of the same setup (the first
  method listed): `criterion` (GraB's reference herding criterion,
  `algorithm.criterion=grab-stale`), `ref40` (reference [40]'s setup, `preset.REF40`, with
  either criterion), `batch` (the paper's best batch sizes `B = 10, 10, 50` for Cases 1–3,
  `preset.BEST_BATCH`); `--setup ref40` runs the `alpha` study in reference [40]'s setup;
- `methods`: Fig. 2's methods at the preset's defaults (FedAvg, BHerd-FedAvg, GraB-FedAvg,
  FedNova, BHerd-FedNova, SCAFFOLD, BHerd-SCAFFOLD; `α = 0.5`), for the claims "GraB-FedAvg
  falls short", "BHerd improves FedNova" and "BHerd improves SCAFFOLD" (`--setup ref40`: the
  preset's SVM setup).

`--stack-runs N` steps up to `N` runs that share data and model as one cohort on the stacked
executor (`fedhet.runs.runner.run_specs`); 1 runs them one at a time in this process.

A run lives in `root/<case>/<method slug>/seed<s>`; finished (or diverged) runs are skipped, a
killed one is resumed from its checkpoint, so the command can be repeated. The git commit each
run was made at goes to `root/commits.jsonl`.

    python -m fedhet.papers.bherd.readings run --root runs/bherd-study --study readings \\
        --seeds 0-9
    python -m fedhet.papers.bherd.readings report --root runs/bherd-study --study readings
    python -m fedhet.papers.bherd.readings report --root runs/bherd-study --study alpha \
        --seeds 0-2 --baseline "BHerd mean-tau α=1.0"
    python -m fedhet.papers.bherd.readings report --root runs/bherd-study --study scaffold \
        --baseline SCAFFOLD

The report is a markdown table per study: mean ± std over seeds of the final accuracy, final
test loss, test loss at rounds 1–5 and rounds to reach FedAvg's final accuracy (FedAvg of the
same case and seed), and the paired difference to FedAvg over seeds, marked `*` when it is
outside the noise: `|mean Δ| > 2 · std(Δ)/√n`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhet import provenance
from fedhet.engine import OldFlag, assemble, config_of, load
from fedhet.errors import FedhetError
from fedhet.papers.bherd.plots import arrays, rounds_to_reach
from fedhet.papers.bherd.preset import BEST_BATCH, CASES, SETUPS, common
from fedhet.reports import mean_std, paired
from fedhet.rundir import RunStore, prepare_out, read_metrics
from fedhet.runs import RunSpec, execute, git_commit, run_specs

SVM = {"dataset": "mnist-even-odd", "model": "svm"}
FIXED_POINT_LR = 0.005
"""`η_g` of the stable `fixed-point` runs **[choice]**: with `η_g = 1` one round's step is
`η m_i ≈ 1.2` times the gradient, far above `2/L` (`L ≈ 250` for the standardised pixels), and
the run diverges; 10-round pilots on Case 1 diverged at `η_g = 0.03`, oscillated at `0.01`."""
EARLY = (1, 2, 3, 4, 5)
STUDIES = ("readings", "alpha", "grab", "control", "scaffold", "criterion", "ref40", "batch",
           "methods")
NEW_STUDIES = ("criterion", "ref40", "batch", "methods")
"""The hypotheses' studies (and `methods`): `paired_report` against the study's first method."""
LATE = tuple(range(1, 11))
"""Rounds 1–10, the early rounds the paired report averages beside the last."""
FEDAVG = "FedAvg"
SCAFFOLD = "SCAFFOLD"
GUARD = 1.0
"""`ρ` of the `scaffold` study: `bherd-scaffold`'s default `max_herd_error`, written out."""


def bherd(reading: str, alpha: float = 0.5, **extra: Any) -> dict[str, Any]:
    return {"algorithm": "bherd", "algorithm.alpha": alpha, "algorithm.reading": reading,
            **{f"algorithm.{k}": v for k, v in extra.items()}}


def methods(study: str, reading: str, setup: str = "default") -> dict[str, dict[str, Any]]:
    """Label → algorithm settings for one study (`reading` for the `alpha` and `grab` studies).
    Keys starting with `_` are not algorithm settings: `_setup` (`preset.SETUPS`), `_batch`
    (`"best"`: `preset.BEST_BATCH` of the case)."""
    if study in ("criterion", "ref40", "batch"):
        return _variants(study, reading)
    if setup != "default":
        tag = {"_setup": setup}
        return {f"{label} {setup}": {**m, **tag} for label, m in methods(study, reading).items()}
    return {FEDAVG: {"algorithm": "fedavg"}, **_compared(study, reading)}


def _variants(study: str, reading: str) -> dict[str, dict[str, Any]]:
    """BHerd `reading` against a variant of itself or of its setting: the `grab-stale`
    criterion (`criterion`), and with it the `ref40` setup (`ref40`), or FedAvg and BHerd at the
    case's best batch size (`batch`)."""
    stale = {"algorithm.criterion": "grab-stale"}
    if study == "criterion":
        return {FEDAVG: {"algorithm": "fedavg"}, f"BHerd {reading}": bherd(reading),
                f"BHerd {reading} grab-stale": {**bherd(reading), **stale}}
    if study == "ref40":
        tag = {"_setup": "ref40"}
        return {f"{FEDAVG} ref40": {"algorithm": "fedavg", **tag},
                f"BHerd {reading} ref40": {**bherd(reading), **tag},
                f"BHerd {reading} ref40 grab-stale": {**bherd(reading), **stale, **tag}}
    tag = {"_batch": "best"}
    return {f"{FEDAVG} B=best": {"algorithm": "fedavg", **tag},
            f"BHerd {reading} B=best": {**bherd(reading), **tag}}


def _compared(study: str, reading: str) -> dict[str, dict[str, Any]]:
    """The methods a study sets beside FedAvg: BHerd's readings, its α, GraB, Fig. 2's
    methods, the uncropped fixed point, or BHerd-SCAFFOLD with its herd-error guard."""
    if study == "readings":
        return {
            "BHerd mean-tau": bherd("mean-tau"),
            "BHerd sum": bherd("sum"),
            "BHerd fixed-point ηg=1": bherd("fixed-point"),
            f"BHerd fixed-point ηg={FIXED_POINT_LR}": bherd("fixed-point", server_lr=FIXED_POINT_LR),
        }
    if study == "alpha":
        return {f"BHerd {reading} α={a}": bherd(reading, a) for a in (0.1, 0.3, 0.5, 1.0)}
    if study == "grab":
        return {
            "GraB-FedAvg": {"algorithm": "grab-fedavg"},
            f"GraB-FedAvg crop α=0.5 {reading}": {
                "algorithm": "grab-fedavg", "algorithm.alpha": 0.5, "algorithm.reading": reading,
            },
        }
    if study == "methods":  # Fig. 2's methods at the preset's defaults (centralized SGD aside)
        return {
            f"BHerd {reading}": bherd(reading),
            "GraB-FedAvg": {"algorithm": "grab-fedavg"},
            "FedNova": {"algorithm": "fednova"},
            "BHerd-FedNova": {"algorithm": "bherd-fednova", "algorithm.alpha": 0.5},
            SCAFFOLD: {"algorithm": "scaffold"},
            f"BHerd-SCAFFOLD {reading}": {**bherd(reading), "algorithm": "bherd-scaffold"},
        }
    if study == "control":  # fixed-point without cropping, at the same step as α = 0.5
        return {f"fixed-point α=1 ηg={FIXED_POINT_LR / 2}": bherd(
            "fixed-point", 1.0, server_lr=FIXED_POINT_LR / 2)}
    if study == "scaffold":  # BHerd-SCAFFOLD with its herd-error guard
        return {
            SCAFFOLD: {"algorithm": "scaffold"},
            f"BHerd-SCAFFOLD {reading} ρ={GUARD}": {
                **bherd(reading, max_herd_error=GUARD), "algorithm": "bherd-scaffold",
            },
        }
    raise ValueError(f"unknown study {study!r}")


def slug(method: dict[str, Any], case: str | None = None) -> str:
    """A directory name from the algorithm settings, e.g. `bherd-alpha0.5-readingsum`; a
    setup other than the default adds `-<setup>`, a batch size other than the common one
    `-B<b>` (so `_batch: best` in Case 3, `B = 50`, is the default run's directory)."""
    extra = sorted((k.split(".", 1)[1], v) for k, v in method.items() if k.startswith("algorithm."))
    parts = [method["algorithm"], *(f"{k}{v}" for k, v in extra)]
    if method.get("_setup", "default") != "default":
        parts.append(method["_setup"])
    if method.get("_batch") == "best":
        if case is None:
            raise ValueError("the best batch size depends on the case")
        b = BEST_BATCH[case]
        if b != common("paper")["batch_size"]:
            parts.append(f"B{b}")
    return "-".join(parts)


def run_dir(root: Path, case: str, method: dict[str, Any], seed: int) -> Path:
    return Path(root) / case / slug(method, case) / f"seed{seed}"


def settings(case: str, method: dict[str, Any], seed: int) -> dict[str, Any]:
    out = {**common("paper"), **SVM, "partition": CASES[case], "seed": seed,
           **SETUPS[method.get("_setup", "default")],
           **{k: v for k, v in method.items() if not k.startswith("_")}}
    if method.get("_batch") == "best":
        out["batch_size"] = BEST_BATCH[case]
    return out


def status(out: Path) -> str:
    """`missing`, `running` (killed part-way), `finished` or `diverged`."""
    path = out / "summary.json"
    if not path.exists():
        return "missing"
    return str(json.loads(path.read_text()).get("status", "running"))



def run_one(spec: dict[str, Any], out: Path, data_cache: dict[str, Any], log: Callable[[str], None]) -> None:
    """Run `spec` into `out` with the dataset loaded once per process (resume if killed)."""
    if status(out) == "running":
        execute(None, out, resume=True, log=log)
        return
    cfg = config_of(spec)
    key = cfg.dataset
    if key not in data_cache:
        data_cache[key] = load(cfg)
    store = RunStore(out, provenance.of_run)
    sim = assemble(cfg, store=store, data=data_cache[key], log=log)
    prepare_out(out, force=True, warn=log)
    store.write_config(cfg.to_dict())
    sim.run()


def run_study(root: Path, study: str, seeds: Sequence[int], reading: str,
              cases: Sequence[str] = tuple(CASES), log: Callable[[str], None] = print,
              setup: str = "default", stack_runs: int = 1) -> None:
    if stack_runs > 1:
        run_stacked(root, study, seeds, reading, cases, setup, stack_runs)
        return
    data: dict[str, Any] = {}
    commit = git_commit()
    for seed in seeds:
        for case in cases:
            for label, method in methods(study, reading, setup).items():
                out = run_dir(root, case, method, seed)
                if status(out) in ("finished", "diverged"):
                    continue
                t0 = time.perf_counter()
                run_one(settings(case, method, seed), out, data, lambda m: None)
                log(f"{case} {label} seed {seed}: {status(out)} in {time.perf_counter() - t0:.1f} s")
                with open(Path(root) / "commits.jsonl", "a") as f:
                    f.write(json.dumps({"run": str(out.relative_to(root)), "commit": commit}) + "\n")


def run_stacked(root: Path, study: str, seeds: Sequence[int], reading: str,
                cases: Sequence[str], setup: str, stack_runs: int) -> None:
    """The study's runs through `run_specs` (one process): runs sharing data and model step
    together, `stack_runs` at a time; finished runs are skipped, killed ones resumed. Case by
    case, so a case's runs (all its seeds and methods) finish before the next case starts."""
    commit = git_commit()
    for case in cases:
        specs = [
            RunSpec(f"{case}/{slug(method, case)}/seed{seed}", case, label,
                    settings(case, method, seed))
            for seed in seeds for label, method in methods(study, reading, setup).items()
        ]
        todo = [s for s in specs if status(Path(root) / s.name) not in ("finished", "diverged")]
        if not todo:
            continue
        t0 = time.perf_counter()
        errors = run_specs(todo, Path(root), jobs=1, stack_runs=stack_runs)
        minutes = (time.perf_counter() - t0) / 60
        with open(Path(root) / "commits.jsonl", "a") as f:
            for s in todo:
                f.write(json.dumps({"run": s.name, "commit": commit, "stack_runs": stack_runs,
                                    "case_minutes": round(minutes, 2)}) + "\n")
        real = {k: v for k, v in errors.items() if "diverged" not in v}
        if real:
            raise SystemExit(f"{len(real)} run(s) failed: {next(iter(real.values()))}")


# -- report --------------------------------------------------------------------------------------
def seed_metrics(out: Path) -> dict[str, Any] | None:
    """Final accuracy and loss, losses at `EARLY` rounds; None when the run is missing."""
    if status(out) not in ("finished", "diverged"):
        return None
    m = arrays(read_metrics(out))
    by_round = dict(zip(m["round"].astype(int), m["test_loss"], strict=True))
    if status(out) == "diverged":
        return {"diverged": True, "m": m}
    return {"diverged": False, "m": m, "acc": float(m["test_accuracy"][-1]),
            "loss": float(m["test_loss"][-1]), "early": [float(by_round[k]) for k in EARLY]}


def report(root: Path, study: str, reading: str, cases: Sequence[str] = tuple(CASES),
           seeds: Sequence[int] | None = None, baseline: str = FEDAVG, setup: str = "default") -> str:
    """The study's table; `seeds` restricts it to those seeds, `baseline` names the method the
    paired differences are taken against (FedAvg; rounds to reach are always FedAvg's)."""
    short = "FedAvg" if baseline == FEDAVG else baseline
    head = ["case", "method", "n", "final acc", "final loss",
            *(f"loss r{k}" for k in EARLY), "rounds to FedAvg's final acc",
            f"Δ final acc vs {short}", f"Δ mean loss r1–5 vs {short}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table = methods(study, reading, setup)
    # under a setup every label carries it (`FedAvg ref40`): the names given stand for those
    fedavg_label = next(label for label in table if label.split(" ")[0] == FEDAVG)
    if baseline not in table and f"{baseline} {setup}" in table:
        baseline = f"{baseline} {setup}"
    if baseline == FEDAVG:
        baseline = fedavg_label
    if baseline not in table:
        raise FedhetError(f"--baseline {baseline!r}: the study's methods are {', '.join(table)}")
    for case in cases:
        runs: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in table}
        for label, method in table.items():
            for d in sorted((Path(root) / case / slug(method, case)).glob("seed*")):
                if seeds is not None and int(d.name[4:]) not in seeds:
                    continue
                r = seed_metrics(d)
                if r is not None:
                    runs[label][int(d.name[4:])] = r
        fedavg, base = runs[fedavg_label], runs[baseline]
        for label, by_seed in runs.items():
            if not by_seed:
                continue
            ok = {s: r for s, r in by_seed.items() if not r["diverged"]}
            lost = len(by_seed) - len(ok)
            n = f"{len(by_seed)}" + (f" ({lost} diverged)" if lost else "")
            if not ok:
                lines.append(f"| {case} | {label} | {n} |" + " — |" * (len(head) - 3))
                continue
            reach, never = [], 0
            for s, r in ok.items():
                if s in fedavg and not fedavg[s]["diverged"]:
                    hit = rounds_to_reach(r["m"], fedavg[s]["acc"])
                    if hit is None:
                        never += 1
                    else:
                        reach.append(hit)
            common_seeds = [s for s in ok if s in base and not base[s]["diverged"]]
            d_acc = [ok[s]["acc"] - base[s]["acc"] for s in common_seeds]
            d_early = [np.mean(ok[s]["early"]) - np.mean(base[s]["early"]) for s in common_seeds]
            early = [mean_std([r["early"][j] for r in ok.values()], 3) for j in range(len(EARLY))]
            reached = mean_std(reach, 1) + (f" ({never} never)" if never else "")
            cells = [case, label, n, mean_std([r["acc"] for r in ok.values()]),
                     mean_std([r["loss"] for r in ok.values()]), *early, reached,
                     "—" if label == baseline else paired(d_acc),
                     "—" if label == baseline else paired(d_early)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def guard_report(root: Path, study: str, reading: str, cases: Sequence[str] = tuple(CASES),
                 seeds: Sequence[int] | None = None) -> str:
    """How often the herd-error guard acted, per case and guarded method: client-rounds whose
    herd was replaced by all the client's gradients (`herd_fallbacks`, summed over the run),
    runs in which it acted at all, and the first and last round it acted (over those runs)."""
    head = ["case", "method", "n", "fallbacks per run (client-rounds)", "runs with any",
            "first round", "last round", "rounds with any, per run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        for label, method in methods(study, reading).items():
            if float(method.get("algorithm.max_herd_error", 0.0)) <= 0:
                continue
            totals, per_round, first, last = [], [], [], []
            for d in sorted((Path(root) / case / slug(method, case)).glob("seed*")):
                if seeds is not None and int(d.name[4:]) not in seeds:
                    continue
                r = seed_metrics(d)
                if r is None or "herd_fallbacks" not in r["m"]:
                    continue
                fb = np.nan_to_num(r["m"]["herd_fallbacks"])
                acted = r["m"]["round"][fb > 0].astype(int)
                totals.append(float(fb.sum()))
                per_round.append(float(len(acted)))
                if len(acted):
                    first.append(float(acted[0]))
                    last.append(float(acted[-1]))
            if not totals:
                continue
            lines.append("| " + " | ".join([
                case, label, str(len(totals)), mean_std(totals, 1), f"{len(first)}/{len(totals)}",
                mean_std(first, 1), mean_std(last, 1), mean_std(per_round, 1)]) + " |")
    return "\n".join(lines) + "\n"


PAIRED_METRICS = (
    ("final acc", "test_accuracy", "final"), ("final train loss", "train_loss", "final"),
    ("acc r1–10", "test_accuracy", "early"), ("train loss r1–10", "train_loss", "early"),
)
"""(column, metrics.csv column, `final` = the last round or `early` = the mean over `LATE`)."""


def run_values(out: Path) -> dict[str, float] | None:
    """The `PAIRED_METRICS` of one run; None when missing or unfinished; NaN when diverged."""
    st = status(out)
    if st not in ("finished", "diverged"):
        return None
    if st == "diverged":
        return {col: float("nan") for col, _, _ in PAIRED_METRICS}
    m = arrays(read_metrics(out))
    rounds = m["round"].astype(int)
    values = {}
    for col, key, when in PAIRED_METRICS:
        if key not in m:
            values[col] = float("nan")
        elif when == "final":
            values[col] = float(m[key][-1])
        else:
            values[col] = float(np.mean([m[key][rounds == k][0] for k in LATE]))
    return values


def paired_report(root: Path, study: str, reading: str, cases: Sequence[str] = tuple(CASES),
                  seeds: Sequence[int] | None = None, baseline: str | None = None,
                  setup: str = "default") -> str:
    """The paired comparison: per case and method, mean ± std over seeds of the test
    accuracy and the training loss (whole training set) at the last round and averaged over
    rounds 1–10, and each one's paired difference to `baseline` (default: the study's first
    method, FedAvg of the same setup), marked `*` outside the noise
    (`|mean Δ| > 2 · std(Δ)/√n`)."""
    table = methods(study, reading, setup)
    base = baseline or next(iter(table))
    head = ["case", "method", "n", *(c for c, _, _ in PAIRED_METRICS),
            *(f"Δ {c}" for c, _, _ in PAIRED_METRICS)]
    lines = [f"Paired against {base} (same seeds).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        runs: dict[str, dict[int, dict[str, float]]] = {label: {} for label in table}
        for label, method in table.items():
            for d in sorted((Path(root) / case / slug(method, case)).glob("seed*")):
                seed = int(d.name[4:])
                if seeds is not None and seed not in seeds:
                    continue
                v = run_values(d)
                if v is not None:
                    runs[label][seed] = v
        for label, by_seed in runs.items():
            if not by_seed:
                continue
            ok = {s: v for s, v in by_seed.items() if np.isfinite(v["final acc"])}
            lost = len(by_seed) - len(ok)
            n = f"{len(by_seed)}" + (f" ({lost} diverged)" if lost else "")
            cells = [case, label, n]
            digits = {"final acc": 4, "acc r1–10": 4}
            for col, _, _ in PAIRED_METRICS:
                cells.append(mean_std([v[col] for v in ok.values()], digits.get(col, 4)))
            pair = [s for s in ok if s in runs[base] and np.isfinite(runs[base][s]["final acc"])]
            for col, _, _ in PAIRED_METRICS:
                if label == base:
                    cells.append("—")
                else:
                    cells.append(paired([ok[s][col] - runs[base][s][col] for s in pair]))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_seeds(text: str) -> list[int]:
    """`0-4`, `5,7` or `3`."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return seeds


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedhet.papers.bherd.readings",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("run", "report"))
    ap.add_argument("--root", type=Path, default=Path("runs/bherd-study"))
    ap.add_argument("--study", choices=STUDIES, default="readings")
    ap.add_argument("--seeds", type=parse_seeds, default=None,
                    help="e.g. 0-4 or 0,2 (run: default 0-9; report: default every seed found)")
    ap.add_argument("--reading", default="mean-tau",
                    help="the reading of the alpha, grab and scaffold studies (default mean-tau)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--baseline", default=None,
                    help="report: the method of the paired differences (default FedAvg; for "
                    "the criterion, ref40, batch and methods studies and --paired the study's first method)")
    ap.add_argument("--setup", default="default", choices=list(SETUPS),
                    help="the SVM setup of the readings/alpha/grab/control/scaffold studies "
                    "(ref40: reference [40]'s, preset.REF40)")
    ap.add_argument("--stack-runs", type=int, default=1,
                    help="run: step up to N runs as one cohort (stacked executor); 1: one at a time")
    ap.add_argument("--batch-runs", type=int, dest="stack_runs", default=argparse.SUPPRESS,
                    action=OldFlag, new="--stack-runs", help=argparse.SUPPRESS)
    ap.add_argument("--paired", action="store_true",
                    help="report: the paired table (accuracy and training loss, rounds "
                    "1-10 and final) for any study")
    args = ap.parse_args(argv)
    if args.command == "run":
        run_study(args.root, args.study, args.seeds or parse_seeds("0-9"), args.reading, args.cases,
                  setup=args.setup, stack_runs=args.stack_runs)
    elif args.study in NEW_STUDIES or args.paired:
        print(paired_report(args.root, args.study, args.reading, args.cases, args.seeds,
                            args.baseline, args.setup), end="")
    else:
        table = report(args.root, args.study, args.reading, args.cases, args.seeds,
                       args.baseline or FEDAVG, args.setup)
        print(table, end="")
        if args.study == "scaffold":
            print("\n" + guard_report(args.root, args.study, args.reading, args.cases, args.seeds),
                  end="")


if __name__ == "__main__":
    main()
