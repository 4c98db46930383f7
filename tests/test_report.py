"""`fedhet report`: renders on each algorithm's outputs; the page is well formed and every image
it shows exists; diagnostics are grouped generically; partitions and extra plotters."""

from __future__ import annotations

import math
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from registered import example

from fedhet.cli import main
from fedhet.errors import FedhetError
from fedhet.reports import discovery, figures, report
from fedhet.reports import page as report_page
from fedhet.reports.diagnostics import diagnostic_families, plot_diagnostics
from fedhet.reports.page import partition_counts
from fedhet.reports.plots import RunData
from fedhet.runs.single import execute

BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 4, "rounds": 2, "lr": 0.1}
VOID = {"img", "meta", "br", "hr", "link", "input"}


class PageCheck(HTMLParser):
    """Collects image sources and checks that every non-void tag is closed in order."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.images: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"unbalanced </{tag}>")


def check_page(page: Path) -> PageCheck:
    parser = PageCheck()
    parser.feed(page.read_text())
    parser.close()
    assert not parser.errors and not parser.stack, (parser.errors, parser.stack)
    for src in parser.images:
        png = page.parent / src
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", src
    return parser


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    for algorithm in ("fedavg", "fedavgm", "central"):
        execute({**BASE, "algorithm": algorithm}, root / algorithm, log=lambda _: None)
    return root


def test_report_renders_every_registered_algorithms_outputs(tmp_path):
    """Each algorithm's own diagnostics (and its paper plotter, if any) go through the report."""
    from fedhet.algorithms.base import ALGORITHMS

    names = ALGORITHMS.names()
    for name in names:
        settings = {**BASE, "algorithm": name, **example(name)}  # what a small run of it needs
        execute(settings, tmp_path / "runs" / name, log=lambda _: None)
    warnings: list[str] = []
    page = report.write_report(tmp_path / "runs", tmp_path / "page", warn=warnings.append)
    check_page(page)
    assert not warnings, warnings
    assert all(name in page.read_text() for name in names)


def test_report_renders_each_algorithms_outputs(runs_dir, tmp_path):
    page = report.write_report(runs_dir, tmp_path / "page")
    parser = check_page(page)
    text = page.read_text()
    for algorithm in ("fedavg", "fedavgm", "central"):
        assert algorithm in text
    names = [Path(s).name for s in parser.images]
    assert any(n.startswith("fig_curves_") for n in names)
    assert any(n.startswith("fig_diag_") for n in names)
    assert sum(n.startswith("fig_partition_") for n in names) == 1  # central has no partition
    assert "<b>" in text  # best per column marked


def test_report_of_a_single_run_through_the_cli(runs_dir, capsys):
    assert main(["report", str(runs_dir / "fedavg")]) == 0
    page = runs_dir / "fedavg" / "report.html"
    check_page(page)
    assert "Configuration" in page.read_text()


def test_a_run_being_replaced_is_not_a_run_of_the_directory(runs_dir, tmp_path):
    """A folder of runs in which one run is being replaced with --force (the old run kept in
    its `.fedhet-replaced/` until the new one saves a round) reports its runs, not the old one."""
    root = tmp_path / "runs"
    shutil.copytree(runs_dir, root, ignore=shutil.ignore_patterns("report.html", "*.png"))
    shutil.copytree(root / "central", root / "fedavg" / ".fedhet-replaced")
    _, runs = discovery.discover(root)
    assert sorted(r.name for r in runs) == ["central", "fedavg", "fedavgm"]


def test_report_of_a_directory_without_runs_is_a_clear_error(tmp_path):
    with pytest.raises(FedhetError, match="is not a fedhet run or grid directory"):
        report.write_report(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing written into it


def test_diagnostic_columns_are_grouped_into_families():
    columns = ["round", "test_accuracy", "cum_bytes", "device_cloud_bytes", "wall_time_s",
               "tau_0", "tau_1", "tau_10", "N", "E", "herd_dist_0", "herd_dist_1",
               "test_accuracy_avg", "eta_tau_L"]
    families = diagnostic_families(columns)
    assert families == {
        "tau_*": ["tau_0", "tau_1", "tau_10"], "N": ["N"], "E": ["E"],
        "herd_dist_*": ["herd_dist_0", "herd_dist_1"],
        "test_accuracy (extra models)": ["test_accuracy", "test_accuracy_avg"],
        "eta_tau_L": ["eta_tau_L"],
    }


def test_diagnostics_plot_draws_every_family(tmp_path):
    rounds = [0.0, 1.0, 2.0, 3.0]
    metrics = {"round": rounds, "test_accuracy": [0.1, 0.2, 0.3, 0.4],
               "beta": [math.nan, 1.0, 2.0, 1.5], "all_nan": [math.nan] * 4}
    metrics.update({f"tau_{i}": [math.nan, 2.0 + i, 3.0, 4.0] for i in range(12)})
    run = RunData("r", "g", "FedVeca", tmp_path, {"algorithm": "fedveca"}, {}, metrics)
    assert plot_diagnostics(run, tmp_path / "d.png")
    assert (tmp_path / "d.png").stat().st_size > 5000
    empty = RunData("r", "g", "x", tmp_path, {}, {}, {"round": rounds, "all_nan": [math.nan] * 4})
    assert not plot_diagnostics(empty, tmp_path / "e.png")


def test_partition_heatmap_counts_match_the_runs_partition(runs_dir):
    import json

    config = json.loads((runs_dir / "fedavg" / "config.json").read_text())
    counts, title = partition_counts(config)
    assert counts.shape == (4, 10) and "dirichlet" in title
    from fedhet.engine.assembly import assemble
    from fedhet.engine.config import config_of

    cfg = config_of(config)
    sim = assemble(cfg)  # the partition the run trained on
    y = sim.side.data.y_train.numpy()
    for i, part in enumerate(sim.side.partition):
        assert list(counts[i]) == [int((y[part] == c).sum()) for c in range(10)]


def test_extra_plotters_are_called_and_their_failures_reported(runs_dir, tmp_path, monkeypatch):
    def fedavg_plot(runs: list[RunData], out: Path) -> list[tuple[str, Path]]:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot([r.summary["final_accuracy"] for r in runs])
        fig.savefig(out / "fig_extra_fedavg.png")
        plt.close(fig)
        return [("paper figure for fedavg", out / "fig_extra_fedavg.png")]

    def broken(runs, out):
        raise RuntimeError("boom")

    monkeypatch.setitem(figures.EXTRA_PLOTTERS, "fedavg", fedavg_plot)
    monkeypatch.setitem(figures.EXTRA_PLOTTERS, "fedavgm", broken)
    monkeypatch.setitem(figures.EXTRA_PLOTTERS, "central", "json:dumps")  # "module:function", lazily
    _, runs = discovery.discover(runs_dir)
    warnings: list[str] = []
    section = report_page._extra_section(runs, tmp_path, warnings.append)
    assert '<img src="fig_extra_fedavg.png"' in section and "paper figure for fedavg" in section
    assert "fedavgm plots failed: RuntimeError: boom" in section
    assert "central plots failed: TypeError" in section  # json.dumps is no plotter: reported
    assert len(warnings) == 2
