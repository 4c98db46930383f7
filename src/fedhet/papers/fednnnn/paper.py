"""FedNNNN as a paper folder declares it: its page sections and its campaign table (Table 2, MNIST)."""

from fedhet.papers.fednnnn.page import sections
from fedhet.papers.folder import Paper, Table, label_cut
from fedhet.runs import RunSpec


def headline(s: RunSpec) -> bool:
    """NonIID-UB, FedAvg against FedNNNN: the cell of the paper's main claim."""
    return s.group.endswith("NonIID-UB") and s.label in ("FedAvg", "FedNNNN")


PAPER = Paper(
    title="FedNNNN", page=4, sections=sections,
    tables=(
        Table("fednnnn-mnist", "fednnnn", "table2-mnist", "FedNNNN Table 2, MNIST", ("mnist",),
              headline, paper_seeds=1, order=10, bf16=True,
              alternatives=label_cut(("MNIST NonIID-B", "MNIST NonIID-UB"), ("FedAvg", "FedNNNN")),
              deviations="bf16 autocast (benchmarks/RESULTS.md: FedAvg and FedNova within 0.01 "
                         "points of fp32 on this CNN); seeds 1-2 are extras (the paper ran once)"),
    ),
)
