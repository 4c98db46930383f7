"""`validation_fraction`: tuning runs are scored on held-out training data, not the test set."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.data.registry import DATASETS, load_dataset
from fedhet.data.split import hold_out_validation
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError


def digits():
    return load_dataset("digits", DATASETS.params("digits"), "data")


def test_split_is_stratified_disjoint_and_fixed():
    data = digits()
    val = hold_out_validation(data, 0.2)
    n = len(data.y_train)
    assert len(val.y_train) + len(val.y_test) == n
    assert abs(len(val.y_test) - 0.2 * n) <= 10  # rounding per class
    # the validation rows are training rows, and no training row is in both parts
    rows = {tuple(r) for r in data.x_train.numpy().round(6)}
    val_rows = {tuple(r) for r in val.x_test.numpy().round(6)}
    kept_rows = {tuple(r) for r in val.x_train.numpy().round(6)}
    assert val_rows <= rows and not (val_rows & kept_rows)
    # stratified: each class keeps its share within one sample
    full = np.bincount(data.train_labels, minlength=10)
    held = np.bincount(val.y_test.numpy(), minlength=10)
    assert np.all(np.abs(held - 0.2 * full) <= 1)
    again = hold_out_validation(digits(), 0.2)
    assert np.array_equal(again.y_test.numpy(), val.y_test.numpy())


def test_run_evaluates_on_validation_and_partitions_the_rest():
    cfg = config_of({"dataset": "digits", "clients": 5, "rounds": 1,
                                    "validation_fraction": 0.25})
    sim = assemble(cfg)
    total = len(digits().y_train)
    assert sum(len(ix) for ix in sim.side.client_indices) == len(sim.side.data.y_train)
    assert len(sim.side.data.y_train) + len(sim.side.data.y_test) == total
    assert sim.side.data.meta["evaluated_on"].startswith("validation")


def test_bad_fractions_and_natural_partitions_are_refused():
    with pytest.raises(FedhetError, match="validation_fraction must be in"):
        config_of({"validation_fraction": 1.0})
    cfg = config_of({"dataset": "synthetic", "partition": "natural", "clients": 30,
                                    "validation_fraction": 0.1})
    with pytest.raises(FedhetError, match="users are the clients"):
        assemble(cfg)
