"""Export of finished runs to the results contract of docs/paper-scale.md (paper_results)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedhet.errors import FedhetError
from fedhet.papers import paper_results as pr


def _fake_run(d: Path, seed: int, algorithm: str, losses: list[float], finished: bool = True,
              extra: str | None = None) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": algorithm, "seed": seed}))
    (d / "summary.json").write_text(json.dumps({"finished": finished}))
    head = "round,test_loss,test_accuracy,train_loss,lr" + (f",{extra}" if extra else "")
    lines = [head]
    for r, loss in enumerate(losses):
        acc = "" if r == 0 else f"{0.5 + 0.1 * r}"
        lines.append(f"{r},{loss},{acc},{loss + 1}," + "0.1" + (f",{r * 2}" if extra else ""))
    (d / "metrics.csv").write_text("\n".join(lines) + "\n")
    return d


def test_export_runs_writes_contract_rows_and_skips_unfinished(tmp_path: Path) -> None:
    a = _fake_run(tmp_path / "a", 1, "fedavg", [3.0, 2.0, 1.0], extra="alpha_k")
    b = _fake_run(tmp_path / "b", 0, "fedavg", [3.0, 2.5])
    c = _fake_run(tmp_path / "c", 2, "fedavg", [3.0], finished=False)
    out = tmp_path / "res" / "x.csv"
    skipped = pr.export_runs([a, b, c], out, setting_of=lambda r: "case1",
                             extra_columns=[("alpha", "alpha_k")])
    assert skipped == [c]
    with out.open() as f:
        rows = list(csv.DictReader(f))
        assert next(csv.reader(out.open())) == list(pr.BASE_COLUMNS) + ["alpha"]
    # sorted by seed then round; seed 0 first
    assert [(r["seed"], r["round"]) for r in rows] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"),
                                                      ("1", "2")]
    assert rows[0]["algorithm"] == "fedavg" and rows[0]["setting"] == "case1"
    assert rows[0]["test_accuracy"] == "" and float(rows[3]["test_accuracy"]) == pytest.approx(0.6)
    assert float(rows[4]["train_loss"]) == 2.0 and rows[4]["alpha"] == "4"
    curves = pr.read_results(out)
    assert curves[("case1", "fedavg")][1]["test_loss"] == [3.0, 2.0, 1.0]
    assert curves[("case1", "fedavg")][0]["round"] == [0.0, 1.0]


def test_export_merge_keeps_other_cells_and_duplicates_are_refused(tmp_path: Path) -> None:
    a = _fake_run(tmp_path / "a", 0, "fedavg", [3.0, 2.0])
    b = _fake_run(tmp_path / "b", 0, "fednova", [3.0, 1.0])
    out = tmp_path / "x.csv"
    pr.export_runs([a], out)
    pr.export_runs([b], out, merge=True)
    assert set(pr.read_results(out)) == {("a", "fedavg"), ("b", "fednova")}
    pr.export_runs([b], out)  # no merge: replaced
    assert set(pr.read_results(out)) == {("b", "fednova")}
    with pytest.raises(FedhetError, match="both"):
        pr.export_runs([a, b], out, setting_of=lambda r: "s", algorithm_of=lambda r: "m")


def test_export_grid_of_a_real_reproduce(tmp_path: Path) -> None:
    from fedhet.papers.reproduce import reproduce

    out = tmp_path / "g"
    reproduce("fednova", "smoke", out, jobs=1, stream=open("/dev/null", "w"))  # noqa: SIM115
    pr.export_grid(out, tmp_path / "fednova.csv")
    curves = pr.read_results(tmp_path / "fednova.csv")
    manifest = json.loads((out / "grid.json").read_text())
    assert set(curves) == {(r["group"], r["label"]) for r in manifest["runs"]}
    rounds = json.loads((out / "runs" / manifest["runs"][0]["name"] / "config.json").read_text())["rounds"]
    for by_seed in curves.values():
        for cols in by_seed.values():
            assert cols["round"] == [float(r) for r in range(rounds + 1)]
            assert all(0 <= a <= 1 for a in cols["test_accuracy"])
    meta = pr.write_meta(tmp_path / "fednova.json", "x", "fednova", "cmd", "cpu", 0.1, [0])
    assert pr.read_meta(tmp_path / "fednova.json") == meta and meta["scale"] == "paper"
    assert pr.grid_minutes(out) > 0
