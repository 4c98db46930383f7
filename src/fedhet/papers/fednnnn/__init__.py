"""FedNNNN (norm-normalised aggregation): preset with Tables 2–4's published numbers, the
N/E plots (Figs. 3, 11–33) and their report figures."""

from fedhet.papers.fednnnn import figures, preset  # noqa: F401  (registrations)
