"""FedNNNN's comparative claims about Table 2, in the paper's words (`papers.claims.TableClaim`).

§5.2: "Regardless of the datasets and distributions, the proposed methods achieve the best
prediction accuracy." The proposed methods are Norm-Norm (eq. 8) and FedNNNN (eqs. 12–13);
the paper's own Table 2 has Momentum above both at MNIST non-IID-B (99.2) and CIFAR-10
non-IID-UB (62.0), and the page says so beside our reading. §6: "FedNNNN outperforms FedAvg
and FedProx … in terms of both convergence speed and prediction accuracy. In particular, we
achieve up to 5% accuracy improvement over FedAvg and FedProx on the CIFAR10 dataset."
"""

from __future__ import annotations

from fedhet.papers.claims import TableClaim
from fedhet.papers.fednnnn.preset import DATASET_LABEL, SCENARIOS, TABLE2


def _groups(dataset: str) -> tuple[str, ...]:
    return tuple(f"{DATASET_LABEL[dataset]} {s}" for s in SCENARIOS)


PAPER = {f"{DATASET_LABEL[d]} {s}": {m: row[(d, s)] for m, row in TABLE2.items()}
         for d in ("mnist", "cifar10") for s in SCENARIOS}
"""Table 2 by cell: `{group: {method: accuracy %}}`."""

CLAIMS = (
    TableClaim("the proposed methods [Norm-Norm, FedNNNN] achieve the best prediction accuracy, "
               "regardless of the datasets and distributions", "§5.2, Table 2",
               ("Norm-Norm", "FedNNNN"), ("FedAvg", "FedProx", "Momentum"),
               _groups("mnist") + _groups("cifar10"), PAPER, reference="FedAvg"),
    TableClaim("FedNNNN outperforms FedAvg and FedProx in prediction accuracy", "§6, Table 2",
               ("FedNNNN",), ("FedAvg", "FedProx"), _groups("mnist") + _groups("cifar10"), PAPER,
               reference="FedAvg"),
)
"""Table 2's comparisons, read on docs/paper-scale.md."""

__all__ = ["CLAIMS"]
