"""The seed papers and what reproduces them, above the reports and the runs.

- one package per paper (`bherd`, `fednnnn`, `fednova`, `fedsr`, `fedveca`): its `paper`
  (what it declares: `folder.Paper`), its `preset` (the runs of `fedhet reproduce PAPER`, with
  the published numbers) and, where the paper has them, claims, protocols, plots, report
  figures and studies;
- `folder`: what a paper folder declares (`Paper`, and the campaign's `Table`);
- `base`: the registry the presets fill (`PRESETS`, `SETUPS`, protocols);
- `claims`: the comparative sentences about a paper's tables (`TableClaim`), which a paper
  declares in its own `claims.py` and the page reads from the recorded cells;
- `reproduce`: `fedhet reproduce PAPER`;
- `campaign`: the papers' tables at their published scale, accumulated across machines;
- `paper_results`, `page_cells`, `page_rows`, `paper_scale`: the result files kept in the
  repository and the page (docs/paper-scale.md) that sets them beside the published numbers.

Importing this package imports every paper folder in it (a package with a `paper` module) and
its `paper` module, which registers the paper's preset, protocols and report figures
(`fedhet.reports.figures.EXTRA_PLOTTERS`) and declares its page and campaign tables: adding a
paper is adding a folder. The folders of `$FEDHET_PAPERS` (directories, separated by `:`)
count too, imported as `fedhet.papers.<folder>`: a paper kept outside the package (a test's
throw-away paper, a paper of one's own). The report does not import the papers; whoever draws
a paper's report (the CLI, `reproduce`) imports them first.
"""

import dataclasses
import importlib
import os
import pkgutil
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.papers.folder import Paper

ENV = "FEDHET_PAPERS"
"""Directories whose paper folders join the built-in ones (separated by `os.pathsep`)."""


def _extra_dirs() -> list[str]:
    dirs = [d for d in os.environ.get(ENV, "").split(os.pathsep) if d]
    for d in dirs:
        if not Path(d).is_dir():
            raise FedhetError(f"${ENV}: {d} is not a directory (give directories that hold paper "
                              "folders, each with a paper.py)")
    return [str(Path(d).resolve()) for d in dirs]


def _folders(path: list[str]) -> list[str]:
    """The paper folders on `path`, by name; one name in two places is one error line."""
    where: dict[str, str] = {}
    for entry in path:
        for info in pkgutil.iter_modules([entry]):
            if not info.ispkg or not (Path(entry) / info.name / "paper.py").exists():
                continue
            if info.name in where:
                raise FedhetError(f"${ENV}: a paper folder {info.name!r} is in {where[info.name]} "
                                  f"and in {entry}; rename one of them")
            where[info.name] = entry
    return sorted(where)


__path__.extend(_extra_dirs())


def _declared(name: str) -> Paper:
    importlib.import_module(f"{__name__}.{name}")
    paper = importlib.import_module(f"{__name__}.{name}.paper").PAPER
    if not isinstance(paper, Paper):
        raise FedhetError(f"{name}/paper.py: PAPER is a {type(paper).__name__}, not a "
                          "fedhet.papers.folder.Paper")
    return dataclasses.replace(paper, name=name)


PAPERS: dict[str, Paper] = {name: _declared(name) for name in _folders(list(__path__))}
"""The papers, by folder name (in name order): what each declares."""

__all__ = ["ENV", "PAPERS", "Paper"]
