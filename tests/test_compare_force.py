"""`compare --force` empties the grid's run directories before any run starts (so a grid
interrupted part-way never leaves old results that a plain re-run takes for finished ones),
removing only what fedhet wrote, and refuses a directory fedhet did not make."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fedhet.errors import FedhetError
from fedhet.runs import processes
from fedhet.runs.comparison import compare

GRID = """\
[base]
dataset = "digits"
partition = "iid"
clients = 3
rounds = 2
lr = 0.1

[axes]
seed = [0, 1]
"""


@pytest.fixture
def finished(tmp_path: Path) -> tuple[Path, Path]:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    compare(grid, out, jobs=1, stream=io.StringIO())
    return grid, out


def test_force_clears_every_cell_before_the_first_run_starts(finished, monkeypatch):
    grid, out = finished
    cells = sorted((out / "runs").iterdir())
    (cells[1] / "notes.txt").write_text("mine")
    seen: list[list[bool]] = []
    real = processes.run_job

    def spy(job):
        seen.append([(c / "summary.json").exists() for c in cells] + [(cells[1] / "notes.txt").exists()])
        return real(job)

    monkeypatch.setattr(processes, "run_job", spy)
    log = io.StringIO()
    compare(grid, out, jobs=1, force=True, stream=log)
    # both old results were gone before the first run; a file fedhet did not write was kept
    assert seen[0] == [False, False, True]
    assert "notes.txt" in log.getvalue()
    assert all((c / "summary.json").exists() for c in cells)


def test_force_refuses_a_run_directory_fedhet_did_not_make(finished):
    grid, out = finished
    cells = sorted((out / "runs").iterdir())
    for entry in cells[1].iterdir():
        entry.unlink()
    (cells[1] / "thesis.tex").write_text("mine")
    with pytest.raises(FedhetError, match=f"refusing to replace {cells[1]}: it was not created"):
        compare(grid, out, jobs=1, force=True, stream=io.StringIO())
    assert (cells[0] / "summary.json").exists()  # nothing was cleared
