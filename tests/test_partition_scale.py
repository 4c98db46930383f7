"""Splits at any scale: `dirichlet`'s `floor` rule meets `min_size` in one draw for as many
clients as the data allows; `redraw` is the earlier rule, split for split; impossible settings
are one line naming the nearest feasible one."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.configs import HERE as CONFIGS
from fedhet.data.dirichlet import cut, floor_counts
from fedhet.data.partition import PARTITIONS, label_counts
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.papers.fedsr.preset import scale_runs
from fedhet.runs.grid import load_grid

MNIST_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
"""MNIST's training labels per class (60,000)."""
MNIST_LIKE = np.random.default_rng(0).permutation(np.repeat(np.arange(10), MNIST_COUNTS))


def split(y: np.ndarray, name: str, n_clients: int, seed: int = 0, **values) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return PARTITIONS.get(name).factory(y, n_clients, PARTITIONS.params(name, values), rng)


def assert_exact_cover(parts: list[np.ndarray], n_samples: int) -> None:
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n_samples))


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0])
@pytest.mark.parametrize(("n_clients", "min_size"), [(100, 10), (10_000, 6)])
def test_floor_fits_every_client_at_scale(alpha, n_clients, min_size):
    """At scale: 10,000 clients (as many as 60,000 samples allow at min_size 6) for
    any α; each sample once, each client ≥ min_size, the same split for the same seed."""
    parts = split(MNIST_LIKE, "dirichlet", n_clients, 3, alpha=alpha, min_size=min_size)
    assert len(parts) == n_clients
    assert_exact_cover(parts, len(MNIST_LIKE))
    assert min(len(p) for p in parts) >= min_size
    again = split(MNIST_LIKE, "dirichlet", n_clients, 3, alpha=alpha, min_size=min_size)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = split(MNIST_LIKE, "dirichlet", n_clients, 4, alpha=alpha, min_size=min_size)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_floor_serves_the_case_the_redraw_rule_gave_up_on():
    """`-n 1000 α=0.05 min_size=1` fails after 1000 draws of the redraw rule; `floor` fits it."""
    with pytest.raises(FedhetError, match="fewer than 1 samples in 50 draws"):
        split(MNIST_LIKE, "dirichlet", 1000, alpha=0.05, min_size=1, method="redraw", max_tries=50)
    parts = split(MNIST_LIKE, "dirichlet", 1000, alpha=0.05, min_size=1)
    assert min(len(p) for p in parts) >= 1


def global_mix(labels: np.ndarray) -> np.ndarray:
    return np.bincount(labels) / len(labels)


def test_large_alpha_gives_every_client_the_global_label_mix():
    counts = label_counts(MNIST_LIKE, split(MNIST_LIKE, "dirichlet", 20, 1, alpha=1000.0), 10)
    mix = counts / counts.sum(axis=1, keepdims=True)
    tv = 0.5 * np.abs(mix - global_mix(MNIST_LIKE)).sum(axis=1)  # total variation per client
    assert tv.max() < 0.05
    sizes = counts.sum(axis=1)
    assert sizes.max() < 1.1 * sizes.min()


@pytest.mark.parametrize("n_clients", [20, 1000])
def test_small_alpha_leaves_most_clients_dominated_by_one_class(n_clients):
    counts = label_counts(MNIST_LIKE, split(MNIST_LIKE, "dirichlet", n_clients, 1, alpha=0.01), 10)
    top = counts.max(axis=1) / counts.sum(axis=1)
    assert np.mean(top >= 0.8) > 0.75
    flat = label_counts(MNIST_LIKE, split(MNIST_LIKE, "dirichlet", n_clients, 1, alpha=1.0), 10)
    assert np.median(top) > np.median(flat.max(axis=1) / flat.sum(axis=1)) + 0.3


def test_floor_keeps_the_redraw_rules_label_skew_where_both_apply():
    """10 clients, α = 0.3: the redraw rule seldom redraws here, so both give about the same law."""
    def mean_top(method: str) -> float:
        tops = [label_counts(MNIST_LIKE, split(MNIST_LIKE, "dirichlet", 10, s, alpha=0.3, method=method), 10)
                for s in range(15)]
        return float(np.mean([(c.max(axis=1) / c.sum(axis=1)).mean() for c in tops]))
    assert abs(mean_top("floor") - mean_top("redraw")) < 0.05


