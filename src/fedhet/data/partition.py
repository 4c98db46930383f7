"""Partitioners: split a dataset's train indices among clients.

Each partitioner is `(labels, n_clients, params, rng) -> list[np.ndarray]` and is deterministic
given `rng`. Unless its docstring says otherwise, every sample goes to exactly one client.
Impossible requests raise `FedhetError` with what to change. Every partitioner registers here;
the rules they share live beside it: Dirichlet's (`dirichlet`), the shards' (`shards`) and the
index-map file's (`index_map`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedhet.data.base import Dataset
from fedhet.data.dirichlet import class_members, floor_split, redraw_split
from fedhet.data.index_map import read_index_map
from fedhet.data.shards import exact_labels, label_shards, label_sorted
from fedhet.errors import FedhetError
from fedhet.registry import NoParams, Registry

Partitioner = Callable[[np.ndarray, int, Any, np.random.Generator], list[np.ndarray]]
PARTITIONS: Registry[Partitioner] = Registry("partition")


def _check_clients(labels: np.ndarray, n_clients: int) -> None:
    if n_clients < 1:
        raise FedhetError("--clients must be ≥ 1")
    if n_clients > len(labels):
        raise FedhetError(
            f"{n_clients} clients but only {len(labels)} training samples; use at most "
            f"{len(labels)} clients"
        )


@PARTITIONS.register("iid", NoParams, "Case 1: samples shuffled and dealt out evenly")
def iid(labels: np.ndarray, n_clients: int, params: Any, rng: np.random.Generator):
    _check_clients(labels, n_clients)
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), n_clients)]


def _check_min_size(n_samples: int, n_clients: int, min_size: int) -> None:
    """`n · min_size ≤ N`, or one line naming the most clients and the largest `min_size` that fit."""
    if n_clients * min_size > n_samples:
        raise FedhetError(
            f"partition.min_size={min_size} × {n_clients} clients = {n_clients * min_size} exceeds "
            f"the {n_samples} samples; use at most {n_samples // min_size} clients with "
            f"min_size={min_size}, or partition.min_size ≤ {n_samples // n_clients}"
        )


MAX_TRIES = 10_000
"""The most draws `method=redraw` may try: on MNIST's 60,000 labels a rejected draw costs about
1 ms with 100 clients and 9 ms with 10,000 (benchmarks/RESULTS.md), so at most a minute or two."""


@dataclass(frozen=True)
class DirichletParams:
    alpha: float = 0.5
    min_size: int = 10
    method: Literal["auto", "floor", "redraw"] = "auto"
    """How every client gets `min_size` samples. `floor`: one draw, each client first given
    `min_size` samples by its own class mix, the rest cut by the drawn shares (always fits, in
    one pass over the data). `redraw`: draw again until every client has `min_size` (at most
    `max_tries` draws): the split fedhet made before `method` existed. `auto`: `redraw` under
    `balance=niid-bench` (NIID-Bench's own loop), else `floor`."""
    max_tries: int = 1000
    """`redraw`'s cap on draws. Given without `method` it means `method=redraw`, as it did
    before `method` existed (every such `config.json` holds it)."""
    balance: Literal["none", "niid-bench"] = "none"
    """`niid-bench`: a client already holding ≥ N/n samples gets no share of later classes
    (NIID-Bench's `noniid-labeldir`); `none` lets any client take any share."""

    @staticmethod
    def upgrade(values: dict[str, Any]) -> dict[str, Any]:
        """Settings written for the redraw rule before `method` existed keep it."""
        if "max_tries" in values and "method" not in values:
            return {**values, "method": "redraw"}
        return values

    @property
    def rule(self) -> Literal["floor", "redraw"]:
        """The rule `method` stands for (`auto` resolved)."""
        if self.method == "auto":
            return "redraw" if self.balance == "niid-bench" else "floor"
        return self.method

    def validate(self) -> None:
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise FedhetError(f"partition.alpha must be > 0 and finite, got {self.alpha}")
        if self.min_size < 0:
            raise FedhetError("partition.min_size must be ≥ 0")
        if not 1 <= self.max_tries <= MAX_TRIES:
            raise FedhetError(
                f"partition.max_tries must be in [1, {MAX_TRIES}], got {self.max_tries}; "
                "partition.method=floor needs no retries"
            )
        if self.method == "floor" and self.balance == "niid-bench":
            raise FedhetError(
                "partition.balance=niid-bench is NIID-Bench's redraw loop; use partition.method=redraw "
                "(or auto), or balance=none with method=floor"
            )


@PARTITIONS.register("dirichlet", DirichletParams, "per class q ~ Dir(α·1) over clients; each ≥ min_size")
def dirichlet(labels: np.ndarray, n_clients: int, params: DirichletParams, rng: np.random.Generator):
    """Label skew: per class c the clients' shares `q_c ~ Dir(α 1_n)` (Yurochkin et al., ICML 2019;
    NIID-Bench, Li et al., ICDE 2022, §IV-A), every client holding ≥ `min_size` samples.

    `params.rule` picks how (`fedhet.data.dirichlet`): `floor` (`floor_split`) always fits in one
    draw, O(N + n·C); `redraw` (`redraw_split`) redraws until a draw fits (the rule that run files
    naming `method=redraw` record, split for split), and fails after `max_tries` draws with one line.
    """
    _check_clients(labels, n_clients)
    _check_min_size(len(labels), n_clients, params.min_size)
    members = class_members(labels)
    if params.rule == "floor":
        return floor_split(members, n_clients, params.alpha, params.min_size, rng)
    parts = redraw_split(
        members, n_clients, params.alpha, params.min_size, params.balance, params.max_tries, rng
    )
    if parts is None:
        raise FedhetError(
            f"Dirichlet α={params.alpha} gave a client fewer than {params.min_size} samples in "
            f"{params.max_tries} draws; use partition.method=floor (always fits"
            + (", with balance=none" if params.balance == "niid-bench" else "")
            + "), raise partition.alpha or lower partition.min_size"
        )
    return parts


def _classes(labels: np.ndarray) -> np.ndarray:
    return np.unique(labels)


def _label_sets(classes: np.ndarray, n_clients: int) -> list[np.ndarray]:
    """Case 2's labels per client.

    **[choice]** With at least as many clients as labels, client i holds label `i mod C`;
    with fewer, the labels are cut into `n_clients` contiguous groups (sizes differ by ≤ 1) and
    client i holds group i, so the samples of every label are still assigned.
    """
    if n_clients >= len(classes):
        return [classes[[i % len(classes)]] for i in range(n_clients)]
    return list(np.array_split(classes, n_clients))


def _most_label_clients(sizes: np.ndarray) -> int:
    """The most clients `_label_sets` can serve when its k-th label has `sizes[k]` samples: with
    n ≥ C clients label k is cut into ⌈(n − k)/C⌉ parts, so n ≤ k + C·sizes[k] for every k."""
    return int(np.min(np.arange(len(sizes)) + len(sizes) * sizes))


def _deal_by_label(
    labels: np.ndarray, pool: np.ndarray, label_sets: list[np.ndarray], rng: np.random.Generator,
    most: int,
) -> list[np.ndarray]:
    """Give each client the samples in `pool` of its labels; a label held by k clients is split
    into k shuffled, near-equal parts. `most`: the most clients the caller could serve (for the
    error when a label has fewer samples than clients)."""
    owners: dict[int, list[int]] = {}
    for i, held in enumerate(label_sets):
        for c in held.tolist():
            owners.setdefault(c, []).append(i)
    parts: list[list[np.ndarray]] = [[] for _ in label_sets]
    for c in _classes(labels[pool]):
        idx = rng.permutation(pool[labels[pool] == c])
        if len(idx) < len(owners[c]):
            raise FedhetError(
                f"label {c} has {len(idx)} samples for {len(owners[c])} clients; use at most "
                f"{most} clients"
            )
        for i, piece in zip(owners[c], np.array_split(idx, len(owners[c])), strict=True):
            parts[i].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


@PARTITIONS.register("label-per-client", NoParams, "Case 2: every client holds a single label")
def label_per_client(labels: np.ndarray, n_clients: int, params: Any, rng: np.random.Generator):
    """FedVeca/BHerd Case 2: all samples of a client share one label (`_label_sets` when N < C)."""
    _check_clients(labels, n_clients)
    sets = _label_sets(_classes(labels), n_clients)
    most = _most_label_clients(np.unique(labels, return_counts=True)[1])
    return _deal_by_label(labels, np.arange(len(labels)), sets, rng, most)


@PARTITIONS.register("half-iid", NoParams, "Case 3: first half of labels IID on the first half of clients")
def half_iid(labels: np.ndarray, n_clients: int, params: Any, rng: np.random.Generator):
    """FedVeca/BHerd Case 3: the samples of the first half of the labels go IID to the first half
    of the clients; the other samples go to the other clients as in Case 2.

    **[choice]** "Half" rounds up for both: the first `⌈N/2⌉` clients share the first `⌈C/2⌉`
    labels (BHerd §5: with 5 clients, clients 1–3 are IID and clients 4–5 are not).
    """
    _check_clients(labels, n_clients)
    classes = _classes(labels)
    if n_clients < 2 or len(classes) < 2:
        raise FedhetError("half-iid needs at least 2 clients and 2 labels; use --partition iid")
    n_iid, c_iid = -(-n_clients // 2), -(-len(classes) // 2)
    first = np.isin(labels, classes[:c_iid])
    iid_pool = rng.permutation(np.flatnonzero(first))
    rest = np.flatnonzero(~first)
    # ⌈n/2⌉ ≤ |first-half pool| and ⌊n/2⌋ ≤ what Case 2 can serve on the second half
    most = min(2 * len(iid_pool), 2 * _most_label_clients(np.unique(labels[rest], return_counts=True)[1]) + 1)
    if len(iid_pool) < n_iid:
        raise FedhetError(
            f"the first {c_iid} labels have fewer than {n_iid} samples; use at most {most} clients"
        )
    head = [np.sort(p) for p in np.array_split(iid_pool, n_iid)]
    sets = _label_sets(classes[c_iid:], n_clients - n_iid)
    return head + _deal_by_label(labels, rest, sets, rng, most)


@dataclass(frozen=True)
class ShardsParams:
    xi: int = 2
    """Shards (hence at most ξ labels when shards do not straddle labels) per client."""
    cut: Literal["sorted", "label"] = "sorted"
    """`sorted`: the label-sorted data cut into `N ξ` equal shards (FedSR's words; a shard may
    straddle two labels). `label` **[choice]**, the other reading of "only ξ classes": each
    label cut into its own shards, `N ξ` in all shared among the labels by their sizes (largest
    remainders), so no shard straddles and a client holds at most ξ labels."""

    def validate(self) -> None:
        if self.xi < 1:
            raise FedhetError(f"partition.xi must be ≥ 1, got {self.xi}")
        if self.cut not in ("sorted", "label"):
            raise FedhetError(f"partition.cut must be sorted or label, got {self.cut!r}")


def _check_xi(labels: np.ndarray, xi: int) -> None:
    n_classes = len(_classes(labels))
    if xi > n_classes:
        raise FedhetError(f"partition.xi={xi} exceeds the {n_classes} classes; choose xi ≤ {n_classes}")


@PARTITIONS.register("shards", ShardsParams, "pathological ξ: each client takes ξ label-sorted shards")
def shards(labels: np.ndarray, n_clients: int, params: ShardsParams, rng: np.random.Generator):
    """FedSR §V (pathological ξ): sort by label, cut into `N ξ` equal shards (sizes differ by ≤ 1),
    each client takes ξ random shards. A shard can straddle two labels when class sizes are not
    multiples of the shard size, so "most" clients hold ξ labels, none more than 2ξ.
    `cut="label"`: each label cut into its own shards (`fedhet.data.shards.label_shards`), at most ξ labels a
    client."""
    _check_clients(labels, n_clients)
    _check_xi(labels, params.xi)
    n_shards = n_clients * params.xi
    if n_shards > len(labels):
        n = len(labels)
        smaller_xi = f", or partition.xi ≤ {n // n_clients}" if n >= n_clients else ""
        raise FedhetError(
            f"{n_clients} clients × xi={params.xi} = {n_shards} shards but only {n} samples; use "
            f"at most {n // params.xi} clients with xi={params.xi}{smaller_xi}"
        )
    if params.cut == "label":
        pieces = label_shards(labels, n_shards, rng)
    else:
        pieces = np.array_split(label_sorted(labels, rng), n_shards)
    owners = rng.permutation(n_shards).reshape(n_clients, params.xi)
    return [np.sort(np.concatenate([pieces[j] for j in row])) for row in owners]


@dataclass(frozen=True)
class UnbalancedParams:
    exponent: float = 1.0
    """Client sizes ∝ `r^(−exponent)` for size rank r = 1..N (0: equal sizes)."""
    labels: Literal["iid", "shards"] = "iid"
    """How labels are spread: IID, or ξ label-sorted shards per client (FedNNNN UB non-IID)."""
    xi: int = 2
    min_size: int = 10
    cut: Literal["sorted", "label"] = "sorted"
    """With `labels="shards"`: `sorted` lays every client's ξ shards along the label-sorted data
    (a large client's shards span several labels); `label` **[choice]**, the other reading of
    FedNNNN's "only 2 classes": every client, large or small, holds exactly ξ labels
    (`fedhet.data.shards.exact_labels`)."""

    def validate(self) -> None:
        if not (self.exponent >= 0 and math.isfinite(self.exponent)):
            raise FedhetError(f"partition.exponent must be a finite number ≥ 0, got {self.exponent}")
        if self.xi < 1:
            raise FedhetError(f"partition.xi must be ≥ 1, got {self.xi}")
        if self.min_size < 1:
            raise FedhetError("partition.min_size must be ≥ 1")
        if self.cut == "label" and self.labels != "shards":
            raise FedhetError("partition.cut=label cuts label shards; set partition.labels=shards "
                              "or leave partition.cut out")


def power_law_sizes(n_samples: int, n_clients: int, exponent: float, min_size: int) -> np.ndarray:
    """Sizes by rank: `min_size + ⌊(n − N·min_size) r^(−exponent) / Σ_s s^(−exponent)⌋`, the
    rounding remainder going one sample each to the largest fractional parts; sums to `n`."""
    _check_min_size(n_samples, n_clients, min_size)
    extra = n_samples - n_clients * min_size
    w = np.arange(1, n_clients + 1, dtype=np.float64) ** -exponent
    share = extra * w / w.sum()
    sizes = np.floor(share).astype(np.int64)
    rest = extra - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:rest]] += 1
    return sizes + min_size


