"""Report pages a reviewer can trust: figures whose text all lies on the canvas at any
grid size, per-client panels that never mix different clients, one FedVeca figure per cell, a
16-run page under about 4 screens, settings that say what decided a value, no empty columns, a
provenance block, and a note where the paper has no numbers.

Text is checked with matplotlib's own renderer as each figure is saved: every axes' tight box
(tick labels, titles, axis labels and legends as drawn) and every figure-level text (suptitle,
figure legend) must lie inside the canvas. A page's height is measured by
`report_screenshot.visible_height`: the figures outside folded `<details>` at their drawn size,
and a line per table row and text block, so no browser is needed.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text

from fedhet.reports import diagnostics, discovery, report
from fedhet.reports import page as report_page
from fedhet.reports.plots import RunData
from fedhet.reports.screenshot import SCREEN, page_height, visible_height
from fedhet.runs.comparison import compare
from fedhet.runs.single import execute

GRID = """\
title = "{title}"
target_accuracy = 0.5
columns = ["partition"]
[base]
dataset = "digits"
clients = 3
rounds = 2
lr = 0.1
batch_size = 16
[axes]
algorithm = ["fedavg", "fedveca"]
partition = {partitions}
seed = {seeds}
"""
LONG = ('{ partition = "dirichlet", "partition.alpha" = 0.123456789, "partition.min_size" = 2, '
        '"partition.max_tries" = 5000 }')
"""A partition whose name is long: its heatmap's title must be wrapped to stay on the canvas."""


def text_outside(fig: Figure) -> list[str]:
    """What the renderer draws outside the figure's canvas: axes (with their tick labels,
    titles, labels, legends) and figure-level texts and legends."""
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height

    def out(box) -> bool:
        return box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1

    found = []
    for ax in fig.axes:
        box = ax.get_tightbbox(renderer) if ax.get_visible() else None
        if box is not None and out(box):
            found.append(f"axes {ax.get_title() or ax.get_ylabel()!r}: {box.extents.round()}")
    for artist in fig.get_children():
        drawn = isinstance(artist, Legend) or (
            isinstance(artist, Text) and artist.get_visible() and artist.get_text().strip())
        if drawn and out(artist.get_window_extent(renderer)):
            found.append(f"{type(artist).__name__} {getattr(artist, 'get_text', str)()!r}")
    return found


@pytest.fixture
def clipped(monkeypatch) -> list[str]:
    """Every figure saved while the fixture is active is checked; problems collect here."""
    problems: list[str] = []
    save = Figure.savefig

    def checked(fig, fname, *args, **kwargs):
        problems.extend(f"{Path(str(fname)).name}: {p}" for p in text_outside(fig))
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked)
    return problems


def _grid(root: Path, name: str, partitions: str, seeds: list[int]) -> Path:
    (root / f"{name}.toml").write_text(GRID.format(title=name, partitions=partitions, seeds=seeds))
    compare(root / f"{name}.toml", root / name, jobs=1, stream=io.StringIO())
    return root / name


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[int, Path]:
    """Run directories of 1, 4 and 16 runs (2 methods × settings × seeds)."""
    root = tmp_path_factory.mktemp("figures")
    one = root / "one"
    execute({"dataset": "digits", "clients": 3, "rounds": 2, "lr": 0.1, "algorithm": "fedveca",
             "partition": "dirichlet", "partition.alpha": 0.123456789, "partition.min_size": 2,
             "partition.max_tries": 5000},
            one, log=lambda _: None)
    four = _grid(root, "four", f"[{LONG}]", [0, 1])
    sixteen = _grid(root, "sixteen", f'["iid", {LONG}]', [0, 1, 2, 3])
    return {1: one, 4: four, 16: sixteen}