def test_floor_counts_by_hand():
    """Client 0 holds every share; clients 1 and 2 have none, so their floor of 2 is drawn by the
    open classes' sizes, and the rest of each class goes to client 0."""
    q = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    counts = floor_counts(q, np.array([5, 3]), 2, np.random.default_rng(0))
    np.testing.assert_array_equal(counts.sum(axis=1), [5, 3])
    assert counts[:, 1:].sum(axis=0).tolist() == [2, 2]
    assert counts[:, 0].sum() == 4


@pytest.mark.parametrize("seed", range(5))
def test_floor_counts_when_the_floor_takes_every_sample(seed):
    """n · m = N and every client wants class 0: class 0 overflows, the losers go to the other
    classes, and every client ends with exactly m samples."""
    rng = np.random.default_rng(seed)
    q = np.zeros((4, 30))
    q[0] = rng.dirichlet(np.ones(30))
    q[1:] = 1e-300  # a trace of every other class
    sizes = np.array([3, 50, 7, 60])
    counts = floor_counts(q, sizes, 4, rng)
    np.testing.assert_array_equal(counts.sum(axis=1), sizes)
    np.testing.assert_array_equal(counts.sum(axis=0), np.full(30, 4))
    assert (counts >= 0).all()


def test_cut_rounds_each_cumulative_share_down():
    q = np.array([[0.25, 0.25, 0.5], [0.7, 0.3, 0.0]])
    np.testing.assert_array_equal(cut(q, np.array([10, 3])), [[2, 3, 5], [2, 1, 0]])


# -- the redraw rule, split for split -----------------------------------------------------------
def redraw_dirichlet(labels, n_clients, alpha, min_size, max_tries, balance, rng):
    """The redraw rule written out on its own: the reference `method="redraw"` must match."""
    def draw():
        parts = [[] for _ in range(n_clients)]
        sizes = np.zeros(n_clients, dtype=np.int64)
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(n_clients, alpha))
            if balance == "niid-bench":
                cum = np.cumsum(np.where(sizes < len(labels) / n_clients, q, 0.0))
                if cum[-1] == 0:
                    return None
                cuts = (cum[:-1] / cum[-1] * len(idx)).astype(int)
            else:
                cuts = (np.cumsum(q)[:-1] * len(idx)).astype(int)
            for i, piece in enumerate(np.split(idx, cuts)):
                parts[i].append(piece)
                sizes[i] += len(piece)
        return [np.sort(np.concatenate(p)) for p in parts]

    for _ in range(max_tries):
        out = draw()
        if out is not None and min(len(p) for p in out) >= min_size:
            return out
    return None


@pytest.mark.parametrize("balance", ["none", "niid-bench"])
@pytest.mark.parametrize(("n_clients", "alpha", "min_size"), [(7, 0.5, 10), (30, 0.1, 5), (60, 0.3, 10)])
def test_redraw_is_the_reference_rule_split_for_split(balance, n_clients, alpha, min_size):
    labels = np.random.default_rng(9).integers(0, 10, 3000)
    redraws = 0
    for seed in range(4):
        want = redraw_dirichlet(labels, n_clients, alpha, min_size, 1000, balance,
                                np.random.default_rng(seed))
        new = split(labels, "dirichlet", n_clients, seed, alpha=alpha, min_size=min_size,
                    method="redraw", balance=balance)
        assert all(np.array_equal(a, b) for a, b in zip(want, new, strict=True))
        first = redraw_dirichlet(labels, n_clients, alpha, min_size, 1, balance, np.random.default_rng(seed))
        redraws += first is None
    if (n_clients, alpha) == (60, 0.3):
        assert redraws > 0  # the comparison covers draws after a rejected one


def test_a_saved_config_from_before_method_keeps_the_old_split():
    """Every config.json of a dirichlet run holds max_tries: without method it means redraw, so a
    resumed or re-run old run trains on the split it started with."""
    saved = {"dataset": "digits", "partition": "dirichlet", "clients": 5,
             "partition_params": {"alpha": 0.5, "min_size": 10, "max_tries": 1000, "balance": "none"}}
    assert config_of(saved).partition_params.method == "redraw"
    fresh = config_of({"dataset": "digits", "partition": "dirichlet", "clients": 5})
    assert fresh.partition_params.method == "auto" and fresh.partition_params.rule == "floor"
    niid = PARTITIONS.params("dirichlet", {"balance": "niid-bench"})
    assert niid.rule == "redraw"  # NIID-Bench's own loop


