"""FedSR (ring-optimised hierarchical FL): preset with Tables II–III's published numbers."""

from fedhet.papers.fedsr import preset  # noqa: F401  (registrations)
