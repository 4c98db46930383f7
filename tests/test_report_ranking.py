"""Which cell is bold: one rule, `results.RANKING_RULE`, tried on hand-made results.

Reference lines are never ranked; every method is judged on the seeds all of them ran; a method
that reached the target (or did not diverge) in more seeds ranks above one that did in fewer;
the to-target cells show the median and `k/n seeds reached`. The page and docs/grids.md print
the rule word for word.
"""

from __future__ import annotations

import html
from pathlib import Path

from fedhet.runs.results import RANKING_RULE, is_reference, rank, summary_tables

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _row(label: str, seed: int, algorithm: str = "fedavg", group: str = "g", status: str = "finished",
         **values: float) -> dict:
    return {"label": label, "group": group, "seed": seed, "algorithm": algorithm, "status": status,
            "wall_time_s": 1.0, **values}


def _table(tables, title_start: str):
    return next(t for t in tables if t.title.startswith(title_start))


def _bold(table) -> set[str]:
    return {table.rows[i][0] for i, _ in table.best}


def test_a_reference_line_is_shown_but_never_bold():
    """The FedSR smoke page: centralized training needs 8 transfers to 90 % (one client, no
    exchange to speak of); it is no federated method and must not be bold."""
    rows = [_row("Centralized", 0, "central", final_accuracy=0.97, transfers_to_target=8.0,
                 rounds_to_target=4.0, bytes_to_target=2.9e5),
            _row("FedAvg", 0, final_accuracy=0.93, transfers_to_target=120.0, rounds_to_target=12.0,
                 bytes_to_target=9e6),
            _row("FedSR", 0, "fedsr", final_accuracy=0.94, transfers_to_target=60.0,
                 rounds_to_target=15.0, bytes_to_target=5e6)]
    tables = summary_tables(rows, 0.9)
    assert is_reference("central") and not is_reference("fedavg") and not is_reference("no-such")
    assert _bold(_table(tables, "Model transfers")) == {"FedSR"}
    assert _bold(_table(tables, "Communication")) == {"FedSR"}
    assert _bold(_table(tables, "Rounds")) == {"FedAvg"}
    assert _bold(_table(tables, "Final")) == {"FedSR"}  # not the reference's 97 %
    assert [label for label, _ in tables[0].rows] == ["Centralized (reference)", "FedAvg", "FedSR"]


def test_the_method_that_reached_the_target_in_more_seeds_is_bold():
    """grid-digits, "Rounds to 85 %": FedAvgM γ = 0.9 reached it in 3 of 3 seeds (17.3 on
    average); the others reached it faster but only in some seeds, so they rank below it."""
    rows = [_row("FedAvgM 0.9", s, "fedavgm", rounds_to_target=r) for s, r in enumerate((13.0, 17.0, 22.0))]
    rows += [_row("FedAvg", 0, rounds_to_target=9.0), _row("FedAvg", 1, rounds_to_target=10.0),
             _row("FedAvg", 2)]
    rows += [_row("FedAvgM 0.5", 0, "fedavgm", rounds_to_target=8.0), _row("FedAvgM 0.5", 1, "fedavgm"),
             _row("FedAvgM 0.5", 2, "fedavgm")]
    rounds = _table(summary_tables(rows, 0.85), "Rounds")
    assert _bold(rounds) == {"FedAvgM 0.9"}
    cells = {label: cells[0] for label, cells in rounds.rows}
    assert cells == {"FedAvgM 0.9": "17.0 [13.0–22.0] · 3/3 seeds reached",
                     "FedAvg": "9.5 [9.0–10.0] · 2/3 seeds reached",
                     "FedAvgM 0.5": "8.0 · 1/3 seeds reached"}


def test_methods_are_compared_on_the_seeds_every_one_of_them_ran():
    """B's seed 2 failed (not ran): A's lucky seed 2 is left out, and on seeds 0 and 1 B is
    ahead, although A's printed mean (over its three seeds) is higher."""
    rows = [_row("A", 0, final_accuracy=0.80), _row("A", 1, final_accuracy=0.80),
            _row("A", 2, final_accuracy=0.99),
            _row("B", 0, final_accuracy=0.85), _row("B", 1, final_accuracy=0.85),
            _row("B", 2, status="failed")]
    final = _table(summary_tables(rows, None), "Final")
    assert _bold(final) == {"B"}
    assert dict(final.rows)["A"] == ["86.33 ± 10.97"]
    assert final.notes == ["g: ranked on seed(s) 0, 1: the ones every method ran."]


def test_a_diverged_seed_counts_against_its_method():
    rows = [_row("A", s, final_accuracy=0.80) for s in range(3)]
    rows += [_row("B", 0, final_accuracy=0.95), _row("B", 1, final_accuracy=0.95),
             _row("B", 2, status="diverged")]
    assert _bold(_table(summary_tables(rows, None), "Final")) == {"A"}


def test_ties_and_lone_methods():
    outcomes = {"A": {0: 0.5, 1: 0.7}, "B": {0: 0.6, 1: 0.6}, "C": {0: 0.1, 1: None}}
    assert rank(outcomes, True, "{:.2f}").best == {"A", "B"}  # 0.60 each, as printed
    assert rank({"A": {0: 0.5}, "B": {0: 0.5}}, True, "{:.2f}").best == set()  # everyone ties
    assert rank({"A": {0: 0.5}}, True, "{:.2f}").best == set()  # nothing to compare with
    assert rank({"A": {0: None}, "B": {0: None}}, False, "{:.1f}").best == set()  # none reached
    # the leaders reached the target on different seeds: no seed to compare them on
    split = rank({"A": {0: 5.0, 1: None}, "B": {0: None, 1: 3.0}}, False, "{:.1f}")
    assert split.best == set() and "no seed where the leaders all have a value" in split.note


def test_the_rule_is_printed_on_the_page_and_in_the_docs(tmp_path):
    from fedhet.reports import report
    from fedhet.runs.single import execute

    for algorithm in ("fedavg", "central"):
        execute({"dataset": "digits", "clients": 3, "rounds": 2, "lr": 0.1, "algorithm": algorithm},
                tmp_path / "runs" / algorithm, log=lambda _: None)
    text = report.write_report(tmp_path / "runs", tmp_path / "page").read_text()
    assert html.escape(RANKING_RULE) in text and "fedhet docs grids" in text
    assert "central (reference)" in text and "<b>" not in text  # one federated method: none bold
    docs = " ".join((DOCS / "grids.md").read_text().replace("\n> ", "\n").split())  # a quote
    assert "Which cell is bold" in docs and RANKING_RULE in docs
