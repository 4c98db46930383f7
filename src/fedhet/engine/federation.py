"""`federate()`: the one data path of every run: load the dataset, hold out a validation split,
partition the training set over the clients, and hold out each client's own share for
per-client evaluation (`client_eval_fraction`).

The engine, the partition report, `fedhet report`'s heatmaps and the FedVeca comparison
protocol all call it, so a partition described, plotted or sized anywhere is exactly the one the
run trains on (the same seed, the same hold-out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from fedhet.data.base import Dataset
from fedhet.data.partition import partition_dataset
from fedhet.data.registry import load_dataset
from fedhet.data.split import hold_out_per_client, hold_out_validation
from fedhet.engine.config import RunConfig
from fedhet.registry import params_dict


@dataclass(frozen=True)
class Federation:
    data: Dataset
    """The dataset after the validation hold-out (its test split is then the validation set)."""
    parts: list[np.ndarray]
    """One array of training-sample indices per client."""
    held_out: list[np.ndarray] = field(default_factory=list)
    """Each client's held-out share (indices into the training set, none of them in `parts`);
    empty when `client_eval_fraction` is 0."""
    own_parts: list[np.ndarray] = field(default_factory=list)
    """Each client's training indices when they differ from `parts` (the central baseline with
    shares held out: its one part is their union), for a client's own fine-tuning; else empty."""


_LOADED: dict[str, Dataset] = {}


def load(cfg: RunConfig, cache: bool = False) -> Dataset:
    """The run's dataset; with `cache`, loaded once per process for equal data settings."""
    if not cache:
        return load_dataset(cfg.dataset, cfg.dataset_params, cfg.data_dir)
    key = json.dumps([cfg.dataset, params_dict(cfg.dataset_params), str(cfg.data_dir)],
                     sort_keys=True, default=str)
    if key not in _LOADED:
        _LOADED[key] = load_dataset(cfg.dataset, cfg.dataset_params, cfg.data_dir)
    return _LOADED[key]


def federate(
    cfg: RunConfig, *, centralized: bool = False, data: Dataset | None = None,
    cache: bool = False,
) -> Federation:
    """Load (unless `data` is given), hold out `cfg.validation_fraction`, partition, hold out
    `cfg.client_eval_fraction` of each client (`hold_out_per_client`).

    `centralized` gives one client holding the whole training set (centralised SGD); with
    per-client shares held out, it holds every client's training indices and none of their
    shares, so it trains on the data the federated runs train on and is scored on the same
    shares."""
    if data is None:
        data = load(cfg, cache)
    if cfg.validation_fraction:
        data = hold_out_validation(data, cfg.validation_fraction)
    if centralized and not cfg.client_eval_fraction:
        return Federation(data, [np.arange(len(data.y_train))])
    parts = partition_dataset(data, cfg.partition, cfg.clients, cfg.partition_params, cfg.seed)
    if not cfg.client_eval_fraction:
        return Federation(data, list(parts))
    train, held = hold_out_per_client(parts, cfg.client_eval_fraction, cfg.seed)
    if centralized:
        return Federation(data, [np.sort(np.concatenate(train))], held, train)
    return Federation(data, train, held)