@pytest.mark.parametrize("n", [1, 4, 16])
def test_no_text_runs_past_a_figures_edge(pages, n, tmp_path, clipped):
    page = report.write_report(pages[n], tmp_path / "page", warn=lambda m: None)
    assert len(list((tmp_path / "page").glob("fig_*.png"))) >= 4  # curves, diagnostics, partition, paper
    assert not clipped, clipped
    if n == 16:
        # the grid page opens on its tables and one overview figure: under 4 screens, though
        # everything folded away would be far more
        assert visible_height(page) <= 4 * SCREEN < page_height(page)
        text = page.read_text()
        assert "<details>" in text
        # FedVeca's Fig. 6 once per cell (two settings of 4 seeds each), not once per run
        assert len(list((tmp_path / "page").glob("fig_fedveca_traces_*.png"))) == 2
        assert text.count("<figcaption>per-client τ, β, δ, A") == 2 and "(4 seeds)</figcaption>" in text
        assert len(list((tmp_path / "page").glob("fig_fedveca_eta_tau_L.png"))) == 1


def test_a_long_partition_title_is_wrapped_not_cut(tmp_path, clipped):
    title = ("digits / dirichlet (alpha=0.5, balance=none, max_tries=1000, min_size=10, "
             "something=a-long-value), seed 0")
    report_page.plot_partition(np.arange(30).reshape(3, 10), title, tmp_path / "p.png")
    assert not clipped, clipped


def _client_run(seed: int, split_seed: int, tmp_path: Path) -> RunData:
    rounds = [0.0, 1.0, 2.0]
    metrics = {"round": rounds, "test_accuracy": [0.1, 0.2, 0.3],
               "tau_0": [math.nan, 3.0 + seed, 4.0], "tau_1": [math.nan, 5.0, 6.0 + seed]}
    config = {"algorithm": "fedveca", "dataset": "digits", "partition": "dirichlet",
              "clients": 2, "seed": split_seed}
    return RunData(f"r{seed}", "g", "FedVeca", tmp_path, config, {}, metrics)


def test_per_client_panels_are_per_seed_unless_the_split_is_the_same(tmp_path):
    different = [_client_run(s, s, tmp_path) for s in (0, 1)]
    panels, _ = diagnostics.diagnostic_panels(different)
    assert [(p.family, p.seed) for p in panels] == [("tau_*", 0), ("tau_*", 1)]
    assert all(len(line[2]) == 1 for p in panels for line in p.lines)  # one seed each
    section = report_page._diagnostics_section(different, tmp_path)
    assert "per-client panels are drawn per seed" in section
    same = [_client_run(s, 7, tmp_path) for s in (0, 1)]  # one split (e.g. a fixed partition)
    panels, _ = diagnostics.diagnostic_panels(same)
    assert [(p.family, p.seed, len(p.lines[0][2])) for p in panels] == [("tau_*", None, 2)]


def test_settings_say_what_decided_a_value_and_empty_columns_go(tmp_path):
    config = {"dataset": "digits", "clients": 3, "rounds": 2, "lr": 0.1, "algorithm": "fednova",
              "epochs_min": 1, "epochs_max": 4}
    execute(config, tmp_path / "run", log=lambda _: None)
    text = report.write_report(tmp_path / "run", tmp_path / "page").read_text()
    from test_report_pages import table_after

    settings = {row[0]: row[1:] for row in table_after(text, "<h2>Settings</h2>")}
    assert settings["local_epochs"][0] == "1–4" and "epochs_min–epochs_max" in settings["local_epochs"][1]
    assert "epochs_min" not in settings and "epochs_max" not in settings
    runs = table_after(text, "<h3>Runs</h3>")
    assert "rounds to target" not in runs[0] and "transfers to target" not in runs[0]  # no target
    assert "final accuracy (%)" in runs[0]
    steps = {**config, "local_steps": 5}
    execute(steps, tmp_path / "steps", log=lambda _: None)
    text = report.write_report(tmp_path / "steps", tmp_path / "page2").read_text()
    settings = {row[0]: row[1:] for row in table_after(text, "<h2>Settings</h2>")}
    assert "local_epochs" not in settings and settings["local_steps"][0] == "5"
    assert "overrides local_epochs" in settings["local_steps"][1]


