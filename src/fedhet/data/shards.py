"""Cutting a label-sorted training set into shards, for the `shards` and `unbalanced`
partitioners (`fedhet.data.partition`): all indices sorted by label (`label_sorted`), shards
that never straddle two labels (`label_shards`), and every client holding exactly ξ labels
(`exact_labels`), with the largest-remainder rule both use (`apportion`).
"""

from __future__ import annotations

import numpy as np

from fedhet.errors import FedhetError


def label_sorted(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """All indices sorted by label, in random order within each label."""
    perm = rng.permutation(len(labels))
    return perm[np.argsort(labels[perm], kind="stable")]


def label_shards(labels: np.ndarray, n_shards: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`n_shards` shards, none straddling two labels: label c gets `k_c` of them, `k_c ∝ |c|`
    by largest remainders (at least one each: `apportion`), its shuffled samples cut into `k_c`
    near-equal pieces."""
    classes, sizes = np.unique(labels, return_counts=True)
    if n_shards < len(classes):
        raise FedhetError(
            f"partition.cut=label needs a shard per label: {n_shards} shards for {len(classes)} "
            "labels; use more clients or a larger partition.xi, or partition.cut=sorted"
        )
    k = apportion(n_shards, sizes)
    if (k > sizes).any():
        c = int(np.flatnonzero(k > sizes)[0])
        raise FedhetError(f"label {classes[c]} has {sizes[c]} samples for {k[c]} shards; use "
                          "fewer clients or a smaller partition.xi, or partition.cut=sorted")
    pieces: list[np.ndarray] = []
    for c, kc in zip(classes, k, strict=True):
        members = rng.permutation(np.flatnonzero(labels == c))
        pieces += np.array_split(members, int(kc))
    return pieces


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """`total` cut in proportion to `weights` (largest remainders), at least 1 each; needs
    `total ≥ len(weights)`."""
    exact = total * weights / weights.sum()
    k = np.maximum(1, np.floor(exact).astype(np.int64))
    while k.sum() > total:  # the floor of one each took more than the shares gave
        k[np.argmax(np.where(k > 1, k - exact, -np.inf))] -= 1
    k[np.argsort(-(exact - k), kind="stable")[: total - int(k.sum())]] += 1
    return k


def exact_labels(labels: np.ndarray, sizes: np.ndarray, xi: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Every client holds exactly ξ labels, about `sizes[i]/ξ` samples of each.

    **[choice]** Clients from the largest down (ties in random order) take the ξ labels with the
    most samples not yet asked for (ties in random order), asking `sizes[i]/ξ` of each (split as
    `shards` splits a size). Each label's shuffled samples then go to its holders in proportion
    to what they asked (largest remainders, at least 1 each), so every sample goes to exactly one
    client and a client's size is its power-law size up to its labels' excess or shortfall (MNIST's
    class sizes, 100 clients, seeds 0-4: within 1.1 %; `tests/test_partitions.py` holds it to 2 %).
    """
    classes, supply = np.unique(labels, return_counts=True)
    asks = sizes[:, None] // xi + (np.arange(xi) < sizes[:, None] % xi)
    left = supply.astype(np.int64)
    held = np.zeros((len(sizes), xi), dtype=np.int64)
    for i in np.lexsort((rng.random(len(sizes)), -sizes)):
        pick = np.lexsort((rng.random(len(classes)), -left))[:xi]
        held[i] = pick
        left[pick] -= asks[i]
    parts: list[list[np.ndarray]] = [[] for _ in sizes]
    for c in range(len(classes)):
        who, slot = np.nonzero(held == c)
        if len(who) == 0:
            continue
        if len(who) > supply[c]:
            raise FedhetError(f"label {classes[c]} has {supply[c]} samples for {len(who)} clients; "
                              "use fewer clients, or partition.cut=sorted")
        counts = apportion(int(supply[c]), asks[who, slot].astype(np.float64))
        members = rng.permutation(np.flatnonzero(labels == classes[c]))
        for i, piece in zip(who, np.split(members, np.cumsum(counts)[:-1]), strict=True):
            parts[i].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]

