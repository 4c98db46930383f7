"""The seed papers and what reproduces them, above the reports and the runs.

- one package per paper (`bherd`, `fednnnn`, `fednova`, `fedsr`, `fedveca`): its `preset` (the
  runs of `fedhet reproduce PAPER`, with the published numbers) and, where the paper has them,
  protocols, plots, report figures and studies;
- `base`: the registry the papers fill (`PRESETS`, `SETUPS`, protocols);
- `claims`: the comparative sentences about a paper's tables (`TableClaim`), which a paper
  declares in its own `claims.py` and the page reads from the recorded cells;
- `reproduce`: `fedhet reproduce PAPER`;
- `campaign`: the papers' tables at their published scale, accumulated across machines;
- `paper_results`, `paper_scale`: the result files kept in the repository and the page
  (docs/paper-scale.md) that sets them beside the published numbers.

Importing this package imports every paper package in it (a folder with a `preset` module),
which registers each paper's preset, protocols and report figures
(`fedhet.reports.figures.EXTRA_PLOTTERS`): adding a paper is adding a folder. The report does
not import the papers; whoever draws a paper's report (the CLI, `reproduce`) imports them first.
"""

import importlib
import pkgutil
from pathlib import Path

PAPERS = tuple(sorted(
    info.name for info in pkgutil.iter_modules(__path__)
    if info.ispkg and (Path(__path__[0]) / info.name / "preset.py").exists()
))
"""The paper packages, by name."""

for _name in PAPERS:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["PAPERS"]