@PARTITIONS.register("unbalanced", UnbalancedParams, "power-law client sizes; labels IID or shards")
def unbalanced(labels: np.ndarray, n_clients: int, params: UnbalancedParams, rng: np.random.Generator):
    """FedNNNN's unbalanced (UB) setting: a few clients hold most samples.

    Sizes follow `power_law_sizes`, given to clients in random order. `labels="iid"`: a random
    permutation cut at those sizes. `labels="shards"`: each client's size is cut into ξ near-equal
    shards; all shards, in random order, are laid along the label-sorted samples, so a small
    client holds ≤ ξ labels (plus straddles) while a large client's shards span more labels.
    `cut="label"`: every client holds exactly ξ labels (`fedhet.data.shards.exact_labels`).
    """
    _check_clients(labels, n_clients)
    sizes = rng.permutation(power_law_sizes(len(labels), n_clients, params.exponent, params.min_size))
    if params.labels == "iid":
        return [np.sort(p) for p in np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])]
    _check_xi(labels, params.xi)
    if params.cut == "label":
        return exact_labels(labels, sizes, params.xi, rng)
    xi = params.xi
    shard_sizes = sizes[:, None] // xi + (np.arange(xi) < sizes[:, None] % xi)
    owner = np.repeat(np.arange(n_clients), xi)
    order = rng.permutation(n_clients * xi)
    flat_sizes = shard_sizes.reshape(-1)[order]
    pieces = np.split(label_sorted(labels, rng), np.cumsum(flat_sizes)[:-1])
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for k, piece in zip(order, pieces, strict=True):
        parts[owner[k]].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


