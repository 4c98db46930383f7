"""Names shared by FedVeca's comparison protocol and its plots (below both, so neither imports
the other)."""

from __future__ import annotations

FEDVECA = "fedveca"
CENTRAL = "central"
LABELS = {FEDVECA: "FedVeca", CENTRAL: "Centralized SGD", "fedavg": "FedAvg", "fednova": "FedNova"}
"""Method directory name → legend label."""
