"""Mean ± std over seeds (reports/seeds.py) on fabricated run directories, checked by hand."""

from __future__ import annotations

import json
import math

import pytest

from fedhet.papers.fedveca import seeds as fedveca_seeds
from fedhet.reports import seeds
from fedhet.reports.seeds import Stat, inside_noise, mean_std, outside_noise, paired, paired_seeds

# per seed: FedVeca's and FedAvg's test accuracy/loss in rounds 0..3
RUNS = {
    "fedveca": [([0.5, 0.84, 0.86, 0.87], [0.6, 0.30, 0.24, 0.22]),
                ([0.5, 0.86, 0.86, 0.89], [0.6, 0.26, 0.25, 0.21]),
                ([0.5, 0.80, 0.86, 0.88], [0.6, 0.40, 0.30, 0.20])],
    "fedavg": [([0.5, 0.70, 0.80, 0.84], [0.6, 0.50, 0.40, 0.30]),
               ([0.5, 0.70, 0.80, 0.85], [0.6, 0.50, 0.40, 0.30]),
               ([0.5, 0.70, 0.80, 0.83], [0.6, 0.50, 0.40, 0.30])],
}


def _groups(tmp_path):
    groups = []
    for s in range(3):
        g = tmp_path / f"g-s{s}"
        for method, per_seed in RUNS.items():
            acc, loss = per_seed[s]
            (g / method).mkdir(parents=True)
            pairs = enumerate(zip(acc, loss, strict=True))
            lines = ["round,test_loss,test_accuracy"] + [f"{k},{lo},{a}" for k, (a, lo) in pairs]
            (g / method / "metrics.csv").write_text("\n".join(lines) + "\n")
        (g / "protocol.json").write_text(json.dumps({"tau_all": [100, 110, 120][s]}))
        groups.append(g)
    return groups


def test_stat_text_by_hand():
    s = Stat((0.87, 0.89, 0.88))  # mean 0.88; deviations ±0.01, 0 → var 0.0002/2 → std 0.01
    assert s.mean == pytest.approx(0.88) and s.std == pytest.approx(0.01)
    assert s.text() == "0.8800 ± 0.0100"
    assert Stat((2.0, None, 4.0)).text("{:.1f}") == "3.0 ± 1.4 (2/3 reach)"
    assert Stat((None, math.nan, None)).text() == "— (0/3 reach)"
    assert Stat((5.0,)).text("{:.1f}") == "5.0"


def test_inside_noise_is_range_overlap():
    a, b = Stat((1.0, 2.0, 3.0)), Stat((3.5, 4.5, 5.5))  # 2 ± 1 vs 4.5 ± 1: gap 2.5 > 2
    assert not inside_noise(a, b)
    assert inside_noise(a, Stat((3.0, 4.0, 5.0)))  # 2 ± 1 vs 4 ± 1 touch: inside
    assert inside_noise(a, Stat((3.0, None, 9.0)))  # a seed that never reached: no claim


def test_paired_noise_rule_by_hand():
    """Δ = (1.0, 0.9, 1.1): mean 1.0, std 0.1, 2·std/√3 ≈ 0.115 < 1.0: outside the noise;
    Δ = (1, −1, 0.5): mean 1/6, std ≈ 1.04, 2·std/√3 ≈ 1.2: inside. Seeds pair by key; a seed
    where either value is not finite is left out."""
    mean, sd, n, outside = paired_seeds({0: 2.0, 1: 1.9, 2: 2.1, 3: 5.0}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert (n, outside) == (3, True) and mean == pytest.approx(1.0) and sd == pytest.approx(0.1)
    assert outside_noise([1.0, 0.9, 1.1]) and not outside_noise([1.0, -1.0, 0.5])
    assert not outside_noise([5.0])  # one seed: never outside
    assert paired_seeds({0: 1.0, 1: math.nan}, {0: 0.5, 1: 0.0})[2:] == (1, False)
    assert paired_seeds({0: 1.0}, {1: 1.0})[2:] == (0, False)
    assert paired([1.0, 0.9, 1.1], 2) == "+1.00 ± 0.10 *" and paired([1.0, -1.0, 0.5], 1).endswith("1.0")


def test_mean_std_over_the_finite_values_with_their_count():
    assert mean_std([0.87, 0.89, 0.88, math.nan], 3) == "0.880 ± 0.010"
    assert mean_std([0.87, 0.89, 0.88, math.inf], 2, count=True) == "0.88 ± 0.01 (n=3)"
    assert mean_std([7.0], 0, count=True) == "7 (n=1)" and mean_std([math.nan]) == "—"


def test_fedveca_table(tmp_path):
    groups = _groups(tmp_path)
    columns, stats = fedveca_seeds.fedveca_stats(groups, methods=("fedveca", "fedavg"), acc=(0.85,),
                                                 loss=(0.25,))
    assert columns == ["final accuracy", "final loss", "acc ≥ 0.85", "loss ≤ 0.25"]
    fv, fa = stats["FedVeca"], stats["FedAvg"]
    assert fv["final accuracy"].text() == "0.8800 ± 0.0100"
    assert fv["final loss"].text() == "0.2100 ± 0.0100"
    assert fv["acc ≥ 0.85"].values == (2.0, 1.0, 2.0)  # mean 5/3, std sqrt(1/3)
    assert fv["acc ≥ 0.85"].text("{:.2f}") == "1.67 ± 0.58"
    assert fv["loss ≤ 0.25"].values == (2.0, 2.0, 3.0)
    assert fa["acc ≥ 0.85"].text("{:.1f}") == "3.0 (1/3 reach)"
    assert fa["loss ≤ 0.25"].text() == "— (0/3 reach)"
    assert fedveca_seeds.tau_all(groups).text("{:.0f}") == "110 ± 10"
    md = seeds.stats_markdown(columns, stats)
    assert "| FedVeca | 0.8800 ± 0.0100 | 0.2100 ± 0.0100 | 1.7 ± 0.6 | 2.3 ± 0.6 |" in md
    pairs = seeds.noise_pairs(columns, stats)
    # 0.88 ± 0.01 vs 0.84 ± 0.01, loss 0.21 ± 0.01 vs 0.30 ± 0: outside; FedAvg's rounds: incomplete
    assert pairs == ["final accuracy: FedVeca better than FedAvg", "final loss: FedVeca better than FedAvg"]


def test_grid_noise_from_results_csv(tmp_path):
    rows = ["name,group,label,seed,status,final_accuracy,rounds_to_target"]
    for s, (a, b, c) in enumerate([(0.80, 0.90, 0.81), (0.82, 0.92, 0.80), (0.84, 0.91, 0.83)]):
        rows += [f"A__seed{s},all,A,{s},finished,{a},", f"B__seed{s},all,B,{s},finished,{b},{5 + s}",
                 f"C__seed{s},all,C,{s},finished,{c},"]
    (tmp_path / "results.csv").write_text("\n".join(rows) + "\n")
    stats = seeds.grid_stats(tmp_path / "results.csv")["all"]
    assert stats["A"].text() == "0.8200 ± 0.0200" and stats["B"].text() == "0.9100 ± 0.0100"
    # A 0.82 ± 0.02 and C 0.813 ± 0.015 overlap; B is outside both
    assert seeds.grid_noise(tmp_path / "results.csv") == [
        "all: final_accuracy: B better than A", "all: final_accuracy: B better than C"]
    rounds = seeds.grid_stats(tmp_path / "results.csv", "rounds_to_target")["all"]
    assert rounds["A"].text() == "— (0/3 reach)" and rounds["B"].text("{:.1f}") == "6.0 ± 1.0"
