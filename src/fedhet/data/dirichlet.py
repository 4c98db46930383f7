"""Dirichlet label skew with a minimum client size: two rules for the `dirichlet` partitioner.

Both draw, for each class c, the clients' shares `q_c ~ Dir(α·1_n)` and cut class c's shuffled
samples at the cumulative shares (Yurochkin et al., "Bayesian Nonparametric Federated Learning
of Neural Networks", ICML 2019, §5; the `noniid-labeldir` split of NIID-Bench, Li et al.,
"Federated Learning on Non-IID Data Silos", ICDE 2022, §IV-A). They differ in how every client
comes to hold at least `m` samples:

- `redraw_split`: draw again until the draw gives every client ≥ m (NIID-Bench's loop): the
  exact conditional law, but the chance of a fitting draw vanishes with many clients or a small
  α, so it is capped at a number of draws;
- `floor_split`: one draw, then a construction that always meets the floor (`floor_counts`).

A split is a `(C, n)` matrix of counts (class c's samples held by client i); `deal` turns it
into index arrays. Classes are `np.unique(labels)` in order.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Balance = Literal["none", "niid-bench"]


def class_members(labels: np.ndarray) -> list[np.ndarray]:
    """Each class's sample indices in ascending order, classes in `np.unique` order."""
    _, inverse, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    return np.split(np.argsort(inverse, kind="stable"), np.cumsum(sizes)[:-1])


