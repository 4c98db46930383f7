"""The papers' partitions against their words (papers/partition_readings.py): what a drawing
says of a split, the page's section from committed drawings, and the readings' settings being
the campaign's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhet.papers import partition_readings as prd
from fedhet.papers.campaign.records import Store
from fedhet.papers.campaign.tables import plan_runs, table

ROOT = Path(__file__).resolve().parents[1]


def test_the_shape_of_a_split_by_hand() -> None:
    """Ten clients: nine of 10 samples of one label, one of 910 over three labels. Sizes
    10 / 10 / 910, the largest tenth (1 client) holds 910/1000; labels 1–3, mean 1.2."""
    counts = np.zeros((10, 10), dtype=np.int64)
    counts[:9, 0] = 10
    counts[9, [1, 2, 3]] = [900, 5, 5]
    s = prd.shape(counts)
    assert s.sizes == (10, 10, 910) and s.top_share == pytest.approx(0.91)
    assert s.labels == (1, pytest.approx(1.2), 3) and s.held == {1: 9, 3: 1}
    assert prd.describe(s) == ("10 clients; sizes 10 / 10 / 910 (min / median / max), the largest 1 "
                               "hold 91%; labels per client 1–3 (mean 1.20: 9 with 1, 1 with 3)")


def test_the_page_reads_the_committed_drawings_only(tmp_path: Path) -> None:
    """A partition with a committed record is described from its counts and linked to its
    drawing; one without says what command draws it (no dataset needed either way)."""
    first = prd.readings()[0]
    counts = np.full((4, 10), 3, dtype=np.int64)
    prd.record(first, counts, tmp_path / "partitions", "abc1234")
    lines = prd.page_lines(tmp_path)
    row = next(line for line in lines if line.startswith(f"| {first.title} |"))
    assert "4 clients; sizes 30 / 30 / 30" in row and f"(figures/partitions/{first.key}.png)" in row
    assert first.quote in row and all(c in row for c in first.choices)
    other = next(line for line in lines if line.startswith(f"| {prd.readings()[1].title} |"))
    assert f"not drawn yet: `{prd.COMMAND}`" in other
    assert any(line.startswith("Drawn at abc1234 on ") for line in lines)
    (tmp_path / "partitions" / f"{first.key}.json").write_text(json.dumps({"counts": "x"}))
    with pytest.raises(Exception, match="not a partition record"):
        prd.page_lines(tmp_path)


def test_the_committed_drawings_are_of_the_readings_settings() -> None:
    """Every reading has its committed record and drawing, made with the reading's settings."""
    for r in prd.readings():
        data = prd.read(ROOT / "results", r.key)
        assert data is not None and data["settings"] == r.settings, r.key
        assert (ROOT / prd.FIGURES / f"{r.key}.png").exists()
        counts = np.asarray(data["counts"])
        assert counts.shape == (r.settings["clients"], 10) and counts.sum() == 60_000


def test_the_readings_are_the_campaign_s_partitions(tmp_path: Path) -> None:
    """A reading's partition settings are those of the campaign's runs of its cell (the
    paper's table cell, or the alternative cell the campaign adds for it)."""
    plan = plan_runs("paper", (table("fednnnn-mnist"), table("fedsr-mnist")),
                     Store(tmp_path, tmp_path / "cache").records)
    for r in prd.readings():
        group = r.cell[1] or r.title.split(" ", 1)[1]  # "MNIST NonIID-UB"
        mine = {k: v for k, v in r.settings.items() if k.startswith("partition")}
        runs = [x for x in plan if x.spec.group == group and x.spec.settings.get("algorithm") != "central"]
        assert runs, group
        for x in runs:
            assert {k: v for k, v in x.spec.settings.items() if k.startswith("partition")} == mine
            assert x.spec.settings["clients"] == r.settings["clients"]
        if r.cell[0]:  # an alternative: seed 0 only, after every cell at the paper's seed count
            assert {x.seed for x in runs} == {0} and all(x.tier == 3 for x in runs)
            assert all(x.spec.settings["partition.cut"] == "label" for x in runs)


def test_a_split_is_counted_as_a_run_trains_on_it() -> None:
    """On the embedded digits: 4 clients of ξ = 2 shards hold every training sample once, each
    at most 4 labels."""
    counts = prd.counts_of({"dataset": "digits", "clients": 4, "partition": "shards",
                            "partition.xi": 2, "seed": 0})
    assert counts.shape == (4, 10) and counts.sum() == 1_347
    assert ((counts > 0).sum(axis=1) <= 4).all()


@pytest.mark.skipif(not (ROOT / "data" / "mnist" / "mnist.pkl.gz").exists(), reason="needs MNIST")
def test_the_dirichlet_readings_need_no_minimum_at_seed_0() -> None:
    """FedSR's α partitions (seed 0): the split with fedhet's minimum of 10 samples a device is
    the split with none (`min_size=0`), the text's own words, as their choices say."""
    alphas = [r for r in prd.readings() if r.settings.get("partition") == "dirichlet"]
    assert sorted(r.settings["partition.alpha"] for r in alphas) == [0.1, 0.3]
    for r in alphas:
        ours = prd.counts_of(r.settings, str(ROOT / "data"))
        bare = prd.counts_of({**r.settings, "partition.min_size": 0}, str(ROOT / "data"))
        assert np.array_equal(ours, bare) and ours.sum(axis=1).min() >= 10
