"""FedVeca's sections of docs/paper-scale.md: Figs. 3, 5, 7 and 8's claims, read from the curves.

- `fedveca_first`: FedVeca is the first to reach the centralized loss (accuracy), per case;
- `fedveca_case3`: FedVeca equally fast in Cases 1–3 while FedAvg and FedNova slow down in Case 3;
- `fedveca_n50`: at 50 clients FedVeca still converges faster than FedAvg and FedNova.

"Reaches" is read within `REACH` of the centralized line's span (`page_cells.central_target`);
"equally fast" within `SAME_SPEED` (the page's definitions).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from fedhet.papers.page_cells import (
    REACH,
    SAME_SPEED,
    Cell,
    by_exp,
    by_setup,
    central_target,
    final,
    loss_column,
    median,
    pick,
    plain,
    pm,
    rounds_to_central,
    to_central,
    where,
)
from fedhet.papers.page_rows import (
    EXPORT,
    Check,
    Section,
    Verdict,
    campaign_left,
    claim_rows,
    cnn_mnist,
    faster,
    not_run,
    order_claim,
    svm_files,
)
from fedhet.reports import paired_seeds as paired

FEDVECA_SVM = "PYTHONPATH=src python -m fedhet.papers.fedveca.study --out runs/fedveca-paper"
TODO = not_run(FEDVECA_SVM, EXPORT.format("fedveca"))
"""What the SVM rows say while results/fedveca/ has none."""


def reach_text(central: Cell, accuracy: bool) -> str:
    """`within 5% of the centralized loss (≤ 0.2370, median of seeds)`."""
    what = "accuracy" if accuracy else "loss"
    target = median(central_target(ref, accuracy, REACH) for ref in central.by_seed.values())
    return (f"within {REACH:.0%} of the centralized {what} ({'≥' if accuracy else '≤'} "
            f"{target:.4f}, median of seeds)")


def fedveca_first(accuracy: bool) -> Check:
    """FedVeca reaches the centralized final loss (accuracy) in fewer rounds than FedAvg and
    FedNova, per case: rounds paired over seeds, FedVeca − baseline below 0 and outside the
    noise for both baselines (medians shown). "Reaches" is read within `REACH` of the
    centralized line's span (`central_target`); the exact crossing is given beside it."""

    def check(cs: list[Cell]) -> list[tuple[str, Verdict]]:
        out = []
        for name, ecs in by_exp(cs).items():
            for setup, scs in by_setup(ecs).items():
                for case in (1, 2, 3):
                    got = {m: pick(scs, m, case) for m in ("fedveca", "fedavg", "fednova", "central")}
                    if not all(got.values()):
                        continue
                    central = got["central"][0]
                    methods = ("fedveca", "fedavg", "fednova")
                    per_seed = {m: rounds_to_central(got[m][0], central, accuracy, REACH)
                                for m in methods}
                    r = {m: median(v.values()) for m, v in per_seed.items()}
                    exact = {m: to_central(got[m][0], central, accuracy) for m in methods}
                    deltas = {m: paired(per_seed["fedveca"], per_seed[m]) for m in methods[1:]}
                    holds = all(out_ and mean < 0 for mean, _, _, out_ in deltas.values())
                    k = max((max(c["round"]) for c in central.by_seed.values()), default=0)
                    ours = (f"rounds to {reach_text(central, accuracy)}: "
                            + ", ".join(f"{m} {rounds_text(v, k)}" for m, v in r.items())
                            + " (Δ fedveca − " + ", − ".join(
                                f"{m} {pm(mean, sd, '{:+.1f}')}{' *' if o else ''}"
                                for m, (mean, sd, _, o) in deltas.items())
                            + "); to the value itself: "
                            + ", ".join(f"{m} {rounds_text(v, k)}" for m, v in exact.items())
                            + f" (medians of {len(central.by_seed)})"
                            + (finals(got, methods, accuracy) if min(r.values()) > k else ""))
                    out.append((where(case, setup, name), Verdict(ours, holds, central.exp)))
        return out

    return check


def finals(got: dict[str, list[Cell]], methods: Sequence[str], accuracy: bool) -> str:
    """`; final loss (mean of seeds): central …, fedveca …`: how far each method ends from the
    centralized line, for a case in which none reaches it (`REACH`)."""
    def mean_final(c: Cell) -> float:
        return statistics.mean(final(cols, "test_accuracy") if accuracy
                               else final({"x": loss_column(cols)}, "x")
                               for cols in c.by_seed.values())

    what = "accuracy" if accuracy else "loss"
    return f"; final {what} (mean of seeds): " + ", ".join(
        f"{m} {mean_final(got[m][0]):.4f}" for m in ("central", *methods))


