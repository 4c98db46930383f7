"""One data path: the run, the partition report, the report's heatmap and the FedVeca protocol
see the same partition of the same (held-out) training set."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.papers.fedveca.protocol import client_sizes
from fedhet.reports.page import partition_counts
from fedhet.reports.partition import describe_partition


@pytest.mark.parametrize("validation_fraction", [0.0, 0.25])
def test_every_caller_sees_the_runs_partition(validation_fraction):
    settings = {"dataset": "digits", "partition": "dirichlet", "clients": 6, "seed": 3,
                "validation_fraction": validation_fraction, "rounds": 1}
    cfg = config_of(settings)
    sim = assemble(cfg)
    sizes = tuple(len(p) for p in sim.side.partition)
    assert client_sizes(settings) == sizes
    counts = describe_partition(dict(settings), out=lambda _: None)
    assert tuple(counts.sum(axis=1)) == sizes
    heat, _ = partition_counts(cfg.to_dict())
    np.testing.assert_array_equal(heat, counts)
    if validation_fraction:
        assert sum(sizes) < sum(client_sizes({**settings, "validation_fraction": 0.0}))
