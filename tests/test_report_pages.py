"""Report pages say what was compared: a settings block with the runs' shared settings,
column headers that name a varying setting in full, published numbers only beside runs of their
setting, diagnostics without flat series and aggregated over seeds, captions that match the
plots, accuracies in percent, wide tables that scroll, bold only where it means something."""

from __future__ import annotations

import io
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fedhet.papers.base import PRESETS
from fedhet.papers.reproduce import reproduce
from fedhet.reports import diagnostics, plots, report
from fedhet.reports import page as report_page
from fedhet.reports.plots import RunData
from fedhet.reports.settings import component, group_header, summarize
from fedhet.runs.comparison import compare
from fedhet.runs.presets import Preset, RunSpec
from fedhet.runs.results import compare_published, summary_tables, uncovered_published

GRID = """\
title = "alpha grid"
target_accuracy = 0.3
columns = ["partition"]
[base]
dataset = "digits"
clients = 3
rounds = 2
lr = 0.1
batch_size = 16
local_epochs = 1
[axes]
algorithm = ["fedavg", "fedprox"]
partition = [{ partition = "dirichlet", "partition.alpha" = 0.1 },
             { partition = "dirichlet", "partition.alpha" = 0.3 }]
seed = [0, 1]
"""


class Tables(HTMLParser):
    """Each table of a page as rows of cell texts, with whether it sits in a scrolling box."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.scrolls: list[bool] = []
        self._div: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "div":
            self._div.append(dict(attrs).get("class") or "")
        elif tag == "table":
            self.tables.append([])
            self.scrolls.append(bool(self._div) and self._div[-1] == "scroll")
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "div":
            self._div.pop()
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables_of(text: str) -> Tables:
    parser = Tables()
    parser.feed(text)
    return parser


def table_after(text: str, heading: str) -> list[list[str]]:
    """The first table after `heading` on the page."""
    return tables_of(text[text.index(heading):]).tables[0]


@pytest.fixture(scope="module")
def grid_page(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("pages")
    (root / "grid.toml").write_text(GRID)
    compare(root / "grid.toml", root / "g", jobs=1, stream=io.StringIO())
    page = report.write_report(root / "g", warn=lambda m: None)
    return root / "g", page.read_text()


# -- settings block ------------------------------------------------------------------------------
def test_settings_block_states_what_every_run_shares(grid_page):
    _, text = grid_page
    shared = dict(row for row in table_after(text, "Shared by all 8 runs") if len(row) == 2)
    assert shared["model"] == "mlp(hidden=200)"
    assert shared["dataset"].startswith("digits(")
    assert (shared["clients"], shared["rounds"], shared["lr"]) == ("3", "2", "0.1")
    assert (shared["batch_size"], shared["local_epochs"]) == ("16", "1")
    assert "partition" not in shared and "algorithm" not in shared and "seed" not in shared
    varying = dict(row for row in table_after(text, "Varying between runs") if len(row) == 2)
    assert varying["algorithm"] == "fedavg, fedprox" and varying["seed"] == "0, 1"
    assert "alpha=0.1" in varying["partition"] and "alpha=0.3" in varying["partition"]
    params = dict(row for row in table_after(text, "Algorithm parameters") if len(row) == 2)
    assert params["fedprox"].startswith("fedprox(mu=0.01")
    # how it ran is not what was compared: no setting of the block; the device is provenance
    assert "device" not in shared and "device" not in varying and "device" not in params
    made_with = dict(row for row in table_after(text, "Made with") if len(row) == 2)
    assert made_with["device"] == "cpu"


def test_column_headers_name_the_partition_with_its_parameter(grid_page):
    root, text = grid_page
    final = table_after(text, "Final test accuracy (%)")
    assert final[0] == ["method", "partition=dirichlet, partition.alpha=0.1",
                        "partition=dirichlet, partition.alpha=0.3"]
    assert [row[0] for row in final[1:]] == ["fedavg", "fedprox"]  # α left the labels
    apart = table_after(text, "Table columns:")
    assert [r[1].split(", balance")[0] for r in apart[1:]] == [
        "partition=dirichlet(alpha=0.1", "partition=dirichlet(alpha=0.3"]
    assert "partition.alpha=0.3" in (root / "summary.md").read_text()


def test_summarize_splits_shared_from_varying_and_lists_unset_keys():
    a = {"algorithm": "fedavg", "clients": 4, "lr": 0.1, "partition": "shards",
         "partition_params": {"xi": 2}, "algorithm_params": {}, "device": "cpu", "local_steps": 0}
    b = {**a, "algorithm": "fedprox", "algorithm_params": {"mu": 0.01}, "partition_params": {"xi": 4},
         "device": "cuda", "momentum": 0.9}
    s = summarize([a, b, a])
    assert s.shared == {"clients": "4", "lr": "0.1"}  # device: how it ran; local_steps = 0: off
    assert s.varying == {"algorithm": ["fedavg", "fedprox"],
                         "partition": ["shards(xi=2)", "shards(xi=4)"],
                         "momentum": ["(unset)", "0.9"]}
    assert s.algorithms == {"fedavg": "fedavg", "fedprox": "fedprox(mu=0.01)"}
    assert group_header([b], [a, b]) == "partition=shards(xi=4), momentum=0.9"
    assert component("dirichlet", {"alpha": 0.1, "min_size": 10}) == "dirichlet(alpha=0.1, min_size=10)"
    on = {**a, "local_steps": 5}
    assert summarize([a, on]).varying["local_steps"] == ["0", "5"]  # off in one run: both shown


# -- tables -------------------------------------------------------------------------------------
def test_bold_marks_quality_only_ties_all_and_never_an_all_tie():
    rows = [
        {"label": "A", "group": "g", "final_accuracy": 0.9, "best_accuracy": 0.9, "wall_time_s": 1.0},
        {"label": "B", "group": "g", "final_accuracy": 0.9, "best_accuracy": 0.95, "wall_time_s": 1.0},
        {"label": "C", "group": "g", "final_accuracy": 0.8, "best_accuracy": 0.95, "wall_time_s": 5.0},
        {"label": "A", "group": "h", "final_accuracy": 0.7, "best_accuracy": 0.7, "wall_time_s": 2.0},
        {"label": "B", "group": "h", "final_accuracy": 0.7, "best_accuracy": 0.7, "wall_time_s": 3.0},
        {"label": "C", "group": "h", "final_accuracy": 0.7, "best_accuracy": 0.7, "wall_time_s": 4.0},
    ]
    final, best, wall = summary_tables(rows, None)
    assert final.best == {(0, 0), (1, 0)}  # A and B tie for the best: both bold; h: all tie, none
    assert best.best == {(1, 0), (2, 0)}
    assert wall.title == "Wall time (s)" and wall.best == set()  # machine load, not quality
    # compared as printed: 90.001 and 90.004 print alike, so they tie
    rows[0]["final_accuracy"], rows[1]["final_accuracy"] = 0.90001, 0.90004
    assert summary_tables(rows, None)[0].best == {(0, 0), (1, 0)}


def test_accuracy_is_in_percent_and_every_table_scrolls(grid_page):
    root, text = grid_page
    parsed = tables_of(text)
    assert parsed.tables and all(parsed.scrolls)
    runs = table_after(text, "<h3>Runs</h3>")
    head = runs[0]
    assert "final accuracy (%)" in head and "communication (MB)" in head
    import csv

    results = {r["name"]: r for r in csv.DictReader((root / "results.csv").open())}
    for row in runs[1:]:
        cell = dict(zip(head, row, strict=True))
        want = 100 * float(results[cell["name"]]["final_accuracy"])
        assert cell["final accuracy (%)"] == f"{want:.2f}"


# -- published numbers --------------------------------------------------------------------------
def test_published_numbers_appear_only_beside_runs_of_their_setting():
    rows = [{"group": "digits IID", "label": "FedAvg", "final_accuracy": 0.5}]
    published = [
        {"group": "digits IID", "label": "FedAvg", "metric": "accuracy", "value": 97.0, "source": "T"},
        {"group": "digits IID", "label": "MOON", "metric": "accuracy", "value": 96.0, "source": "T"},
        {"group": "MNIST IID", "label": "FedAvg", "metric": "accuracy", "value": 97.6, "source": "T"},
        {"group": "MNIST xi=2", "label": "FedAvg", "metric": "accuracy", "value": 93.5, "source": "T"},
    ]
    cmp = compare_published(rows, published)
    assert [(c["group"], c["label"], c["ours"]) for c in cmp] == [("digits IID", "FedAvg", "50.00")]
    line = uncovered_published(rows, published)
    assert line == ("Not compared: 3 published number(s); 2 of 3 published columns have no run at "
                    "this scale (MNIST IID; MNIST xi=2); no run of MOON in digits IID.")
    assert uncovered_published(rows, published[:1]) == ""


def test_fedsr_smoke_runs_are_named_by_their_data_and_compare_with_nothing():
    from fedhet.papers.fedsr.preset import fedsr_preset

    preset = fedsr_preset("smoke")
    specs = preset.stages[0](Path("unused"))
    assert all(s.settings["dataset"] == "digits" for s in specs)
    assert all("__digits__" in s.name and "mnist" not in s.name for s in specs)
    assert len({s.name for s in specs}) == len(specs)
    rows = [{"group": s.group, "label": s.label, "final_accuracy": 0.5} for s in specs]
    assert compare_published(rows, preset.published) == []
    line = uncovered_published(rows, preset.published)
    assert line.startswith(f"Not compared: {len(preset.published)} published number(s); 24 of 24")
    paper = fedsr_preset("paper").stages[0](Path("unused"))
    assert any(s.name == "t2__mnist__iid__fedavg" for s in paper)  # paper-scale names kept


def _tiny(scale: str) -> Preset:
    base = {"dataset": "digits", "partition": "iid", "clients": 3, "rounds": 2, "lr": 0.1}

    def stage(out: Path) -> list[RunSpec]:
        return [RunSpec("fedavg", "digits IID", "FedAvg", {**base, "algorithm": "fedavg"})]

    published = [
        {"group": "digits IID", "label": "FedAvg", "metric": "accuracy", "value": 97.5, "source": "T9"},
        {"group": "MNIST IID", "label": "FedAvg", "metric": "accuracy", "value": 98.1, "source": "T9"},
        {"group": "MNIST IID", "label": "MOON", "metric": "accuracy", "value": 98.3, "source": "T9"},
    ]
    return Preset("tiny-pages", scale, [stage], published, target_accuracy=0.2)


def test_reproduce_page_has_no_rows_without_a_run(tmp_path):
    out = tmp_path / "rep"
    with PRESETS.added("tiny-pages", _tiny):
        reproduce("tiny-pages", "smoke", out, jobs=1, stream=io.StringIO())
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert "no such run" not in text and "98.1" not in text
        assert "2 published number(s); 1 of 2 published columns have no run at this scale (MNIST IID)" in text
    published = table_after((out / "report.html").read_text(), "Published vs ours")
    assert [r[:4] for r in published[1:]] == [["digits IID", "FedAvg", "final_accuracy", "97.5"]]


# -- diagnostics --------------------------------------------------------------------------------
def _run(label: str, seed: int, steps: list[float], tmp_path: Path, group: str = "g") -> RunData:
    rounds = [0.0, 1.0, 2.0, 3.0]
    metrics = {"round": rounds, "test_accuracy": [0.1, 0.3, 0.5, 0.6], "test_loss": [2.0, 1.5, 1.0, 0.8],
               "clients_sampled": [math.nan, 6.0, 6.0, 6.0], "clients_dropped": [math.nan, 0.0, 0.0, 0.0],
               "local_steps_mean": [math.nan, *steps]}
    return RunData(f"{label}-{seed}", group, label, tmp_path, {"algorithm": label.lower()}, {}, metrics)


def test_diagnostics_drop_flat_series_and_average_over_seeds(tmp_path):
    runs = [_run("A", 0, [4.0, 6.0, 8.0], tmp_path), _run("A", 1, [2.0, 4.0, 6.0], tmp_path),
            _run("B", 0, [5.0, 5.0, 5.0], tmp_path)]
    panels, flat = diagnostics.diagnostic_panels(runs)
    assert [(p.family, [line[0] for line in p.lines]) for p in panels] == [("local_steps_mean", ["A"])]
    assert flat == {"clients_sampled": [6.0, 6.0], "clients_dropped": [0.0, 0.0], "local_steps_mean": [5.0]}
    x, mean, lo, hi = plots.seed_band(panels[0].lines[0][2], "round", "local_steps_mean")
    assert list(x) == [1.0, 2.0, 3.0] and list(mean) == [3.0, 5.0, 7.0]
    assert list(lo) == [2.0, 4.0, 6.0] and list(hi) == [4.0, 6.0, 8.0]
    section = report_page._diagnostics_section(runs, tmp_path)
    assert section.count("<img") == 1 and "mean over 2 seeds" in section
    assert "clients_sampled = 6; clients_dropped = 0; local_steps_mean = 5 (in 1 of the 2" in section
    assert diagnostics.diagnostic_axes("clients_dropped") == ("clients dropped", "clients")
    assert not diagnostics.plot_diagnostics([runs[2]], tmp_path / "none.png")  # nothing changes


# -- curves and captions ------------------------------------------------------------------------
def test_loss_caption_matches_what_is_drawn_and_coinciding_lines_are_named(tmp_path):
    a, b = _run("FedAvg", 0, [1.0, 2.0, 3.0], tmp_path), _run("FedProx", 0, [1.0, 2.0, 3.0], tmp_path)
    section = report_page._curves_section([a, b], tmp_path)
    assert "dashed" not in section and "train loss" not in section
    assert "Drawn over each other" in section and "FedAvg and FedProx" in section
    b.metrics["test_accuracy"] = [0.1, 0.2, 0.4, 0.6]
    a.metrics["train_loss"] = [2.1, 1.6, 1.1, 0.9]
    section = report_page._curves_section([a, b], tmp_path)
    assert "thin faded lines: train loss" in section and "Drawn over each other" not in section


def test_methods_get_distinct_dash_styles_and_markers():
    styles = plots.method_styles(["FedAvg", "FedProx", "MOON"])
    looks = {(s["linestyle"], s["marker"]) for s in styles.values()}
    assert len(looks) == 3
    assert styles["FedAvg"]["lw"] > styles["FedProx"]["lw"]  # the one drawn first shows around


def test_page_numbers_match_its_header_percent_statement(grid_page):
    _, text = grid_page
    assert "Accuracies are in percent throughout" in text
    figures = re.findall(r"<figcaption>([^<]*)</figcaption>", text)
    curves = [f for f in figures if "test accuracy" in f]
    assert curves and all("test accuracy (%)" in f for f in curves)
    assert "dashed" not in text


def test_report_of_a_single_run_still_lists_its_configuration(tmp_path):
    from fedhet.runs.single import execute

    execute({"dataset": "digits", "clients": 3, "rounds": 1, "lr": 0.1, "algorithm": "fedavg"},
            tmp_path / "one", log=lambda _: None)
    text = report.write_report(tmp_path / "one").read_text()
    shared = dict(row for row in table_after(text, "<h2>Settings</h2>") if len(row) == 2)
    assert shared["algorithm"] == "fedavg" and shared["clients"] == "3"
    assert "Configuration" in text and "Varying between runs" not in text