def deal(shuffled: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Client i gets `counts[c, i]` samples of class c: the next run of `shuffled[c]` (a class's
    indices in random order), so class c is cut at `cumsum(counts[c])`. Sorted arrays, one a
    client, O(N log N)."""
    n_clients = counts.shape[1]
    n_samples = sum(len(s) for s in shuffled)
    owner = np.empty(n_samples, dtype=np.int64)
    for idx, row in zip(shuffled, counts, strict=True):
        owner[idx] = np.repeat(np.arange(n_clients), row)
    by_client = np.argsort(owner, kind="stable")  # ascending indices within each client
    return np.split(by_client, np.cumsum(counts.sum(axis=0))[:-1])


def cut(q: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """`counts[c]`: `totals[c]` items cut at the cumulative shares `cumsum(q[c])`, each cut
    rounded down (so `counts[c, i]` is within 1 of `q[c, i] · totals[c]`). `q`: `(C, n)`."""
    cum = np.cumsum(q, axis=1)
    cum /= cum[:, -1:]  # exactly 1 at the end, whatever the float sum of q[c] was
    cuts = np.floor(cum * totals[:, None]).astype(np.int64)
    cuts[:, -1] = totals
    return np.diff(cuts, axis=1, prepend=0)


def floor_counts(
    q: np.ndarray, sizes: np.ndarray, min_size: int, rng: np.random.Generator
) -> np.ndarray:
    """Counts in which every client holds ≥ `min_size` samples, from one draw of shares `q`.

    `q[c]` (a row of `(C, n)`) is the clients' shares of class c, `sizes[c]` its samples; needs
    `n · min_size ≤ Σ sizes`. Two steps:

    1. **Floor.** Client i's class mix is `p_i(c) ∝ q[c, i] · sizes[c]`, the mix of the samples
       the shares alone would give it. Each client draws its `min_size` samples' classes from
       `p_i` (multinomial) over the classes that still have samples; a class drawn more often
       than it has samples keeps a uniformly random subset of its draws, is then full, and the
       clients that lost a draw draw again over the classes still open. Every pass places all
       draws or fills a class for good, and the open classes always hold enough samples
       (`Σ left − Σ need = N − n·m ≥ 0`), so at most C passes. A client with no share in any
       open class (α so small that its shares underflowed to 0) draws by the open classes' sizes.
    2. **Rest.** Class c's remaining samples are cut by `q[c]` (`cut`), as the plain rule cuts
       the whole class.

    O(N + passes · n · C) with NumPy; with many clients the first pass places nearly everything.
    """
    weight = q * sizes[:, None]
    floor = np.zeros_like(q, dtype=np.int64)
    need = np.full(q.shape[1], min_size, dtype=np.int64)
    left = sizes.astype(np.int64).copy()
    for _ in range(len(sizes)):  # each pass that leaves a need fills a class (docstring)
        drawing = np.flatnonzero(need)
        if len(drawing) == 0:
            break
        draws = _draw_classes(weight[:, drawing], left, need[drawing], rng)
        for c in np.flatnonzero(draws.sum(axis=1) > left):
            holders = np.repeat(np.arange(len(drawing)), draws[c])
            kept = rng.permutation(holders)[: left[c]]
            draws[c] = np.bincount(kept, minlength=len(drawing))
        floor[:, drawing] += draws
        need[drawing] -= draws.sum(axis=0)
        left -= draws.sum(axis=1)
    return floor + cut(q, left)


def _draw_classes(
    weight: np.ndarray, left: np.ndarray, need: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """`(C, k)`: client j's `need[j]` draws over the classes with `left > 0`, by `weight[:, j]`
    (by `left` where a client has no weight on an open class)."""
    w = np.where(left[:, None] > 0, weight, 0.0)
    top = w.max(axis=0)
    lost = ~(top > 0)
    w[:, lost] = left[:, None]
    w /= np.where(lost, left.max(), top)  # scale each column to max 1 before normalising
    p = (w / w.sum(axis=0)).T
    return rng.multinomial(need, p).T


def floor_split(
    members: list[np.ndarray], n_clients: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """`floor_counts` of one draw `q_c ~ Dir(α·1_n)` per class, dealt out (classes shuffled)."""
    sizes = np.array([len(m) for m in members], dtype=np.int64)
    q = rng.dirichlet(np.full(n_clients, alpha), size=len(members))
    counts = floor_counts(q, sizes, min_size, rng)
    return deal([rng.permutation(m) for m in members], counts)


def redraw_split(
    members: list[np.ndarray],
    n_clients: int,
    alpha: float,
    min_size: int,
    balance: Balance,
    max_tries: int,
    rng: np.random.Generator,
) -> list[np.ndarray] | None:
    """NIID-Bench's rule: draw until every client holds ≥ `min_size`, at most `max_tries` draws
    (`None` when none fits). The split, and the random stream, of fedhet's `dirichlet` before it
    had the `floor` rule.

    One draw: for each class in turn, its indices shuffled, then `q ~ Dir(α·1_n)`, the class cut
    at `⌊cumsum(q) · |c|⌋`. With `balance="niid-bench"` a client already holding ≥ N/n samples
    gets `q_i = 0` for the class, the others renormalised, and the cuts are taken on
    `cumsum(q) / cumsum(q)[-1]` so a zero share gets exactly nothing (**[choice]**: NIID-Bench's
    float rounding can hand it one sample); a class whose every open share underflowed to 0 fails
    the draw. A draw costs O(N + n·C) and only a fitting one is dealt out.
    """
    n_samples = sum(len(m) for m in members)
    for _ in range(max_tries):
        shuffled, rows = [], []
        sizes = np.zeros(n_clients, dtype=np.int64)
        for m in members:
            idx = rng.permutation(m)
            q = rng.dirichlet(np.full(n_clients, alpha))
            if balance == "niid-bench":
                cum = np.cumsum(np.where(sizes < n_samples / n_clients, q, 0.0))
                if cum[-1] == 0:
                    break
                cuts = (cum[:-1] / cum[-1] * len(idx)).astype(int)
            else:
                cuts = (np.cumsum(q)[:-1] * len(idx)).astype(int)
            row = np.diff(cuts, prepend=0, append=len(idx))
            shuffled.append(idx)
            rows.append(row)
            sizes += row
        else:
            if sizes.min() >= min_size:
                return deal(shuffled, np.stack(rows))
    return None
