"""The seed papers, one package each: `preset` (the runs of `fedhet reproduce <paper>`, with the
published numbers), and where the paper has them its protocol, plots, report figures and
studies. Importing this package registers every paper's preset (`papers.base.PRESETS`) and
report figures (`fedhet.experiments.figures.EXTRA_PLOTTERS`)."""

from fedhet.experiments.papers import (  # noqa: F401  (imported for their registrations)
    bherd,
    fednnnn,
    fednova,
    fedsr,
    fedveca,
)