PROVENANCE = {"fedhet": "0.1.0", "commit": "abc1234", "dirty": True, "torch": "2.11.0",
              "numpy": "2.3.1", "python": "3.11.9", "device": "cpu", "plugins": ["my_algos.py"]}


def test_provenance_is_shown_when_recorded(tmp_path):
    execute({"dataset": "digits", "clients": 3, "rounds": 1, "lr": 0.1}, tmp_path / "runs" / "a",
            log=lambda _: None)
    execute({"dataset": "digits", "clients": 3, "rounds": 1, "lr": 0.1, "seed": 1},
            tmp_path / "runs" / "b", log=lambda _: None)
    for name in ("a", "b"):  # as runs made before the record existed
        path = tmp_path / "runs" / name / "config.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                    if k != "provenance"}))
    old = report.write_report(tmp_path / "runs", tmp_path / "old").read_text()
    assert "Made with" not in old  # runs from before the record: no block
    for name, commit in (("a", "abc1234"), ("b", "def5678")):
        path = tmp_path / "runs" / name / "config.json"
        config = json.loads(path.read_text())
        config["provenance"] = {**PROVENANCE, "commit": commit}
        path.write_text(json.dumps(config))
    from test_report_pages import table_after

    text = report.write_report(tmp_path / "runs", tmp_path / "new").read_text()
    block = dict(row for row in table_after(text, "<h2>Made with</h2>") if len(row) == 2)
    assert block["fedhet"] == "0.1.0" and block["torch"] == "2.11.0" and block["device"] == "cpu"
    assert block["commit"] == "abc1234 (1 run); def5678 (1 run)"
    assert block["uncommitted changes"] == "yes" and block["plugins"] == "my_algos.py"
    assert "provenance" not in text.split("<h2>Settings</h2>")[1].split("<h2>Summary")[0]
    one = report.write_report(tmp_path / "runs" / "a", tmp_path / "one").read_text()
    assert "<h2>Made with</h2>" in one


def test_a_paper_without_numbers_says_so(tmp_path):
    from fedhet.runs.grid_manifest import write_manifest
    from fedhet.runs.presets import RunSpec

    execute({"dataset": "digits", "clients": 3, "rounds": 1, "lr": 0.1}, tmp_path / "runs" / "a",
            log=lambda _: None)
    for paper, doc in (("fedveca", "fedveca"), ("bherd", "bherd"), ("fednova", "paper-scale")):
        write_manifest(tmp_path, paper, [RunSpec("a", "g", "FedAvg", {})], None, paper=paper,
                       scale="smoke", published=[], notes="")
        text = report.write_report(tmp_path, tmp_path / paper).read_text()
        assert "The paper gives no numbers to compare with" in text
        assert f"fedhet docs {doc}</code>" in text


def test_paper_figures_keep_long_names_on_the_canvas(tmp_path, clipped):
    """BHerd's kept-step maps and herding distances are titled by run names; FedNNNN's norms
    get a figure per setting. Long names are wrapped, never cut."""
    name = "bherd__partition=dirichlet__partition.alpha=0.123456789__partition.min_size=2__seed0"
    for algorithm, run in (("bherd", name), ("fednnnn", name.replace("bherd", "fednnnn"))):
        execute({"dataset": "digits", "clients": 3, "rounds": 2, "lr": 0.1, "algorithm": algorithm},
                tmp_path / "runs" / run, log=lambda _: None)
    _, runs = discovery.discover(tmp_path / "runs")
    section = report_page._extra_section(runs, tmp_path, warn=lambda m: pytest.fail(m))
    assert section.count("<img") >= 3  # kept map, herding distance, N and E
    assert not clipped, clipped


def test_the_partition_commands_heatmap_keeps_its_title_on_the_canvas(tmp_path, clipped):
    from fedhet.reports.partition import save_heatmap

    title = "digits · dirichlet(alpha=0.123456789, balance=none, max_tries=5000, min_size=2)"
    save_heatmap(np.arange(30).reshape(3, 10), tmp_path / "h.png", title)
    assert not clipped, clipped
