"""A grid (or preset) in which two runs are the same cell is refused before anything runs, with
one line naming the cells and, where it can, the line that repeats them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.errors import FedhetError
from fedhet.runs.grid import load_grid
from fedhet.runs.presets import RunSpec

BASE = '[base]\ndataset = "digits"\nrounds = 2\nclients = 3\n'

# (case, grid body after [base], line of the culprit or None, words the message must hold)
DUPLICATES = [
    ("repeated seed", '[axes]\nseed = [0, 0]\n', 6, ["fedavg__seed0 = fedavg__seed0-2", "seed lists"]),
    ("algorithm twice", '[axes]\nalgorithm = ["fedavg", "fedavgm", "fedavg"]\nseed = [0, 1]\n', 6,
     ["fedavg__seed0 = fedavg__seed0-2", "fedavg__seed1 = fedavg__seed1-2", "method is listed twice"]),
    ("1 and 1.0", '[axes]\nlr = [1, 1.0]\n', 6, ["lr: 1 vs 1.0"]),
    ("0.1 and 1e-1", '[axes]\nlr = [0.1, 1e-1]\n', 6, ["lr lists one value twice"]),
    ("bundle repeats a value", '[axes]\npartition = ["iid", { partition = "iid" }]\n', 6,
     ["partition lists one value twice"]),
    ("variant restates a default",
     '[[variant]]\nalgorithm = "fedavgm"\nlabel = "A"\n[[variant]]\nalgorithm = "fedavgm"\n'
     'label = "B"\n"algorithm.gamma" = 0.9\n', 11,
     ["A__seed0 = B__seed0", "algorithm.gamma: (default) vs 0.9"]),
    ("identical variants", '[[variant]]\nalgorithm = "fedprox"\n[[variant]]\nalgorithm = "fedprox"\n',
     6, ["fedprox__seed0 = fedprox__seed0-2"]),
    ("bundle hides an axis", '[axes]\nlr = [0.1, 0.2]\nopt = [{ lr = 0.3 }]\n', 7,
     ["lr and opt both set lr"]),
    ("base value repeated in a variant list",
     '[[variant]]\nalgorithm = "fedavgm"\n"algorithm.gamma" = [0.5, 0.5]\n', 7,
     ["algorithm.gamma lists one value twice"]),
]


@pytest.mark.parametrize(("case", "body", "line", "words"), DUPLICATES, ids=[d[0] for d in DUPLICATES])
def test_duplicate_cells_are_refused_naming_them(tmp_path, case, body, line, words):
    path = tmp_path / "grid.toml"
    path.write_text(BASE + body)
    with pytest.raises(FedhetError) as err:
        load_grid(path)
    message = str(err.value)
    assert "\n" not in message and "duplicate runs" in message
    assert message.startswith(f"{path}:{line}: "), message
    for w in words:
        assert w in message, message


DISTINCT = [
    ("two seeds", '[axes]\nseed = [0, 1]\n', 2),
    ("two lrs", '[axes]\nlr = [0.1, 0.01]\n', 2),
    ("variant beside a plain method of the same algorithm",  # the variant replaces it
     '[axes]\nalgorithm = ["fedavgm"]\n[[variant]]\nalgorithm = "fedavgm"\n"algorithm.gamma" = 0.5\n', 1),
    ("bundles that differ",
     '[axes]\npartition = ["iid", { partition = "dirichlet", "partition.alpha" = 0.3 }]\n', 2),
]


@pytest.mark.parametrize(("case", "body", "n"), DISTINCT, ids=[d[0] for d in DISTINCT])
def test_distinct_cells_are_accepted(tmp_path, case, body, n):
    path = tmp_path / "grid.toml"
    path.write_text(BASE + body)
    assert len(load_grid(path).specs) == n


def test_cli_prints_one_error_line_and_makes_no_directory(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text(BASE + "[axes]\nseed = [0, 0]\n")
    out = tmp_path / "out"
    assert main(["compare", "--config", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert not out.exists()


def test_a_preset_with_two_identical_runs_is_refused():
    from fedhet.papers.reproduce import _check_specs

    base = {"dataset": "digits", "rounds": 2, "lr": 0.1}
    specs = [RunSpec("a", "g", "A", {**base, "seed": 0}), RunSpec("b", "g", "B", {**base, "lr": 1e-1})]
    with pytest.raises(FedhetError, match=r"preset p: duplicate runs, the same settings twice in "
                       r"one table cell: a = b"):
        _check_specs("p", [*specs[:1], RunSpec("b", "g", "A", specs[1].settings)])
    _check_specs("p", specs)  # one run serving two labels (two tables) is the preset's choice


def test_shipped_presets_have_no_duplicate_runs():
    from fedhet.papers.base import PRESETS
    from fedhet.papers.reproduce import _check_specs, load_preset

    for paper in PRESETS.names():
        for scale in ("smoke", "small", "paper"):
            preset = load_preset(paper, scale)
            _check_specs(paper, preset.stages[0](Path("unused")))  # later stages read results
