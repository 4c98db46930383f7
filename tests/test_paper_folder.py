"""Adding a paper is adding a folder: a throw-away paper in a directory of `$FEDHET_PAPERS`
(`fedhet.papers`'s documented hook for paper folders kept outside the package) shows on
docs/paper-scale.md, in `fedhet campaign plan` and in `fedhet reproduce --help`, with no file of
the repository touched; and no module outside a paper's folder imports it by name."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

INIT = '''"""ToyPaper: a test's throw-away paper."""

from fedhet.papers.toypaper import preset  # noqa: F401  (registration)
'''

PRESET = '''"""ToyPaper's preset: FedAvg against FedProx on digits, one round."""

from pathlib import Path

from fedhet.papers.base import PRESETS
from fedhet.runs.presets import Preset, RunSpec

GROUP = "digits IID"


@PRESETS.register("toypaper", doc="ToyPaper: FedAvg against FedProx on digits (throw-away)")
def toypaper_preset(scale: str) -> Preset:
    def stage(out: Path) -> list[RunSpec]:
        base = {"dataset": "digits", "partition": "iid", "clients": 4, "rounds": 1, "seed": 0}
        return [RunSpec("fedavg", GROUP, "FedAvg", {**base, "algorithm": "fedavg"}),
                RunSpec("fedprox", GROUP, "FedProx", {**base, "algorithm": "fedprox"})]

    return Preset(paper="toypaper", scale=scale, stages=[stage])
'''

PAPER = '''"""ToyPaper as its folder declares it: one page section (one claim) and one campaign table."""

from fedhet.papers.claims import TableClaim
from fedhet.papers.folder import Paper, Table
from fedhet.papers.page_rows import Section, cell_left, table_claim_rows
from fedhet.papers.toypaper.preset import GROUP

CLAIM = TableClaim(quote="FedProx beats FedAvg on toy digits", source="§9, Table 1",
                   winners=("FedProx",), others=("FedAvg",), groups=(GROUP,))


def sections() -> list[Section]:
    return [Section("ToyPaper", "Table 1's claim, read from the recorded cells", lambda r:
                    table_claim_rows(r, "toypaper", (CLAIM,),
                                     lambda g, ms: cell_left(r, "toypaper-digits", g, ms)))]


PAPER = Paper(
    title="ToyPaper", page=99, sections=sections,
    tables=(Table("toypaper-digits", "toypaper", "table1", "ToyPaper Table 1, digits", ("digits",),
                  lambda s: s.label == "FedProx", paper_seeds=1, order=99),),
)
'''


def _toy(root: Path) -> Path:
    folder = root / "toypaper"
    folder.mkdir(parents=True)
    for name, text in (("__init__.py", INIT), ("preset.py", PRESET), ("paper.py", PAPER)):
        (folder / name).write_text(text)
    return root


def _fedhet(argv: list[str], papers: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "FEDHET_PAPERS": str(papers),
           "FEDHET_CAMPAIGN_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fedhet", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_a_paper_folder_outside_the_package_is_on_the_page_in_the_plan_and_in_the_help(tmp_path):
    papers = _toy(tmp_path / "papers")
    before = {d: _digest(ROOT / d) for d in ("src", "docs", "results")}

    helped = _fedhet(["reproduce", "--help"], papers, tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "toypaper   ToyPaper: FedAvg against FedProx on digits (throw-away)" in helped.stdout
    assert "fedveca" in helped.stdout  # beside the built-in papers

    plan = _fedhet(["campaign", "plan", "--results", str(ROOT / "results"), "--tables",
                    "toypaper-digits"], papers, tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "| toypaper-digits | digits IID (headline) | FedProx |" in plan.stdout
    assert "| toypaper-digits | digits IID | FedAvg |" in plan.stdout

    out = tmp_path / "page.md"
    page = _fedhet(["paper-scale", "--results", str(ROOT / "results"), "--out", str(out)], papers,
                   tmp_path)
    assert page.returncode == 0, page.stderr
    text = out.read_text()
    assert text.startswith("# The six papers at their own scale")
    assert "| toypaper-digits: ToyPaper Table 1, digits | 0 / 2 |" in text
    section = text[text.index("## ToyPaper"):]
    row = next(line for line in section.splitlines() if "FedProx beats FedAvg on toy digits" in line)
    assert row.startswith("| digits IID | FedProx beats FedAvg on toy digits (§9, Table 1) | not yet: ")
    assert "FedProx, FedAvg not recorded (2 run(s) left in the campaign" in row
    assert "`--tables toypaper-digits`" in row and row.endswith("| not yet | — |")
    # the built-in papers' sections stay as they were, before the new one
    assert text.index("## FedSR") < text.index("## ToyPaper")

    assert {d: _digest(ROOT / d) for d in before} == before, "adding a paper touched the repository"


def test_a_papers_directory_that_is_not_there_is_one_error_line(tmp_path):
    done = _fedhet(["reproduce", "--help"], tmp_path / "nowhere", tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "$FEDHET_PAPERS" in lines[0] and "is not a directory" in lines[0]


def test_a_paper_folder_named_like_a_built_in_paper_is_one_error_line(tmp_path):
    (tmp_path / "papers" / "fedsr").mkdir(parents=True)
    (tmp_path / "papers" / "fedsr" / "__init__.py").write_text("")
    (tmp_path / "papers" / "fedsr" / "paper.py").write_text("")
    done = _fedhet(["reproduce", "--help"], tmp_path / "papers", tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "a paper folder 'fedsr' is in" in lines[0] and "rename one" in lines[0]


@pytest.mark.parametrize("paper", ["bherd", "fednnnn", "fednova", "fedsr", "fedveca"])
def test_no_module_outside_a_papers_folder_imports_it(paper):
    """The page, the campaign and the command line reach a paper only through the registry
    (`fedhet.papers.PAPERS`, `fedhet.papers.base.PRESETS`): no module of src/fedhet outside
    `papers/<paper>/` imports `fedhet.papers.<paper>` (imports inside functions count too)."""
    from fedhet.papers import PAPERS

    assert paper in PAPERS
    folder = SRC / "fedhet" / "papers" / paper
    reached = []
    for path in (SRC / "fedhet").rglob("*.py"):
        if folder in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n == f"fedhet.papers.{paper}" or n.startswith(f"fedhet.papers.{paper}.")
                   for n in names):
                reached.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert reached == [], f"modules that import the paper {paper} by name: {reached}"
