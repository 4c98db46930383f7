"""`fedhet report DIR --screenshot PNG`: the page as a reader sees it (headless Chromium).

The rendering test needs Chromium (`apt-get install chromium`) and is skipped without it; CI
does not install it. The missing-browser path always runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.reports.screenshot import find_chromium, page_height, png_size
from fedhet.runs.single import execute

BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 3, "rounds": 3, "lr": 0.1}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shot")
    for algorithm in ("fedavg", "fedprox"):
        execute({**BASE, "algorithm": algorithm}, root / f"{algorithm}-with-a-long-run-name-{'x' * 40}",
                log=lambda _: None)
    return root


def test_screenshot_without_a_browser_is_one_line_and_keeps_the_page(two_runs, tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setenv("FEDHET_CHROMIUM", str(tmp_path / "no-such-browser"))
    out = tmp_path / "page"
    assert main(["report", str(two_runs), "--out", str(out), "--screenshot", str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs Chromium" in err and "Traceback" not in err
    assert (out / "report.html").exists() and not (tmp_path / "s.png").exists()


@pytest.mark.skipif(find_chromium() is None,
                    reason="needs Chromium or Chrome (apt-get install chromium); CI has none")
def test_screenshot_shows_the_figures_and_nothing_is_cut_at_the_right_edge(two_runs, tmp_path, capsys):
    from PIL import Image  # matplotlib's dependency

    out = tmp_path / "page"
    png = tmp_path / "shot.png"
    assert main(["report", str(two_runs), "--out", str(out), "--screenshot", str(png)]) == 0
    assert f"screenshot: {png}" in capsys.readouterr().out
    width, height = png_size(png)
    assert width == 1280 and height == page_height(out / "report.html")
    image = Image.open(png).convert("RGB")
    pixels = image.load()
    # the curves are drawn: FedAvg's tab10 blue appears in quantity
    blue = sum(1 for x in range(0, width, 2) for y in range(0, height, 2)
               if abs(pixels[x, y][0] - 31) < 25 and abs(pixels[x, y][1] - 119) < 25
               and abs(pixels[x, y][2] - 180) < 25)
    assert blue > 200

    # a narrow window: the wide runs table scrolls inside its box; the page's right margin
    # stays blank (a table running off the page would draw its cells there)
    from fedhet.reports.screenshot import screenshot

    narrow = screenshot(out / "report.html", tmp_path / "narrow.png", width=700)
    image = Image.open(narrow).convert("RGB")
    w, h = image.size
    assert w == 700
    edge = image.crop((w - 8, 0, w, h))
    assert edge.getextrema() == ((255, 255), (255, 255), (255, 255))