def dirichlet_rules(settings: list[dict]) -> set[str]:
    cfgs = [config_of(s) for s in settings]
    return {c.partition_params.rule for c in cfgs if c.partition == "dirichlet"}


@pytest.mark.parametrize("scale", ["smoke", "small", "paper"])
def test_fedsr_preset_keeps_the_rule_its_tables_were_made_with(scale):
    assert dirichlet_rules([spec.settings for spec in scale_runs(scale)]) == {"redraw"}


@pytest.mark.parametrize("grid", ["fedsr-mnist", "fedsr-mnist-iid-a01", "fedsr-smoke-digits"])
def test_documented_grids_keep_the_rule_their_tables_were_made_with(grid):
    specs = load_grid(CONFIGS / f"{grid}.toml").specs
    assert dirichlet_rules([spec.settings for spec in specs]) == {"redraw"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"method": "floor", "balance": "niid-bench"}, "balance=niid-bench is NIID-Bench's redraw loop"),
        ({"max_tries": 0}, r"max_tries must be in \[1, 10000\]"),
        ({"max_tries": 10**9}, r"max_tries must be in \[1, 10000\]"),
        ({"alpha": "inf"}, "alpha must be > 0 and finite"),
        ({"method": "retry"}, "partition.method must be one of auto, floor, redraw"),
    ],
)
def test_bad_dirichlet_parameters(values, message):
    with pytest.raises(FedhetError, match=message):
        PARTITIONS.params("dirichlet", values)


# -- feasibility: one line, the nearest setting that works ----------------------------------------
@pytest.mark.parametrize(
    ("name", "values", "most"),
    [
        ("dirichlet", {"min_size": 10}, 6000),
        ("dirichlet", {"min_size": 10, "method": "redraw"}, 6000),
        ("unbalanced", {"min_size": 7}, 8571),
        ("shards", {"xi": 4}, 15000),
        ("iid", {}, 60000),
    ],
)
def test_impossible_client_count_names_the_most_that_fit(name, values, most):
    with pytest.raises(FedhetError, match=f"use at most {most} clients") as err:
        split(MNIST_LIKE, name, most + 1, **values)
    assert "\n" not in str(err.value)


def test_the_suggested_settings_fit():
    line = (r"= 70000 exceeds the 60000 samples; use at most 6000 clients with min_size=10, "
            r"or partition.min_size ≤ 8$")
    with pytest.raises(FedhetError, match=line):
        split(MNIST_LIKE, "dirichlet", 7000, min_size=10)
    assert min(len(p) for p in split(MNIST_LIKE, "dirichlet", 6000, min_size=10)) == 10
    assert min(len(p) for p in split(MNIST_LIKE, "dirichlet", 7000, min_size=8)) >= 8


@pytest.mark.parametrize("name", ["label-per-client", "half-iid"])
def test_label_partitions_name_the_most_clients_they_can_serve(name):
    labels = np.repeat(np.arange(4), [3, 40, 40, 40])  # label 0 has 3 samples
    with pytest.raises(FedhetError, match=r"use at most (\d+) clients") as err:
        split(labels, name, 100)
    most = int(str(err.value).rsplit("at most ", 1)[1].split()[0])
    assert_exact_cover(split(labels, name, most), len(labels))
    with pytest.raises(FedhetError):
        split(labels, name, most + 1)


@pytest.mark.parametrize(
    ("name", "values"),
    [("iid", {}), ("shards", {"xi": 2}), ("unbalanced", {"min_size": 5}),
     ("unbalanced", {"labels": "shards", "min_size": 5}), ("label-per-client", {}), ("half-iid", {})],
)
def test_other_partitions_serve_ten_thousand_clients(name, values):
    parts = split(MNIST_LIKE, name, 10_000, 2, **values)
    assert len(parts) == 10_000 and min(len(p) for p in parts) >= 1
    assert_exact_cover(parts, len(MNIST_LIKE))
