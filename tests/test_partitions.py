"""Partition invariants: every sample exactly once, determinism, and each scheme's label structure."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from fedhet.data.base import Dataset
from fedhet.data.partition import PARTITIONS, label_counts, partition_dataset, power_law_sizes
from fedhet.errors import FedhetError

SEEDS = (0, 1, 7)


def make_data(labels: np.ndarray) -> Dataset:
    n = len(labels)
    return Dataset(
        "toy", torch.zeros(n, 1), torch.from_numpy(labels.astype(np.int64)),
        torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64), num_classes=int(labels.max()) + 1,
    )


def split(y: np.ndarray, name: str, n_clients: int, seed: int = 0, **values) -> list[np.ndarray]:
    params = PARTITIONS.params(name, values)
    return partition_dataset(make_data(y), name, n_clients, params, seed)


def balanced(per_class: int = 60, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(3).permutation(np.repeat(np.arange(classes), per_class))


def ragged(classes: int = 10) -> np.ndarray:
    """Classes of unequal sizes (40..99), shuffled."""
    counts = np.random.default_rng(5).integers(40, 100, classes)
    return np.random.default_rng(6).permutation(np.repeat(np.arange(classes), counts))


LABEL_SETS = {"balanced": balanced(), "ragged": ragged(), "binary": balanced(150, 2)}
SCHEMES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.5, "min_size": 2}),
    ("dirichlet", {"alpha": 0.5, "min_size": 2, "balance": "niid-bench"}),
    ("dirichlet", {"alpha": 0.5, "min_size": 2, "method": "redraw"}),
    ("label-per-client", {}),
    ("half-iid", {}),
    ("shards", {"xi": 2}),
    ("unbalanced", {}),
    ("unbalanced", {"labels": "shards", "xi": 2, "exponent": 1.5}),
]
RANDOM_SCHEMES = {"iid", "dirichlet", "shards", "unbalanced", "half-iid"}


def held(counts: np.ndarray) -> list[set[int]]:
    return [set(np.flatnonzero(row).tolist()) for row in counts]


@pytest.mark.parametrize(("name", "values"), SCHEMES, ids=lambda v: str(v))
@pytest.mark.parametrize("labels_kind", list(LABEL_SETS))
@pytest.mark.parametrize("n_clients", [2, 5, 13])
def test_every_sample_exactly_once_and_deterministic(name, values, labels_kind, n_clients):
    labels = LABEL_SETS[labels_kind]
    for seed in SEEDS:
        parts = split(labels, name, n_clients, seed, **values)
        assert len(parts) == n_clients
        assert all(p.dtype.kind == "i" and np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
        assert all(len(p) > 0 for p in parts)
        everything = np.sort(np.concatenate(parts))
        np.testing.assert_array_equal(everything, np.arange(len(labels)))  # disjoint and complete
        again = split(labels, name, n_clients, seed, **values)
        assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    if name in RANDOM_SCHEMES and not (name == "half-iid" and n_clients == 2):  # 2: no choice left
        p0, p1 = (split(labels, name, n_clients, s, **values) for s in (0, 1))
        assert any(not np.array_equal(a, b) for a, b in zip(p0, p1, strict=True))


@pytest.mark.parametrize("n_clients", [10, 13, 20, 30])
@pytest.mark.parametrize("labels", [balanced(), ragged()], ids=["balanced", "ragged"])
def test_case2_one_label_per_client_split_evenly(n_clients, labels):
    counts = label_counts(labels, split(labels, "label-per-client", n_clients), 10)
    for i, row in enumerate(counts):
        assert np.flatnonzero(row).tolist() == [i % 10]
    for c in range(10):
        sizes = counts[counts[:, c] > 0, c]
        assert len(sizes) == len(range(c, n_clients, 10))
        assert sizes.max() - sizes.min() <= 1
        assert sizes.sum() == (labels == c).sum()


@pytest.mark.parametrize("n_clients", [2, 3, 4, 9])
def test_case2_fewer_clients_than_labels_gives_contiguous_label_groups(n_clients):
    labels = ragged()
    sets = held(label_counts(labels, split(labels, "label-per-client", n_clients), 10))
    flat = [c for s in sets for c in sorted(s)]
    assert flat == list(range(10))  # each label to exactly one client, in contiguous runs
    sizes = [len(s) for s in sets]
    assert max(sizes) - min(sizes) <= 1


def test_case3_matches_bherd_five_clients():
    """BHerd §5: clients 1–3 IID on the first half of the labels, clients 4–5 on the rest."""
    labels = balanced()
    counts = label_counts(labels, split(labels, "half-iid", 5), 10)
    assert all(s == {0, 1, 2, 3, 4} for s in held(counts[:3]))  # every first-half label, IID
    assert counts[:3].sum(axis=1).max() - counts[:3].sum(axis=1).min() <= 1
    np.testing.assert_array_equal(counts[:3, :5].sum(axis=0), np.full(5, 60))
    assert held(counts[3:]) == [{5, 6, 7}, {8, 9}]
    assert counts[3:, :5].sum() == 0 and counts[:3, 5:].sum() == 0


@pytest.mark.parametrize(("n_clients", "n_iid"), [(2, 1), (6, 3), (11, 6), (20, 10)])
def test_case3_structure(n_clients, n_iid):
    labels = ragged()
    counts = label_counts(labels, split(labels, "half-iid", n_clients, seed=2), 10)
    head, tail = counts[:n_iid], counts[n_iid:]
    assert head[:, 5:].sum() == 0 and tail[:, :5].sum() == 0
    np.testing.assert_array_equal(head.sum(axis=0)[:5], np.bincount(labels, minlength=10)[:5])
    assert head.sum(axis=1).max() - head.sum(axis=1).min() <= 1
    if n_clients - n_iid >= 5:
        assert all(len(s) == 1 for s in held(tail))  # Case 2 on the second half


def test_shards_hold_at_most_xi_labels_when_shards_are_pure():
    labels = balanced(60)  # 10 clients × ξ=2 → 20 shards of 30: no shard straddles two labels
    for xi in (1, 2, 5):
        for seed in SEEDS:
            parts = split(labels, "shards", 10, seed, xi=xi)
            counts = label_counts(labels, parts, 10)
            assert all(len(s) <= xi for s in held(counts))
            assert {len(p) for p in parts} == {60}


@pytest.mark.parametrize("xi", [1, 2, 3])
def test_shards_general_bounds(xi):
    labels = ragged()
    assert math.ceil(len(labels) / (20 * xi)) <= np.bincount(labels).min()  # shards shorter than any class
    parts = split(labels, "shards", 20, 4, xi=xi)
    counts = label_counts(labels, parts, 10)
    assert all(len(s) <= 2 * xi for s in held(counts))  # so each shard straddles at most one boundary
    assert any(len(s) > xi for s in held(counts))  # and some do: class sizes are not shard multiples
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= xi


def test_dirichlet_min_size_and_concentration():
    labels = balanced(100)
    for seed in SEEDS:
        parts = split(labels, "dirichlet", 10, seed, alpha=0.1, min_size=20)
        assert min(len(p) for p in parts) >= 20
    skewed = label_counts(labels, split(labels, "dirichlet", 10, alpha=0.05, min_size=1), 10)
    flat = label_counts(labels, split(labels, "dirichlet", 10, alpha=100.0, min_size=1), 10)
    top_share = lambda c: (c.max(axis=1) / c.sum(axis=1)).mean()  # noqa: E731
    assert top_share(skewed) > 0.6 > 0.25 > top_share(flat)


def test_dirichlet_redraw_draw_is_unchanged():
    """`method="redraw"` (draw the proportions again until every client has `min_size`) gives
    this split, pinned; the default `floor` is tested in tests/test_partition_scale.py."""
    parts = split(balanced(), "dirichlet", 7, 0, method="redraw")
    assert [len(p) for p in parts] == [84, 65, 111, 54, 65, 96, 125]
    digest = hashlib.sha256(b"".join(p.astype(np.int64).tobytes() for p in parts)).hexdigest()
    assert digest.startswith("88b7ace62514f032")


def test_dirichlet_niid_bench_stops_filling_clients_past_n_over_clients():
    """NIID-Bench rule: a client takes a share of class c only while it holds < N/n samples, i.e.
    ≤ ⌈N/n⌉ − 1 before its last class, so it ends with ≤ ⌈N/n⌉ − 1 + max_c |c| samples.
    Plain Dirichlet has no such cap and passes the bound for these labels."""
    labels, n = balanced(20, 50), 10  # N = 1000 in 50 classes of 20: bound 99 + 20 = 119
    bound = math.ceil(len(labels) / n) - 1 + np.bincount(labels).max()
    seeds = range(20)
    capped = [split(labels, "dirichlet", n, s, balance="niid-bench") for s in seeds]
    plain = [split(labels, "dirichlet", n, s) for s in seeds]
    assert max(len(p) for parts in capped for p in parts) <= bound
    assert min(len(p) for parts in capped for p in parts) >= 10  # min_size's default
    assert max(len(p) for parts in plain for p in parts) > bound
    cv = lambda runs: np.mean([np.std([len(p) for p in r]) / np.mean([len(p) for p in r]) for r in runs])  # noqa: E731
    assert cv(capped) < 0.7 * cv(plain)


def test_dirichlet_niid_bench_gives_no_sample_to_a_full_client():
    """Two classes, 2 clients: whichever client passes N/2 on the first class gets none of the second."""
    labels = np.repeat([0, 1], [300, 100])
    full_got = {"niid-bench": [], "none": []}  # class-1 samples of a client holding ≥ 200 after class 0
    for balance, got in full_got.items():
        for seed in range(10):
            counts = label_counts(labels, split(labels, "dirichlet", 2, seed, min_size=1, balance=balance), 2)
            got += [row[1] for row in counts if row[0] >= 200]
    assert len(full_got["niid-bench"]) >= 5 and not any(full_got["niid-bench"])
    assert any(full_got["none"])


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0])
def test_power_law_sizes_follow_rank_law(exponent):
    n, n_clients, m = 5000, 20, 10
    sizes = power_law_sizes(n, n_clients, exponent, m)
    assert sizes.sum() == n and sizes.min() >= m
    w = np.arange(1, n_clients + 1) ** -exponent
    ideal = m + (n - n_clients * m) * w / w.sum()
    assert np.all(np.abs(sizes - ideal) < 1)
    assert np.all(np.diff(sizes) <= 0)


@pytest.mark.parametrize("labels_mode", ["iid", "shards"])
def test_unbalanced_sizes_are_power_law_in_random_client_order(labels_mode):
    labels = balanced(100)
    parts = split(labels, "unbalanced", 20, 3, exponent=1.0, min_size=5, labels=labels_mode)
    sizes = np.array([len(p) for p in parts])
    np.testing.assert_array_equal(np.sort(sizes)[::-1], power_law_sizes(1000, 20, 1.0, 5))
    assert sizes.max() > 5 * sizes.min()
    assert not np.all(np.diff(sizes) <= 0)  # the largest client is not always client 0
    equal = [len(p) for p in split(labels, "unbalanced", 20, 3, exponent=0.0, min_size=5)]
    assert max(equal) - min(equal) <= 1


def test_unbalanced_shards_limits_labels_compared_with_iid():
    labels = ragged()
    m = np.bincount(labels).min()
    kw = {"exponent": 1.0, "min_size": 10, "xi": 2}
    parts = split(labels, "unbalanced", 20, 1, labels="shards", **kw)
    counts = label_counts(labels, parts, 10)
    for p, s in zip(parts, held(counts), strict=True):
        assert len(s) <= 2 * 2 + len(p) // m  # ξ runs of the label-sorted data, each crossing ≤ L/m + 1
    iid = label_counts(labels, split(labels, "unbalanced", 20, 1, labels="iid", **kw), 10)
    assert (counts > 0).sum(axis=1).mean() < (iid > 0).sum(axis=1).mean()


@pytest.mark.parametrize(
    ("name", "n_clients", "values", "message"),
    [
        ("shards", 5, {"xi": 11}, "exceeds the 10 classes"),
        ("unbalanced", 5, {"labels": "shards", "xi": 11}, "exceeds the 10 classes"),
        ("shards", 400, {"xi": 2},
         "800 shards but only 600 samples; use at most 300 clients with xi=2, or partition.xi ≤ 1$"),
        ("iid", 601, {}, "601 clients but only 600 training samples; use at most 600 clients$"),
        ("label-per-client", 601, {}, "601 clients but only 600"),
        ("dirichlet", 10, {"min_size": 61},
         "exceeds the 600 samples; use at most 9 clients with min_size=61, or partition.min_size ≤ 60$"),
        ("unbalanced", 10, {"min_size": 61}, "exceeds the 600 samples"),
        ("half-iid", 1, {}, "at least 2 clients"),
        ("dirichlet", 10, {"alpha": 1e-4, "min_size": 50, "max_tries": 3},
         "in 3 draws; use partition.method=floor .*raise partition.alpha"),
    ],
)
def test_impossible_requests(name, n_clients, values, message):
    with pytest.raises(FedhetError, match=message):
        split(balanced(), name, n_clients, **values)


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("dirichlet", {"alpha": 0}, "alpha must be > 0"),
        ("dirichlet", {"alpha": "-1"}, "alpha must be > 0"),
        ("shards", {"xi": 0}, "xi must be ≥ 1"),
        ("unbalanced", {"exponent": -1}, "exponent must be"),
        ("unbalanced", {"exponent": "nan"}, "exponent must be"),
        ("unbalanced", {"labels": "dirichlet"}, "must be one of iid, shards"),
        ("dirichlet", {"balance": "fedlab"}, "partition.balance must be one of none, niid-bench"),
        ("unbalanced", {"min_size": 0}, "min_size must be ≥ 1"),
        ("shards", {"alpha": 1}, "unknown parameter partition.alpha"),
    ],
)
def test_bad_parameters(name, values, message):
    with pytest.raises(FedhetError, match=message):
        PARTITIONS.params(name, values)


def test_case2_label_with_too_few_samples_for_its_clients():
    labels = np.concatenate([[0], np.repeat(np.arange(1, 10), 30)])
    with pytest.raises(FedhetError, match="label 0 has 1 samples for 2 clients"):
        split(labels, "label-per-client", 20)


def test_single_label_data_rejects_half_iid():
    with pytest.raises(FedhetError, match="2 labels"):
        split(np.zeros(50, dtype=np.int64), "half-iid", 4)


def test_schemes_are_registered():
    assert {"iid", "dirichlet", "label-per-client", "half-iid", "shards", "unbalanced", "natural"} <= set(
        PARTITIONS.names()
    )
    assert math.isclose(PARTITIONS.params("unbalanced").exponent, 1.0)


def test_shards_cut_by_label_never_straddle_two_labels():
    """`cut=label`: 2 labels of 10 and 30 samples, 4 shards: the labels get 1 and 3 shards (∝
    their sizes), every shard 10 samples of one label; 2 clients × ξ = 2 each hold ≤ 2 labels."""
    from fedhet.data.shards import label_shards

    labels = np.array([0] * 10 + [1] * 30)
    pieces = label_shards(labels, 4, np.random.default_rng(0))
    assert sorted(len(p) for p in pieces) == [10, 10, 10, 10]
    assert sorted(len(set(labels[p])) for p in pieces) == [1, 1, 1, 1]
    assert sorted(int(labels[p][0]) for p in pieces) == [0, 1, 1, 1]
    parts = split(labels, "shards", 2, 0, xi=2, cut="label")
    assert sorted(np.concatenate(parts).tolist()) == list(range(40))


def test_shards_cut_by_label_against_the_sorted_cut():
    """Classes of 61–70 samples, 10 clients × ξ = 2: the sorted cut's 20 shards of about 33
    straddle labels, so some client holds 3 labels; the label cut never gives more than 2, and
    every sample goes to exactly one client either way."""
    labels = np.repeat(np.arange(10), np.arange(61, 71))
    for seed in range(5):
        by_label = split(labels, "shards", 10, seed, xi=2, cut="label")
        assert sorted(np.concatenate(by_label).tolist()) == list(range(len(labels)))
        assert max(len(np.unique(labels[p])) for p in by_label) <= 2
    held = [max(len(np.unique(labels[p])) for p in split(labels, "shards", 10, s, xi=2))
            for s in range(5)]
    assert max(held) >= 3
    with pytest.raises(FedhetError, match="a shard per label"):
        split(labels, "shards", 2, 0, xi=2, cut="label")


MNIST_CLASS_SIZES = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
"""MNIST's training samples per digit (60,000 in all)."""


