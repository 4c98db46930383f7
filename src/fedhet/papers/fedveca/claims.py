"""FedVeca's SVM claims (Figs. 3, 5) checked from `results/fedveca/svm-cases*.csv`.

Claims: "FedVeca is the first to reach the centralized loss and accuracy" and "FedVeca is
equally fast in Cases 1–3 while FedAvg and FedNova slow down in Case 3". Centralized SGD's
final value is the reference line (as in the paper's figures). Per case and method, over the
seeds: the final test accuracy and training loss (the paper's "loss" is the training loss over
the whole training set; `train_loss`), and the first round at which the method comes within a
margin of the centralized line of the same seed (`acc ≥ central − margin`, `loss ≤ central +
margin`), mean ± std over the seeds that reach it (`k never` counts the others: they count as
round `K + 1` in the paired differences). Paired differences are against FedVeca of the same
seed, marked `*` outside the noise (`|mean Δ| > 2 · std(Δ)/√n`).

`--reach` reads "reaches the centralized value" with docs/paper-scale.md's rule instead
(`page_cells.REACH`, `central_target`): within 5 % of the centralized run's own span of its
final value, `acc ≥ c − 0.05·|c₀ − c|`, `loss ≤ c + 0.05·|c₀ − c|` (`reach_table`).

    python -m fedhet.papers.fedveca.claims results/fedveca/svm-cases.csv [--reach]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fedhet.papers.page_cells import REACH, central_target
from fedhet.papers.paper_results import Curves, read_results
from fedhet.reports import mean_std, paired

ACC_MARGINS = (0.01, 0.005, 0.0)
LOSS_MARGINS = (0.01, 0.005, 0.0)
METHODS = ("fedveca", "fedavg", "fednova", "central")


def first(values: Sequence[float], ok) -> int | None:
    """First round index ≥ 1 whose value satisfies `ok` (None: never)."""
    for k, v in enumerate(values):
        if k >= 1 and math.isfinite(v) and ok(v):
            return k
    return None


def _ms(v: Sequence[float], digits: int) -> str:
    """`mean_std` over the finite values (a run that never reached a target counts apart)."""
    return mean_std([x for x in v if math.isfinite(x)], digits)


def _reach(rows: Sequence[dict[str, float]], key: str) -> str:
    vals = [r[key] for r in rows]
    never = sum(1 for v in vals if not math.isfinite(v))
    return _ms(vals, 1) + (f" ({never} never)" if never else "")


def method_label(curves: Curves, case: str, method: str) -> str | None:
    """The CSV's algorithm label of `method` in `case` (`fedavg` or `fedavg[ref40]`)."""
    for s, a in curves:
        if s == case and (a == method or a.startswith(method + "[")):
            return a
    return None


def _labels(curves: Curves, case: str) -> dict[str, str]:
    """`method_label` of each of `METHODS` that `case` has, by method."""
    found = {m: method_label(curves, case, m) for m in METHODS}
    return {m: label for m, label in found.items() if label is not None}


def _per_seed(
    curves: Curves, case: str, labels: dict[str, str],
    row_of: Callable[[dict[str, list[float]], dict[str, list[float]]], dict[str, float]],
) -> dict[str, dict[int, dict[str, float]]]:
    """`row_of(central run, method run)` for each seed of the three federated methods of `case`
    that the centralized run has too, by method and seed."""
    central = curves[(case, labels["central"])]
    per: dict[str, dict[int, dict[str, float]]] = {}
    for m in METHODS[:3]:
        label = labels.get(m)
        if label is None:
            continue
        per[m] = {seed: row_of(central[seed], cols)
                  for seed, cols in curves[(case, label)].items() if seed in central}
    return per