NO_USERS = (
    "choose another --partition, or give each sample's client (client_ids in from_arrays or an "
    ".npz, dataset.client=COLUMN for a .csv)"
)


@PARTITIONS.register(
    "natural", NoParams, "the dataset's own users (Synthetic, or data with client ids): one per client"
)
def natural(labels: np.ndarray, n_clients: int, params: Any, rng: np.random.Generator):
    """Placeholder: `partition_dataset` takes the dataset's `natural_partition` itself."""
    raise FedhetError(f"the natural partition needs a dataset that has users; {NO_USERS}")


@dataclass(frozen=True)
class FileParams:
    path: str = ""
    """JSON file of client → sample indices (`read_index_map`); relative to the working directory."""
    allow_overlap: bool = False
    """Let a sample belong to several clients (each trains on its copy)."""

    def validate(self) -> None:
        if not self.path:
            raise FedhetError(
                "the file partition needs partition.path=FILE.json (client → sample indices)"
            )
        read_index_map(self.path, self.allow_overlap)


@PARTITIONS.register("file", FileParams, "client → sample indices read from a JSON file")
def from_file(labels: np.ndarray, n_clients: int, params: FileParams, rng: np.random.Generator):
    """The split another framework (or `fedhet partition --save-indices`) wrote (`read_index_map`).

    Index j is the j-th sample of the training set the partitioner sees: the loader's train
    arrays in their order, less the validation hold-out when `validation_fraction` > 0 (the kept
    samples keep their order). Samples no client lists are not used. `rng` is not: the seed does
    not change the split.
    """
    parts = read_index_map(params.path, params.allow_overlap, len(labels))
    if len(parts) != n_clients:
        raise FedhetError(
            f"partition.path={params.path} has {len(parts)} clients but --clients is {n_clients}; "
            f"set --clients {len(parts)}"
        )
    return parts


def partition_dataset(
    data: Dataset, name: str, n_clients: int, params: Any, seed: int
) -> list[np.ndarray]:
    """Client index arrays for `data` under partitioner `name`, deterministic in `seed`."""
    entry = PARTITIONS.get(name)
    if name == "natural":
        if data.natural_partition is None:
            raise FedhetError(f"dataset {data.name} has no natural partition; {NO_USERS}")
        k = len(data.natural_partition)
        if n_clients != k and "client_ids" in data.meta:
            raise FedhetError(
                f"{data.name} is split by its client ids into {k} clients; set clients={k} "
                f"(--clients {k})"
            )
        if n_clients != k:
            raise FedhetError(
                f"the natural partition of {data.name} has {k} users; "
                f"set --clients {k} (or dataset.users)"
            )
        return [np.asarray(p) for p in data.natural_partition]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9A27]))
    return entry.factory(data.split_labels, n_clients, params, rng)


def label_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """`counts[i, c]`: samples of class c held by client i."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
