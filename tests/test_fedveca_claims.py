"""FedVeca's claims table (`fedveca.claims`) by hand on a tiny results CSV."""

from __future__ import annotations

from fedhet.papers.fedveca.claims import claims_table
from fedhet.papers.paper_results import read_results, write_rows


def test_rounds_to_the_centralized_line_and_paired_deltas(tmp_path):
    """Centralized SGD ends at acc 0.90 / train loss 0.20 in both seeds. FedVeca's accuracy
    reaches 0.89 (central − 0.01) at round 2 in both seeds; FedAvg's at round 3 in seed 0 and
    never (counted as round K + 1 = 5 in the paired Δ) in seed 1: Δ = (1, 3), mean 2."""
    curves = {
        "central": ([0.5, 0.9, 0.9, 0.9, 0.9], [1.0, 0.2, 0.2, 0.2, 0.2]),
        "fedveca": ([0.5, 0.8, 0.89, 0.9, 0.9], [1.0, 0.5, 0.21, 0.2, 0.2]),
    }
    fedavg = {0: ([0.5, 0.7, 0.8, 0.89, 0.89], [1.0, 0.5, 0.3, 0.25, 0.22]),
              1: ([0.5, 0.7, 0.8, 0.85, 0.88], [1.0, 0.5, 0.3, 0.25, 0.23])}
    rows = []
    for seed in (0, 1):
        for algo, (acc, loss) in [*curves.items(), ("fedavg", fedavg[seed])]:
            rows += [{"setting": "case3", "algorithm": algo, "seed": seed, "round": k,
                      "test_accuracy": a, "test_loss": "", "train_loss": lo}
                     for k, (a, lo) in enumerate(zip(acc, loss, strict=True))]
    path = tmp_path / "svm-cases.csv"
    write_rows(path, rows)
    table = claims_table(read_results(path))
    cells = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in table.splitlines()[2:]}
    assert set(cells) == {"fedveca", "fedavg", "fednova"} - {"fednova"}
    assert cells["fedveca"][7] == "2.0 ± 0.0"
    assert cells["fedavg"][7] == "3.0 (1 never)"
    assert cells["fedavg"][10] == "— (2 never)"  # loss ≤ 0.21 is never reached
    assert cells["fedavg"][15] == "+2.0 ± 1.4"  # Δ rounds: (1, 3), inside the noise at n = 2
    assert cells["fedavg"][13] == "-0.0150 ± 0.0071 *"  # Δ final acc (−0.01, −0.02): 2·se = 0.01


def test_reach_reads_the_page_rule_within_five_percent_of_the_centralized_span(tmp_path):
    """`--reach` (`reach_table`): centralized SGD goes 0.5 → 0.9 in accuracy and 1.0 → 0.2 in
    training loss, so the targets are 0.9 − 0.05·0.4 = 0.88 and 0.2 + 0.05·0.8 = 0.24. FedVeca
    gets to both at round 2; FedAvg's accuracy at round 3 (seed 0) and never (seed 1: K + 1 = 5
    in the Δ), its loss at round 4 in both seeds: Δ (1, 3) and (2, 2)."""
    from fedhet.papers.fedveca.claims import reach_table

    central = ([0.5, 0.9, 0.9, 0.9, 0.9], [1.0, 0.2, 0.2, 0.2, 0.2])
    fedveca = ([0.5, 0.8, 0.89, 0.9, 0.9], [1.0, 0.5, 0.21, 0.2, 0.2])
    fedavg = {0: ([0.5, 0.7, 0.8, 0.89, 0.89], [1.0, 0.5, 0.3, 0.25, 0.22]),
              1: ([0.5, 0.7, 0.8, 0.85, 0.86], [1.0, 0.5, 0.3, 0.25, 0.23])}
    rows = []
    for seed in (0, 1):
        for algo, (acc, loss) in (("central", central), ("fedveca", fedveca), ("fedavg", fedavg[seed])):
            rows += [{"setting": "case3", "algorithm": algo, "seed": seed, "round": k,
                      "test_accuracy": a, "test_loss": "", "train_loss": lo}
                     for k, (a, lo) in enumerate(zip(acc, loss, strict=True))]
    path = tmp_path / "svm-cases.csv"
    write_rows(path, rows)
    table = reach_table(read_results(path))
    cells = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in table.splitlines()[2:]}
    assert cells["fedveca"][4] == "0.8800 ± 0.0000" and cells["fedveca"][7] == "0.2400 ± 0.0000"
    assert cells["fedveca"][5] == "2.0 ± 0.0" and cells["fedveca"][8] == "2.0 ± 0.0"
    assert cells["fedavg"][5] == "3.0 (1 never)" and cells["fedavg"][8] == "4.0 ± 0.0"
    assert cells["fedavg"][9] == "+2.0 ± 1.4" and cells["fedavg"][10] == "+2.0 ± 0.0 *"
