"""Docs that travel: the user docs are package data, `fedhet docs [TOPIC]` prints or
locates them, and every doc a help text, an error or a report page names is one an installed
wheel has.

docs/ is the one copy; `src/fedhet/docs` links to it and `pyproject.toml` ships `docs/*.md` as
package data of `fedhet`.
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from cli_errors import one_error_line

from fedhet import userdocs
from fedhet.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fedhet"


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    """Every help and description text of a parser and its subcommands, recursively."""
    texts = [parser.description or "", parser.epilog or ""]
    for action in parser._actions:
        texts.append(action.help or "")
        if isinstance(action, argparse._SubParsersAction):
            texts += [choice.help or "" for choice in action._choices_actions]
            for sub in action.choices.values():
                texts += _help_texts(sub)
    return texts


def _shipped_globs() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    return data.get("fedhet", [])


def test_the_packaged_docs_are_the_repositorys_docs():
    repo = {p.name: p.read_bytes() for p in (ROOT / "docs").glob("*.md")}
    shipped = {name: path.read_bytes() for name, path in
               ((p.name, p) for p in userdocs.topics().values())}
    assert repo and shipped == repo  # one copy: the package's pages are docs/'s
    assert userdocs.docs_dir().resolve() == (ROOT / "docs").resolve()


def test_every_doc_named_by_help_errors_and_pages_is_shipped():
    named: dict[str, set[str]] = {}
    for text in _help_texts(build_parser()):
        for topic in userdocs.referenced(text):
            named.setdefault(topic, set()).add("help")
    for path in SRC.rglob("*.py"):
        for topic in userdocs.referenced(path.read_text()):
            named.setdefault(topic, set()).add(str(path.relative_to(SRC)))
    assert {"grids", "gpu", "cluster", "deploy", "paper-scale"} <= set(named)
    assert "help" in named["grids"] and "reports/page.py" in named["grids"]
    globs = _shipped_globs()
    topics = userdocs.topics()
    missing = {t: sorted(w) for t, w in named.items() if t not in topics}
    assert not missing, missing
    unshipped = [t for t in named if not any(fnmatch.fnmatch(f"docs/{t}.md", g) for g in globs)]
    assert not unshipped, (unshipped, globs)


def test_fedhet_docs_lists_prints_and_locates(capsys):
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    assert "grids" in listing and "Grids for `fedhet compare`" in listing
    assert main(["docs", "grids"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "grids.md").read_text()
    assert main(["docs", "docs/gpu.md", "--path"]) == 0
    assert Path(capsys.readouterr().out.strip()).resolve() == (ROOT / "docs" / "gpu.md").resolve()
    line = one_error_line(capsys, ["docs", "grid"])
    assert "no doc named 'grid' (did you mean 'grids'?)" in line and "paper-scale" in line


def test_a_built_wheel_carries_the_docs(tmp_path):
    """Build a wheel from a copy of the tree (src/fedhet/docs still a link to docs/)."""
    pytest.importorskip("setuptools")
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "docs", tree / "docs", ignore=shutil.ignore_patterns("img", "figures"))
    shutil.copytree(ROOT / "src", tree / "src", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("fedhet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"fedhet/docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= names
    assert "fedhet/configs/grid-digits.toml" in names
    assert "fedhet/py.typed" in names  # PEP 561: a user's mypy and IDE read fedhet's types
