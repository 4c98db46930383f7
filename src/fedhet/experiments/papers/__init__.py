"""The seed papers, one package each: `preset` (the runs of `fedhet reproduce <paper>`, with the
published numbers), and where the paper has them its protocols, plots, report figures and
studies. Importing this package imports every paper folder in it, which registers each paper's
preset (`papers.base.PRESETS`), protocols and report figures
(`fedhet.experiments.figures.EXTRA_PLOTTERS`): adding a paper is adding a folder."""

from fedhet.registry import import_all

import_all(__name__, __path__)