def claims_table(curves: Curves) -> str:
    cases = sorted({s for s, _ in curves})
    head = ["case", "method", "n", "final acc", "final train loss", "central final acc",
            "central final train loss"]
    head += [f"rounds to acc ≥ central − {m:g}" for m in ACC_MARGINS]
    head += [f"rounds to loss ≤ central + {m:g}" for m in LOSS_MARGINS]
    head += ["Δ final acc vs FedVeca", "Δ final train loss vs FedVeca",
             f"Δ rounds to acc ≥ central − {ACC_MARGINS[0]:g} vs FedVeca",
             f"Δ rounds to loss ≤ central + {LOSS_MARGINS[0]:g} vs FedVeca"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        labels = _labels(curves, case)
        if "central" not in labels or "fedveca" not in labels:
            continue
        def margins(ref: dict[str, list[float]], cols: dict[str, list[float]]) -> dict[str, float]:
            c_acc, c_loss = ref["test_accuracy"][-1], ref["train_loss"][-1]
            acc, loss = cols["test_accuracy"], cols["train_loss"]
            k_max = len(acc)
            row = {"acc": acc[-1], "loss": loss[-1], "c_acc": c_acc, "c_loss": c_loss}
            for j, mg in enumerate(ACC_MARGINS):
                hit = first(acc, lambda v, t=c_acc - mg: v >= t - 1e-12)
                row[f"ra{j}"] = float(hit) if hit is not None else math.nan
                row[f"ra{j}_pen"] = float(hit) if hit is not None else float(k_max)
            for j, mg in enumerate(LOSS_MARGINS):
                hit = first(loss, lambda v, t=c_loss + mg: v <= t + 1e-12)
                row[f"rl{j}"] = float(hit) if hit is not None else math.nan
                row[f"rl{j}_pen"] = float(hit) if hit is not None else float(k_max)
            return row

        per = _per_seed(curves, case, labels, margins)
        for m, by_seed in per.items():
            rows = list(by_seed.values())
            cells = [case, labels[m], str(len(rows)), _ms([r["acc"] for r in rows], 4),
                     _ms([r["loss"] for r in rows], 4), _ms([r["c_acc"] for r in rows], 4),
                     _ms([r["c_loss"] for r in rows], 4)]
            cells += [_reach(rows, f"ra{j}") for j in range(len(ACC_MARGINS))]
            cells += [_reach(rows, f"rl{j}") for j in range(len(LOSS_MARGINS))]
            if m == "fedveca":
                cells += ["—"] * 4
            else:
                base = per["fedveca"]
                common = [s for s in by_seed if s in base]
                for key, digits in (("acc", 4), ("loss", 4), ("ra0_pen", 1), ("rl0_pen", 1)):
                    cells.append(paired([by_seed[s][key] - base[s][key] for s in common], digits))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reach_table(curves: Curves, reach: float = REACH) -> str:
    """Per case and method: the first round at which the test accuracy and the training loss
    reach the centralized run's `central_target` of the same seed (the page's rule), mean ± std
    over the seeds that get there (`k never`), and the paired difference against FedVeca (a
    seed that never gets there counts as round K + 1)."""
    head = ["case", "method", "n", "centralized acc c₀ → c", "target acc", "rounds to acc",
            "centralized train loss c₀ → c", "target loss", "rounds to loss",
            "Δ rounds to acc vs FedVeca", "Δ rounds to loss vs FedVeca"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in sorted({s for s, _ in curves}):
        labels = _labels(curves, case)
        if "central" not in labels or "fedveca" not in labels:
            continue
        def reached(ref: dict[str, list[float]], cols: dict[str, list[float]]) -> dict[str, float]:
            row = {"c0a": ref["test_accuracy"][0], "ca": ref["test_accuracy"][-1],
                   "c0l": ref["train_loss"][0], "cl": ref["train_loss"][-1]}
            for key, column, accuracy in (("a", "test_accuracy", True), ("l", "train_loss", False)):
                target = central_target(ref, accuracy, reach)
                hit = first(cols[column], lambda v, t=target, up=accuracy: v >= t if up else v <= t)
                row["t" + key] = target
                row["r" + key] = float(hit) if hit is not None else math.nan
                row["p" + key] = float(hit) if hit is not None else float(len(cols[column]))
            return row

        per = _per_seed(curves, case, labels, reached)
        for m, by_seed in per.items():
            rows = list(by_seed.values())
            cells = [case, labels[m], str(len(rows)),
                     f"{_ms([r['c0a'] for r in rows], 4)} → {_ms([r['ca'] for r in rows], 4)}",
                     _ms([r["ta"] for r in rows], 4), _reach(rows, "ra"),
                     f"{_ms([r['c0l'] for r in rows], 4)} → {_ms([r['cl'] for r in rows], 4)}",
                     _ms([r["tl"] for r in rows], 4), _reach(rows, "rl")]
            if m == "fedveca":
                cells += ["—"] * 2
            else:
                base = per["fedveca"]
                common = [s for s in by_seed if s in base]
                cells += [paired([by_seed[s][k] - base[s][k] for s in common], 1) for k in ("pa", "pl")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_mean_curves(curves: Curves, out: Path, columns: Sequence[str] = ("train_loss", "test_accuracy"),
                     rounds: int | None = None, ylims: dict[str, tuple[float, float]] | None = None) -> Path:
    """One panel per (setting, column): each algorithm's mean over seeds by round, with a band
    of ± one std; `rounds`: show rounds 0…rounds only."""
    import matplotlib  # lazy: only the figures need matplotlib (the claims table does not)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the Agg backend is chosen

    settings = sorted({s for s, _ in curves})
    fig, axes = plt.subplots(len(columns), len(settings), figsize=(4.2 * len(settings), 3.2 * len(columns)),
                             squeeze=False)
    for j, setting in enumerate(settings):
        for (s, algo), by_seed in curves.items():
            if s != setting:
                continue
            for i, col in enumerate(columns):
                seeds = [c[col] for c in by_seed.values() if col in c]
                if not seeds:
                    continue
                n = min(len(v) for v in seeds) if rounds is None else min(rounds + 1, *map(len, seeds))
                a = np.array([v[:n] for v in seeds], dtype=float)
                m, sd = np.nanmean(a, 0), np.nanstd(a, 0)
                x = np.arange(n)
                ax = axes[i][j]
                ax.plot(x, m, label=f"{algo} (n={len(seeds)})", lw=1.2)
                ax.fill_between(x, m - sd, m + sd, alpha=0.15)
                ax.set_title(f"{setting}: {col}", fontsize=9)
                if ylims and col in ylims:
                    ax.set_ylim(*ylims[col])
    for ax in axes.flat:
        ax.set_xlabel("round", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _lims(text: str | None) -> dict[str, tuple[float, float]]:
    """`train_loss=0.18:0.4,test_accuracy=0.8:0.9` → limits per column."""
    out = {}
    for part in (text or "").split(","):
        if part:
            col, _, rng = part.partition("=")
            lo, _, hi = rng.partition(":")
            out[col] = (float(lo), float(hi))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedhet.papers.fedveca.claims",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--plot", type=Path, default=None, help="also write mean curves to this PNG")
    ap.add_argument("--rounds", type=int, default=None, help="--plot: rounds 0..N only")
    ap.add_argument("--ylim", default=None, help="--plot: e.g. train_loss=0.18:0.4")
    ap.add_argument("--reach", action="store_true",
                    help=f"read 'reaches the centralized value' with the page's rule (within "
                         f"{REACH * 100:g} %% of the centralized curve's span)")
    args = ap.parse_args(argv)
    curves = read_results(args.csv)
    if args.plot:
        plot_mean_curves(curves, args.plot, rounds=args.rounds, ylims=_lims(args.ylim))
        return
    print(reach_table(curves) if args.reach else claims_table(curves), end="")


if __name__ == "__main__":
    main()
