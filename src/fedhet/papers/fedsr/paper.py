"""FedSR as a paper folder declares it: its page sections and its campaign tables (Tables
II–III on MNIST and on Fashion-MNIST)."""

from fedhet.papers.fedsr.page import sections
from fedhet.papers.folder import Paper, Table, label_cut
from fedhet.runs import RunSpec


def headline(s: RunSpec) -> bool:
    """ξ = 2, FedAvg against FedSR: the cell of the paper's main claim."""
    return s.group.endswith("xi=2") and s.label in ("FedAvg", "FedSR")


PAPER = Paper(
    title="FedSR", page=5, sections=sections,
    tables=(
        Table("fedsr-mnist", "fedsr", "table2-mnist", "FedSR Tables II-III, MNIST", ("mnist",),
              headline, paper_seeds=1, order=20, extra_columns=("cum_model_transfers",),
              alternatives=label_cut(("MNIST xi=2",), ("FedAvg", "FedSR")),
              deviations="the centralized reference runs once per seed and serves every partition; "
                         "seeds 1-2 are extras (Table II gives one value per cell, no spread)"),
        Table("fedsr-fashion-mnist", "fedsr", "table2-fashion-mnist",
              "FedSR Tables II-III, Fashion-MNIST", ("fashion-mnist",), headline, paper_seeds=1,
              order=50, extra_columns=("cum_model_transfers",),
              deviations="the centralized reference runs once per seed and serves every partition"),
    ),
)
