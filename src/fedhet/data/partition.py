"""Partitioners: split a dataset's train indices among clients.

Each partitioner is `(labels, n_clients, params, rng) -> list[np.ndarray]` and is deterministic
given `rng`. Unless its docstring says otherwise, every sample goes to exactly one client.
Impossible requests raise `FedhetError` with what to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedhet.data.base import Dataset
from fedhet.errors import FedhetError
from fedhet.registry import NoParams, Registry

Partitioner = Callable[[np.ndarray, int, Any, np.random.Generator], list[np.ndarray]]
PARTITIONS: Registry[Partitioner] = Registry("partition")


def _check_clients(labels: np.ndarray, n_clients: int) -> None:
    if n_clients < 1:
        raise FedhetError("--clients must be ≥ 1")
    if n_clients > len(labels):
        raise FedhetError(
            f"{n_clients} clients but only {len(labels)} training samples; use fewer clients"
        )


@PARTITIONS.register("iid", NoParams, "Case 1: samples shuffled and dealt out evenly")
def iid(labels: np.ndarray, n_clients: int, params: Any, rng: np.random.Generator):
    _check_clients(labels, n_clients)
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), n_clients)]


@dataclass(frozen=True)
class DirichletParams:
    alpha: float = 0.5
    min_size: int = 10
    max_tries: int = 1000

    def validate(self) -> None:
        if not self.alpha > 0:
            raise FedhetError(f"partition.alpha must be > 0, got {self.alpha}")
        if self.min_size < 0:
            raise FedhetError("partition.min_size must be ≥ 0")


@PARTITIONS.register("dirichlet", DirichletParams, "per class q ~ Dir(α·1), split accordingly")
def dirichlet(labels: np.ndarray, n_clients: int, params: DirichletParams, rng: np.random.Generator):
    """Per class `q ~ Dir(α 1_N)`; redraw until each client holds ≥ `min_size` samples."""
    _check_clients(labels, n_clients)
    if params.min_size * n_clients > len(labels):
        raise FedhetError(
            f"partition.min_size={params.min_size} × {n_clients} clients exceeds the "
            f"{len(labels)} samples; lower partition.min_size or use fewer clients"
        )
    classes = np.unique(labels)
    for _ in range(params.max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(n_clients, params.alpha))
            cuts = (np.cumsum(q)[:-1] * len(idx)).astype(int)
            for i, piece in enumerate(np.split(idx, cuts)):
                parts[i].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= params.min_size:
            return out
    raise FedhetError(
        f"Dirichlet α={params.alpha} gave a client with fewer than {params.min_size} samples "
        f"in {params.max_tries} draws; raise partition.alpha or lower partition.min_size"
    )


@PARTITIONS.register("natural", NoParams, "the dataset's own users (Synthetic): one per client")
def natural(labels: np.ndarray, n_clients: int, params: Any, rng: np.random.Generator):
    raise FedhetError("the natural partition needs a dataset that has users (e.g. synthetic)")


def partition_dataset(
    data: Dataset, name: str, n_clients: int, params: Any, seed: int
) -> list[np.ndarray]:
    """Client index arrays for `data` under partitioner `name`, deterministic in `seed`."""
    entry = PARTITIONS.get(name)
    if name == "natural":
        if data.natural_partition is None:
            raise FedhetError(
                f"dataset {data.name} has no natural partition; choose another --partition"
            )
        if n_clients != len(data.natural_partition):
            raise FedhetError(
                f"the natural partition of {data.name} has {len(data.natural_partition)} users; "
                f"set --clients {len(data.natural_partition)} (or dataset.users)"
            )
        return [np.asarray(p) for p in data.natural_partition]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9A27]))
    return entry.factory(data.train_labels, n_clients, params, rng)


def label_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """`counts[i, c]`: samples of class c held by client i."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