def test_unbalanced_cut_by_label_gives_every_client_exactly_xi_labels():
    """`cut=label` on MNIST's class sizes, 100 clients, ξ = 2: every client, the largest
    (≈ 11,400 samples, more than any class) included, holds exactly 2 labels; every sample goes
    to one client; each client's size stays within 2 % of its power-law size (the same sizes,
    in the same client order, as the default cut draws)."""
    from fedhet.data.partition import unbalanced

    labels = np.repeat(np.arange(10), MNIST_CLASS_SIZES)
    for seed in range(3):
        params = PARTITIONS.params("unbalanced", {"labels": "shards", "xi": 2, "cut": "label"})
        parts = unbalanced(labels, 100, params, np.random.default_rng(seed))
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
        assert ((label_counts(labels, parts, 10) > 0).sum(axis=1) == 2).all()
        target = np.random.default_rng(seed).permutation(power_law_sizes(len(labels), 100, 1.0, 10))
        sizes = np.array([len(p) for p in parts])
        assert np.all(np.abs(sizes - target) <= 0.02 * target)
        assert sizes.max() > max(MNIST_CLASS_SIZES)
        sorted_cut = split(labels, "unbalanced", 100, seed, labels="shards", xi=2)
        assert max(len(np.unique(labels[p])) for p in sorted_cut) > 2  # the default differs


def test_unbalanced_cut_by_label_with_xi_three_and_its_default():
    """ξ = 3 on a small ragged set: exactly 3 labels each; leaving `cut` out is `cut=sorted`."""
    labels = ragged()
    parts = split(labels, "unbalanced", 20, 4, labels="shards", xi=3, cut="label", min_size=10)
    assert ((label_counts(labels, parts, 10) > 0).sum(axis=1) == 3).all()
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    default = split(labels, "unbalanced", 20, 4, labels="shards", xi=3, min_size=10)
    explicit = split(labels, "unbalanced", 20, 4, labels="shards", xi=3, min_size=10, cut="sorted")
    assert all(np.array_equal(a, b) for a, b in zip(default, explicit, strict=True))


@pytest.mark.parametrize(("values", "message"), [
    ({"cut": "label"}, "partition.cut=label cuts label shards; set partition.labels=shards"),
    ({"labels": "shards", "cut": "class"}, "partition.cut must be one of sorted, label"),
])
def test_unbalanced_cut_refuses(values, message):
    with pytest.raises(FedhetError, match=message):
        PARTITIONS.params("unbalanced", values)
