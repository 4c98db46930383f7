"""FedNova (normalised averaging): preset for the objective-inconsistency example."""

from fedhet.papers.fednova import preset  # noqa: F401  (registrations)
