"""FedVeca (adaptive bi-directional step sizes): preset, the fair-comparison protocol of
§IV-A1, its plots (Figs. 4, 6), report figures and the multi-seed table."""

from fedhet.papers.fedveca import figures, preset  # noqa: F401  (registrations)
