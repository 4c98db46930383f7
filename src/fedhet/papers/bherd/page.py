"""BHerd's sections of docs/paper-scale.md: Figs. 2–3's claims, read from the curves.

Each BHerd method against its baseline of the same setup (`bherd_vs`: BHerd-FedAvg against
FedAvg, BHerd-FedNova against FedNova, …), α = 0.3 against α = 1 (`alpha_faster`); "converges
faster" is the page's early-loss rule (`page_rows.faster`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fedhet.papers.page_cells import Cell, Experiment, Results, cells, diverged, pick, plain, same_value
from fedhet.papers.page_rows import (
    EXPORT,
    Check,
    Row,
    Section,
    campaign_left,
    cell_left,
    claim_rows,
    cnn_mnist,
    faster,
    negate,
    not_run,
    svm_files,
)

BHERD_SVM = ("PYTHONPATH=src python -m fedhet.papers.bherd.readings run --root runs/bherd-study "
             "--study readings|alpha|criterion|ref40|batch|methods [--setup ref40] --seeds 0-9")
TODO = not_run(BHERD_SVM, EXPORT.format("bherd"))
"""What the SVM rows say while results/bherd/ has none."""


BHERD_ONLY = ("alpha", "criterion", "reading", "order", "rescale")
"""Variants of a BHerd method that its baseline does not have."""


def _baseline_of(a: Cell, base: str) -> Callable[[list[Cell], Cell], list[Cell]]:
    def sel(cs: list[Cell], _a: Cell) -> list[Cell]:
        shared = {k: v for k, v in a.variants.items() if k not in BHERD_ONLY}
        same = [c for c in cs if c.base == base and {k: v for k, v in c.variants.items()
                                                      if k not in BHERD_ONLY} == shared]
        return same or plain([c for c in cs if c.base == base])

    return sel


def with_criterion(c: Cell) -> str:
    """A BHerd cell named with its herding criterion and reading (the defaults when its label
    gives none) and its diverged seeds: `BHerd-FedAvg (criterion=greedy, reading=mean-tau;
    diverged in 4/4 seeds)`."""
    base = re.split(r"[\[(]", c.algorithm, maxsplit=1)[0]
    criterion = c.variants.get("criterion", "greedy")
    reading = c.variants.get("reading", "mean-tau")
    seeds = diverged(c).strip(" ()")
    return f"{base} (criterion={criterion}, reading={reading}{'; ' + seeds if seeds else ''})"


def bherd_vs(base: str, partner: str, describe: Callable[[Cell], str] = lambda c: c.algorithm) -> Check:
    """Every `base` cell (α = 0.5, the default, or none given) against `partner` of the same
    setup; `describe` names the BHerd cell in its row."""

    def a_sel(cs: list[Cell]) -> list[Cell]:
        return [c for c in cs if c.base == base and (
            "alpha" not in c.variants or same_value(c.variants["alpha"], "0.5"))]

    def b_sel(cs: list[Cell], a: Cell) -> list[Cell]:
        return _baseline_of(a, partner)(cs, a)

    return faster(a_sel, b_sel, describe)


def alpha_faster(lo: str, hi: str, base: str = "bherd") -> Check:
    """`base` with α = lo converges faster than with α = hi (same experiment and case)."""

    def a_sel(cs: list[Cell]) -> list[Cell]:
        return pick(cs, base, alpha=lo)

    def b_sel(cs: list[Cell], a: Cell) -> list[Cell]:
        rest = {k: v for k, v in a.variants.items() if k != "alpha"}
        return [c for c in pick(cs, base, alpha=hi)
                if {k: v for k, v in c.variants.items() if k != "alpha"} == rest]

    return faster(a_sel, b_sel)


def svm_main(e: Experiment) -> bool:
    """The SVM files for "BHerd-FedAvg converges faster than FedAvg": the α sweeps and the
    methods study hold copies of another study's FedAvg and BHerd-FedAvg (α = 0.5) runs, whose
    rows that study's own file already gives."""
    return svm_files(e) and "alpha" not in e.name and not e.name.startswith("svm-methods")


def grab_stale_pending(res: Results) -> list[Row]:
    """The CNN Case 3 row under GraB's criterion while the campaign has not recorded it."""
    label = "BHerd-FedAvg[criterion=grab-stale]"
    if any(c.algorithm == label for c in cells(e for e in res.of("bherd") if cnn_mnist(e))):
        return []
    return [Row("CNN Case 3: BHerd-FedAvg (criterion=grab-stale, reading=mean-tau) vs FedAvg",
                "BHerd-FedAvg converges faster than FedAvg",
                cell_left(res, "bherd-cnn-mnist", "CNN + MNIST case3", label))]


def sections() -> list[Section]:
    return [
        Section("BHerd", "Fig. 2a–b: SVM + MNIST even/odd, Cases 1–3 (and item 2's variants)", lambda r: (
            claim_rows(r, "bherd", "SVM", "BHerd-FedAvg converges faster than FedAvg",
                       bherd_vs("bherd", "fedavg"), svm_main, TODO)
            + claim_rows(r, "bherd", "SVM", "GraB-FedAvg falls short in enhancing FedAvg's convergence "
                         "(holds = not faster)", negate(bherd_vs("grab-fedavg", "fedavg")), svm_files,
                         TODO)
            + claim_rows(r, "bherd", "SVM", "BHerd improves FedNova's convergence",
                         bherd_vs("bherd-fednova", "fednova"), svm_files, TODO)
            + claim_rows(r, "bherd", "SVM", "BHerd improves SCAFFOLD's convergence",
                         bherd_vs("bherd-scaffold", "scaffold"), svm_files, TODO))),
        Section("BHerd", "Fig. 3a: α on SVM + MNIST, Cases 1–3", lambda r: claim_rows(
            r, "bherd", "SVM", "α = 0.3 converges faster than α = 1", alpha_faster("0.3", "1.0"),
            svm_files, TODO)),
        Section("BHerd", "Fig. 2a: CNN + MNIST, Cases 1–3", lambda r: claim_rows(
            r, "bherd", "CNN", "BHerd-FedAvg converges faster than FedAvg",
            bherd_vs("bherd", "fedavg", with_criterion), cnn_mnist, campaign_left(r, "bherd-cnn-mnist"))
            + grab_stale_pending(r)),
    ]
