"""FedSR (ring-optimised hierarchical FL): preset with Tables II–III's published numbers."""

from fedhet.experiments.papers.fedsr import preset  # noqa: F401  (registrations)
