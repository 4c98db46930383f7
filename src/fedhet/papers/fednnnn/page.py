"""FedNNNN's sections of docs/paper-scale.md: Table 2's published numbers beside ours, and its
comparative claims (`claims.CLAIMS`) read from the recorded cells."""

from __future__ import annotations

from fedhet.papers.fednnnn import claims
from fedhet.papers.fednnnn.preset import published_rows
from fedhet.papers.page_rows import (
    CLAIMS_NOTE,
    Section,
    campaign_left,
    missing_cell,
    missing_labels,
    no_data,
    number_rows,
    table_claim_rows,
)


def sections() -> list[Section]:
    return [
        Section("FedNNNN", "Table 2: test accuracy (%), 100 clients",
                lambda r: number_rows(r, "fednnnn", published_rows(), missing_cell(r, "fednnnn")),
                lambda r: "Protocol: Table 1 (100 clients, C = 1, B = 50, E = 5, η = 0.05, 100 rounds, "
                "the Table 3 CNN), Table 5's parameters; one run per cell as the paper (seed 0), "
                "in bf16. MNIST rows: " + campaign_left(r, "fednnnn-mnist") + "."),
        Section("FedNNNN", "Table 2's comparisons, read from the recorded cells",
                lambda r: table_claim_rows(r, "fednnnn", claims.CLAIMS, missing_labels(r, "fednnnn"),
                                           no_data),
                lambda r: CLAIMS_NOTE),
    ]