def rounds_text(v: float, k: float) -> str:
    return f"never in {k:g}" if v > k else f"{v:g}"


def fedveca_case3(cs: list[Cell]) -> list[tuple[str, Verdict]]:
    """FedVeca equally fast in Cases 1–3; FedAvg and FedNova slower in Case 3 (rounds to within
    `REACH` of the centralized loss's span, of the same case; "slower": more than SAME_SPEED ×
    the slower of 1, 2)."""
    out = []
    for name, ecs in by_exp(cs).items():
        for setup, scs in by_setup(ecs).items():
            r: dict[str, dict[int, float]] = {}
            for case in (1, 2, 3):
                central = pick(scs, "central", case)
                for m in ("fedveca", "fedavg", "fednova"):
                    got = pick(scs, m, case)
                    if central and got:
                        r.setdefault(m, {})[case] = to_central(got[0], central[0], False, REACH)
            if len(r) < 3 or any(len(v) < 3 for v in r.values()):
                continue
            slower = {m: r[m][3] > SAME_SPEED * max(r[m][1], r[m][2]) for m in r}
            holds = not slower["fedveca"] and slower["fedavg"] and slower["fednova"]
            ours = "; ".join(f"{m}: " + "/".join(f"{r[m][k]:g}" for k in (1, 2, 3)) for m in r)
            out.append((where(None, setup, name), Verdict(
                f"rounds to within {REACH:.0%} of the centralized loss, Cases 1/2/3: {ours}", holds,
                ecs[0].exp)))
    return out



def _same_setup(partner: str) -> Callable[[list[Cell], Cell], list[Cell]]:
    """The partner of the same setup as A: `fedavg[N=50,ref40]` for `fedveca[N=50,ref40]`."""

    def select(c: list[Cell], a: Cell) -> list[Cell]:
        return [x for x in pick(c, partner, 3) if x.variants == a.variants] or plain(pick(c, partner, 3))

    return select


def fedveca_n50(cs: list[Cell]) -> list[tuple[str, Verdict]]:
    """At 50 clients FedVeca converges faster than FedAvg and FedNova (both with 50)."""
    out = []
    for partner in ("fedavg", "fednova"):
        out += faster(lambda c: pick(c, "fedveca", 3, clients="50"), _same_setup(partner))(cs)
    return out


def sections() -> list[Section]:
    first = "FedVeca is the first to reach the centralized"
    return [
        Section("FedVeca", "Figs. 3 and 5: SVM + MNIST even/odd, Cases 1–3 (fair protocol)", lambda r: (
            claim_rows(r, "fedveca", "SVM", first + " loss", fedveca_first(False), svm_files, TODO)
            + claim_rows(r, "fedveca", "SVM", first + " accuracy", fedveca_first(True), svm_files,
                         TODO)
            + claim_rows(r, "fedveca", "SVM", "FedVeca is equally fast in Cases 1–3 while FedAvg and "
                         "FedNova slow down in Case 3", fedveca_case3, svm_files, TODO))),
        Section("FedVeca", "Fig. 7: α_k on SVM, Case 3", lambda r: claim_rows(
            r, "fedveca", "SVM", "1 − α = 0.005 converges first, 0.5 slowest (0.05: between)",
            order_claim("fedveca", "alpha", ("0.995", "0.95", "0.5")), svm_files, TODO)),
        Section("FedVeca", "Fig. 8: clients on SVM, Case 3", lambda r: (
            claim_rows(r, "fedveca", "SVM", "FedVeca does not converge faster with more clients "
                       "(N = 5 fastest, then 30, then 50)",
                       order_claim("fedveca", "clients", ("5", "30", "50")), svm_files, TODO)
            + claim_rows(r, "fedveca", "SVM", "even at 50 clients FedVeca converges faster than FedAvg "
                         "and FedNova", fedveca_n50, svm_files, TODO))),
        Section("FedVeca", "Fig. 3: CNN + MNIST, Case 3", lambda r: (
            claim_rows(r, "fedveca", "CNN", first + " loss", fedveca_first(False), cnn_mnist,
                       campaign_left(r, "fedveca-cnn-mnist"))
            + claim_rows(r, "fedveca", "CNN", first + " accuracy", fedveca_first(True), cnn_mnist,
                         campaign_left(r, "fedveca-cnn-mnist")))),
    ]
