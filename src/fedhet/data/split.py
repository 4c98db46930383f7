"""Held-out data: a validation split for hyperparameter tuning, and each client's own share.

FedNNNN's appendix ("Determination of Hyperparameters") tunes η, β, γ and μ on a validation
split of the training data, never on the test set. `hold_out_validation` splits a fraction of
the training samples off and makes it the evaluation set of the run. `hold_out_per_client`
splits a fraction of each client's partition off as that client's own held-out share, on which
per-client evaluation scores the global model (`client_eval_fraction`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fedhet.data.base import Dataset
from fedhet.errors import FedhetError


def hold_out_validation(data: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """`data` with `fraction` of its training samples moved to the evaluation set.

    Stratified by the partition labels, and fixed by `seed` alone (not the run's seed), so every
    candidate of a tuning grid is scored on the same split **[choice]**. The test set is not
    used; the clients are partitioned over the remaining training samples.
    """
    if data.natural_partition is not None and "client_ids" in data.meta:
        raise FedhetError(
            f"validation_fraction does not apply to {data.name}, whose client ids are the clients; "
            "give the validation samples as its test set instead"
        )
    if data.natural_partition is not None:
        raise FedhetError(
            f"validation_fraction does not apply to {data.name}, whose users are the clients; "
            "its per-user test split is already held out"
        )
    labels = data.split_labels
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5A11D]))
    held = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    val = np.sort(np.concatenate([idx[: int(round(fraction * len(idx)))] for idx in held]))
    keep = np.setdiff1d(np.arange(len(labels)), val)
    if len(val) == 0 or len(keep) == 0:
        raise FedhetError(
            f"validation_fraction={fraction} leaves {len(val)} validation and {len(keep)} training "
            f"samples of {len(labels)}; choose a fraction strictly between 0 and 1 that leaves both"
        )
    return dataclasses.replace(
        data,
        x_train=data.x_train[keep], y_train=data.y_train[keep],
        x_test=data.x_train[val], y_test=data.y_train[val],
        partition_labels=None if data.partition_labels is None else data.partition_labels[keep],
        meta={**data.meta, "evaluated_on": f"validation split ({fraction:g} of train)"},
    )


def hold_out_per_client(
    parts: Sequence[np.ndarray], fraction: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's training indices and held-out share: `(train, held)`, client by client.

    Client `i` with `D_i` samples holds out `h_i = ⌊fraction·D_i + ½⌋` of them, clipped to
    `[1, D_i − 1]` so that it both trains and is evaluated (a client of one sample holds out
    none), drawn uniformly without replacement from the stream `(seed, 0xC11E, i)` **[choice]**:
    not stratified by label, as a client's own test split is a sample of its own data. The
    training indices keep their order in the partition; a held-out share is sorted."""
    train, held = [], []
    for i, part in enumerate(parts):
        part = np.asarray(part, dtype=np.int64)
        n = len(part)
        h = min(max(int(np.floor(fraction * n + 0.5)), 1), n - 1) if n >= 2 else 0
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC11E, i]))
        out = np.zeros(n, dtype=bool)
        out[rng.choice(n, h, replace=False)] = True
        train.append(part[~out])
        held.append(np.sort(part[out]))
    return train, held
